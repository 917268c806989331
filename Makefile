# fleetgate: `make run` serves the demo gateway in front of an emulated fleet;
# `make test` installs what the suite needs (Python packages into .venv/, and Debian's
# redis-server and prometheus when missing) and runs all of it.
VENV ?= .venv
PY := $(VENV)/bin/python
# `make run` installs the runtime dependencies only (what serving needs: no test, plot or
# training extras); `make test` adds the test extra. Each stamp says which is installed.
RUN_STAMP := $(VENV)/.fleetgate-run
TEST_STAMP := $(VENV)/.fleetgate-test
SOURCES := pyproject.toml setup.py compressor/_fast.c policies/assign/_greedy.c
# pip's own progress (what it collects, builds and installs), not -q: a first install takes a
# while and should show it is working
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar on
# options for `fleetgate demo`, e.g. make run DEMO_ARGS="--port 9000 --personality sglang"
DEMO_ARGS ?=

.PHONY: run test deps run-deps redis prometheus lint fmt unit e2e bench clean

$(PY):
	python3 -m venv $(VENV)

$(RUN_STAMP): $(SOURCES) | $(PY)
	@echo "fleetgate: installing the runtime dependencies into $(VENV)/ (once; make test adds the test tools)"
	$(PIP) -e .
	@touch $@

$(TEST_STAMP): $(SOURCES) | $(PY)
	@echo "fleetgate: installing fleetgate with its test, plot and training extras into $(VENV)/"
	$(PIP) -e '.[test]'
	@touch $@ $(RUN_STAMP)

run-deps: $(RUN_STAMP)

deps: $(TEST_STAMP)

# Tests start their own redis-server on a free port; install Debian's package if missing.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian package)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# Tests run promtool (config, rules, rule unit tests) and a real prometheus on a free port;
# Debian's package provides both. Its service is not needed: tests start their own.
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
	  echo "installing prometheus and promtool (Debian package)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq prometheus >/dev/null; }

run: run-deps
	$(PY) -m fleetgate demo $(DEMO_ARGS)

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: deps
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# two workers, one test file each at a time (a file's module fixtures are set up once): the
# e2e files mostly wait on their processes, so the suite takes about half as long on 2 cores;
# the slowest tests are listed at the end
test: deps redis prometheus lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

unit: deps
	$(PY) -m pytest -q tests/unit tests/property

bench: deps
	$(PY) bench/gateway_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
