# The README's commands: `make demo`, `make test` and `make docs`.  All build .venv from the repo's
# own files (CPU torch pinned by constraints.txt) on a fresh clone with only Python 3.11 present.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.torchprof-installed
export DS_BUILD_OPS := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test test-fast docs lint bench setup clean gpu-check wheelhouse gpu-install

$(STAMP): setup.py constraints.txt pyproject.toml torchprof_args/analysis/decode/_fastcolumns.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -c constraints.txt torch
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python integrations/demo/run_demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# The unit tests (no multi-process job, no real framework run): well under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# The documentation site (mkdocs-material, no plugin that needs the network) into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Lint: ruff over the repository, mypy over the package (configured in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy torchprof_args

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# GPU validation (docs/gpu-validation.md).  GPU_PYTHON is the GPU machine's python, with its own
# CUDA torch (not .venv's CPU build); `make wheelhouse` runs where PyPI is reachable, `make
# gpu-install` installs from it offline, `make gpu-check` runs the tests and benchmarks.
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
WHEELHOUSE ?= wheelhouse
GPU_PYTHON_VERSIONS ?= 3.10 3.11 3.12

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

wheelhouse:
	PYTHON=$(PYTHON) GPU_PYTHON_VERSIONS="$(GPU_PYTHON_VERSIONS)" bash benchmarks/gpu_wheelhouse.sh $(WHEELHOUSE)

gpu-install:
	PYTHON=$(GPU_PYTHON) bash benchmarks/gpu_install_offline.sh $(WHEELHOUSE)

clean:
	rm -rf $(VENV) prof demo_output site .mypy_cache
