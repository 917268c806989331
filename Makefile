# fleetgate: `make run` serves the demo gateway in front of an emulated fleet;
# `make test` installs what the suite needs and runs all of it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fleetgate-installed

.PHONY: run test deps redis prometheus lint fmt unit e2e bench clean

$(STAMP): pyproject.toml setup.py compressor/_fast.c
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

deps: $(STAMP)

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

run: deps
	$(PY) -m fleetgate demo

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: deps
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: deps redis prometheus lint
	$(PY) -m pytest -q

unit: deps
	$(PY) -m pytest -q tests/unit tests/property

bench: deps
	$(PY) bench/gateway_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
