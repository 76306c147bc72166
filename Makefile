# Two entry points that do all set-up on a fresh machine:
#   make repro   -> installs into .venv, then runs the pipeline (dvc repro) on the embedded data
#   make test    -> installs into .venv (with test extras), then runs the test suite
# torch==2.13.0 is installed first so that the CPU build is used (an unpinned torch pulls CUDA).
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup repro test bench

$(BIN)/python:
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

repro: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc repro

test: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m benchmarks.run_all
