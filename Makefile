# Quick start: `make run` (set up + launch) and `make test` (set up + all tests).
VENV := .venv
PY := $(VENV)/bin/python
DEMO_PROMPT ?= Write a Python function that returns the n-th Fibonacci number iteratively.

.PHONY: setup run test test-fast bench clean

setup:
	@bash scripts/setup.sh

# Until the Qt app lands, `run` shows the headless side-by-side comparison on the default pair.
run: setup
	$(VENV)/bin/tandem compare "$(DEMO_PROMPT)" --max-new-tokens 96

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

test-fast: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m "not slow"

bench: setup
	$(VENV)/bin/tandem bench --json bench.json

clean:
	rm -rf $(VENV) build *.egg-info
