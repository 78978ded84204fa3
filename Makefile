# Each target sets itself up: a fresh clone needs only Python 3.11, node 20 and the registries.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every pip install below takes the versions the tests last passed with (see constraints.txt).
PIN    := -c constraints.txt
BENCH_STAMP := $(VENV)/.bench-installed
# The CPU wheel of torch lies on disk on machines without a GPU; an open requirement could pull
# a multi-GB CUDA build, so the pin goes in first.
TORCH  ?= torch==2.13.0

# The front end (labextension/: side panel, status bar, and the anywidget ESM it also builds into
# viceroy/extension/static). jlpm comes with jupyter-builder in the venv; node >= 20.19.
LABEXT   := labextension
JLPM     := PATH="$(abspath $(BIN)):$$PATH" $(abspath $(BIN))/jlpm
FRONTEND := $(LABEXT)/node_modules/.viceroy-built
FRONTEND_SOURCES := $(LABEXT)/package.json $(LABEXT)/yarn.lock $(wildcard $(LABEXT)/tsconfig*.json \
	$(LABEXT)/src/*.ts $(LABEXT)/src/*/*.ts $(LABEXT)/style/* $(LABEXT)/scripts/*)

.PHONY: setup demo test test-fast lint bench bench-peers lab clean frontend test-frontend lock system-deps

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q $(PIN) -e ".[test]"
	touch $@

demo: $(STAMP)  ## the quickstart on a local 4-rank mesh, outputs printed
	$(BIN)/python -m viceroy demo

test: $(STAMP) $(FRONTEND) system-deps  ## every tier, as CI runs it
	$(BIN)/python -m pytest

test-fast: $(STAMP) $(FRONTEND) system-deps  ## without the slow tier
	$(BIN)/python -m pytest -m "not slow"

system-deps:  ## sshd, Slurm, munge, iproute2, rsync, Chromium: apt-installed when missing (as root)
	.ci/system-deps

frontend: $(FRONTEND)  ## build the labextension and the widget ESM (after a change in labextension/)

$(FRONTEND): $(STAMP) $(FRONTEND_SOURCES)
	cd $(LABEXT) && $(JLPM) install && $(JLPM) build
	touch $@

test-frontend: $(FRONTEND)  ## TypeScript lint and unit tests only (pytest -m frontend runs them too)
	cd $(LABEXT) && $(JLPM) lint && $(JLPM) test

lint: $(STAMP) $(FRONTEND)
	$(BIN)/ruff check viceroy tests bench
	$(BIN)/mypy
	cd $(LABEXT) && $(JLPM) lint

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q $(PIN) -e ".[test,bench]"
	touch $@

bench: $(STAMP) $(BENCH_STAMP)  ## ratios against baselines measured in the same run (ipyparallel installed for bench_kernel)
	$(BIN)/python bench/bench_runtime.py
	$(BIN)/python bench/bench_tensors.py
	$(BIN)/python bench/bench_collectives.py
	$(BIN)/python bench/bench_kernel.py

# Monarch and Ray, for bench_actors.py, in a venv of their own: they never touch the project's pins.
PEERS_VENV  := .venv-bench
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/peers/requirements.txt
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q -r bench/peers/requirements.txt
	touch $@

bench-peers: $(STAMP) $(PEERS_STAMP)  ## actors beside Monarch and Ray, measured in turn in the same run
	$(BIN)/python bench/bench_actors.py --peers-python $(PEERS_VENV)/bin/python

lab: $(STAMP)  ## JupyterLab on the quickstart, with the Viceroy kernel
	$(BIN)/python -m pip install -q $(PIN) -e ".[lab]"
	$(BIN)/jupyter lab notebooks/01-quickstart.ipynb

LOCK_VENV := .venv-lock
lock:  ## the newest versions the extras allow, into constraints.txt (then run make test)
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(LOCK_VENV)/bin/python -m pip install -q -e ".[test,bench,lab]"
	head -n 3 constraints.txt > $(LOCK_VENV)/constraints.txt
	$(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^torch==' >> $(LOCK_VENV)/constraints.txt
	mv $(LOCK_VENV)/constraints.txt constraints.txt && rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -rf $(LABEXT)/node_modules $(LABEXT)/lib $(LABEXT)/tsconfig.tsbuildinfo viceroy/labextension
