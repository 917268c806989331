#!/usr/bin/env bash
# A new user's first `make run`: clone the repository at REF into a temporary directory, run
# `make run` there with an empty pip cache, and print the wall time to the first answer of
# a chat completion, the part of it spent installing, and the virtualenv's size.
#
#   bench/first_run.sh [REF] [PORT]      # REF defaults to HEAD, PORT to 8080
#
# A Makefile without DEMO_ARGS (before issue 29) always serves on 8080: pass 8080 for it.
# pip uses whatever index the machine configures (its own default); nothing is cached.
set -euo pipefail
src=$(git rev-parse --show-toplevel)
ref=${1:-HEAD}
port=${2:-8080}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$src" "$work/clone"
git -C "$work/clone" checkout -q "$ref"
cd "$work/clone"
export PIP_NO_CACHE_DIR=1 PIP_CACHE_DIR="$work/pip-cache" FLEETGATE_DEMO_LOGS="$work/logs"
body='{"model":"llama-3.1-8b","messages":[{"role":"user","content":"Hello!"}],"max_tokens":8}'

start=$(date +%s.%N)
setsid make run DEMO_ARGS="--port $port" >"$work/make.log" 2>&1 &
make_pid=$!
answered=""
while kill -0 "$make_pid" 2>/dev/null; do
  if curl -sf -m 2 "http://127.0.0.1:$port/v1/chat/completions" \
      -H 'Content-Type: application/json' -d "$body" >/dev/null 2>&1; then
    answered=$(date +%s.%N)
    break
  fi
  sleep 0.25
done
stamp=$(ls -t .venv/.fleetgate-* 2>/dev/null | tail -1 || true)
installed=$( [ -n "$stamp" ] && stat -c %.9Y "$stamp" || echo "$start")
kill -INT -- "-$make_pid" 2>/dev/null || true
wait "$make_pid" 2>/dev/null || true
if [ -z "$answered" ]; then
  echo "no answer; the end of make's output:" >&2
  tail -30 "$work/make.log" >&2
  exit 1
fi
printf 'ref %s (%s)\n' "$ref" "$(git rev-parse --short HEAD)"
printf 'first answer after %.1f s (install %.1f s, then the demo %.1f s)\n' \
  "$(echo "$answered - $start" | bc)" "$(echo "$installed - $start" | bc)" \
  "$(echo "$answered - $installed" | bc)"
printf 'virtualenv %s MB, %s packages\n' "$(du -sm .venv | cut -f1)" \
  "$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | wc -l)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
