# Quick start: `make run` (set up + launch) and `make test` (set up + all tests).
VENV := .venv
PY := $(VENV)/bin/python
DEMO_PROMPT ?= Write a Python function that returns the n-th Fibonacci number iteratively.

.PHONY: setup run compare screenshots test test-fast bench package package-smoke clean

setup:
	@bash scripts/setup.sh

# The desktop app, on the default offline pair (found and loaded without any network).
run: setup
	$(PY) -m app

# The same comparison without a window.
compare: setup
	$(VENV)/bin/tandem compare "$(DEMO_PROMPT)" --max-new-tokens 96

# Screenshots for the README, taken by the app itself on the default pair (offscreen).
screenshots: setup
	bash scripts/screenshots.sh

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q --durations=15

test-fast: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m "not slow"

bench: setup
	$(VENV)/bin/tandem bench --json bench.json

# The double-click app: dist/Tandem (PyInstaller onedir), built from the set-up venv; several
# minutes, so not part of `make test`. packaging/README.md has macOS and Windows.
package: setup
	bash packaging/build.sh $(PY)

# The built app checks itself headless (self-test, crash log, menu install); needs make package.
package-smoke:
	bash packaging/smoke_test.sh

clean:
	rm -rf $(VENV) build *.egg-info
