# Two commands do everything on a fresh machine (see README.md):
#   make run    the default experiment (set HEADCOUNT_MIRROR to use a local data mirror)
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= all

.PHONY: setup run test lint format bench

$(BIN)/snakemake: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch==2.13.0 first: on machines that keep its CPU wheel locally, pip takes that file.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[workflow,dev]'
	touch $@

setup: $(BIN)/snakemake

run: setup
	$(BIN)/snakemake --cores $(CORES) --rerun-incomplete

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check src tests workflow/scripts benchmarks
	$(BIN)/snakefmt --check Snakefile workflow
	$(BIN)/snakemake --lint --cores 1

format: setup
	$(BIN)/ruff check --fix src tests workflow/scripts benchmarks
	$(BIN)/snakefmt Snakefile workflow

bench: setup
	$(BIN)/python benchmarks/run.py
