# nbcluster: every set-up step a fresh machine needs lives here.
#   make lab    create .venv, install nbcluster, open JupyterLab on notebooks/
#   make test   the whole suite (what .ci/run calls), the lab extension's jest tests and
#               the browser tests included (it installs Debian's chromium when missing)
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
.PHONY: help venv test test-unit lint proto-check lab bench clean distclean labext test-js chromium iproute2

help:
	@echo "make lab        create .venv, install nbcluster, open JupyterLab on notebooks/"
	@echo "make test       ruff + generated-code check + the whole pytest suite"
	@echo "make test-unit  unit tests only (no processes)"
	@echo "make bench      install Ray and Dask into .venv, run benchmarks/microbench.py"
	@echo "make venv       just create/update .venv"
	@echo "make labext     rebuild the JupyterLab extension (labextension/) after editing it"
	@echo "make test-js    the lab extension's jest tests"
	@echo "make chromium   apt-get install chromium for the browser tests (when missing; root)"
	@echo "make iproute2   apt-get install iproute2 for the multi-host tests (when missing; root)"
	@echo "make clean      remove caches and build output (distclean also removes .venv)"

# The venv itself: created once.
$(BIN)/python:
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "nbcluster needs Python >= 3.11; choose one with: make PY=python3.11 ..." >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# The install: redone only when pyproject.toml changes (editable, so source edits need nothing).
# Step 1, torch (the `train` extra), pinned to the CPU build that these machines (and CI) keep
# in their local wheel cache (pip's find-links, /opt/wheels: torch-2.13.0+cpu, which pip prefers
# to a plain 2.13.0 from an index). With it installed, `torch>=2.1` in the extras is satisfied
# and step 2 downloads no CUDA build (a plain `pip install torch` on Linux pulls ~3 GB of CUDA
# libraries). Elsewhere choose the build with TORCH_PIP_ARGS, e.g.
#   make TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu' test
# (README.md, "Installing torch").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'
	$(PIP_INSTALL) -e '.[test,all]'
	@touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

proto-check: $(STAMP)
	$(BIN)/python -m nbcluster._runtime.protocol._gen --check

test: venv lint proto-check labext test-js chromium iproute2
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

lab: $(STAMP) labext
	$(BIN)/jupyter lab --ip=127.0.0.1 $(LAB_FLAGS) notebooks/

# The JupyterLab extension. `pip install -e .` (the $(STAMP) rule) builds it the first time
# through hatch-jupyter-builder; this rebuilds it when its sources change, and links the
# installed copy to the build output so JupyterLab serves the new build. jlpm comes from the
# venv (jupyter-builder); CI=true makes `jlpm install` use the committed yarn.lock as is.
LABEXT_OUT := nbcluster/labextension/static/style.js
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*) \
	labextension/package.json labextension/yarn.lock labextension/tsconfig.json
LABEXT_ENV := PATH="$(CURDIR)/$(BIN):$$PATH"

$(LABEXT_OUT): $(LABEXT_SRC) | $(STAMP)
	cd labextension && $(LABEXT_ENV) jlpm install && $(LABEXT_ENV) jlpm build
	$(LABEXT_ENV) $(BIN)/jupyter-builder develop --overwrite .
	@touch $@

labext: $(LABEXT_OUT)

test-js: $(LABEXT_OUT)
	cd labextension && $(LABEXT_ENV) jlpm install && $(LABEXT_ENV) jlpm test

# Debian's chromium for the browser tests (tests/browser; playwright never downloads one).
# Idempotent: does nothing when /usr/bin/chromium exists. CI runs as root.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else \
			echo "make: /usr/bin/chromium is missing and cannot be installed here (needs root" \
				"and apt-get); the browser tests will be skipped" >&2; \
		fi; \
	fi

# iproute2 (`ip netns`) for the multi-host tests (tests/multinode), which build several hosts
# out of network namespaces as root. Idempotent. With CI=true those tests fail, not skip, when
# namespaces cannot be made, so CI must have it.
iproute2:
	@if ! command -v ip >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; \
		else \
			echo "make: the 'ip' command (iproute2) is missing and cannot be installed here" \
				"(needs root and apt-get); the multi-host tests will be skipped (failed with CI=true)" >&2; \
		fi; \
	fi

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PIP_INSTALL) -e '.[test,all,bench]'
	@touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/microbench.py $(BENCH_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache test-artifacts
	rm -rf labextension/lib labextension/tsconfig.tsbuildinfo nbcluster/labextension
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) labextension/node_modules labextension/.yarn
