# nbcluster: every set-up step a fresh machine needs lives here.
#   make lab    create .venv, install nbcluster, open JupyterLab on notebooks/
#   make test   the whole suite (what .ci/run calls)
# Choose another interpreter with `make PY=python3.12 ...` (must be >= 3.11).

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
PIP_INSTALL := $(BIN)/python -m pip install --disable-pip-version-check --progress-bar off -q
PYTEST_ARGS ?=
BENCH_ARGS ?=
# Jupyter refuses to start as root unless told it may.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.DEFAULT_GOAL := help
.PHONY: help venv test test-unit lint proto-check lab bench clean distclean

help:
	@echo "make lab        create .venv, install nbcluster, open JupyterLab on notebooks/"
	@echo "make test       ruff + generated-code check + the whole pytest suite"
	@echo "make test-unit  unit tests only (no processes)"
	@echo "make bench      install Ray and Dask into .venv, run benchmarks/microbench.py"
	@echo "make venv       just create/update .venv"
	@echo "make clean      remove caches and build output (distclean also removes .venv)"

# The venv itself: created once.
$(BIN)/python:
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "nbcluster needs Python >= 3.11; choose one with: make PY=python3.11 ..." >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# The install: redone only when pyproject.toml changes (editable, so source edits need nothing).
$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	@touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

proto-check: $(STAMP)
	$(BIN)/python -m nbcluster._runtime.protocol._gen --check

test: venv lint proto-check
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

lab: $(STAMP)
	$(BIN)/jupyter lab --ip=127.0.0.1 $(LAB_FLAGS) notebooks/

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PIP_INSTALL) -e '.[test,bench]'
	@touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/microbench.py $(BENCH_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache test-artifacts
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
