# The front door. `make test` and `make demo` each set the machine up first (scripts/bootstrap.sh).
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: bootstrap test unit demo bench lint shim clean cleanup

bootstrap:
	@bash scripts/bootstrap.sh

shim:
	$(MAKE) -C shim

test: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	@if [ -f shim/Makefile ]; then $(MAKE) -s -C shim test; fi
	$(PY) -m pytest -q -m "not integration" -n 2 $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "integration and not testbed" -n 3 $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "integration and testbed" $(PYTEST_ARGS)

# The fast run: every test but those that start real processes (tests/integration/), on two workers.
unit: bootstrap
	$(PY) -m pytest -q -m "not integration" -n 2 $(PYTEST_ARGS)

demo: bootstrap
	$(VENV)/bin/failslow demo

bench: bootstrap
	$(VENV)/bin/pip install -q -e ".[testbed,dev,bench]"
	$(PY) -m bench

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

cleanup:
	-$(VENV)/bin/failslow testbed cleanup

clean:
	rm -rf shim/build .pytest_cache .mypy_cache .ruff_cache
