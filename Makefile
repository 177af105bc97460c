# Two commands on a fresh machine (see README.md):
#   make lab    create/refresh .venv with what the notebooks need (the notebook extra), then open JupyterLab
#               on the quickstart notebook (notebook 11 also needs the hf extra, notebook 13 the lightning
#               extra, notebook 07's jobs section the cluster extra: each says so in its first cell;
#               .venv/bin/pip install -e '.[hf,cluster,lightning]' adds all three)
#   make test   add the test extra (pytest, nbval, playwright, hypothesis, ruff, transformers, accelerate,
#               lightning, tensorboard, submitit), then lint + every test + every notebook (in headless
#               Chromium, else nbval)
#   make test-quick  only the tests in tests/ that are neither slow nor browser tests: no ruff, no notebook
# Also: make docs (docs/knobs.md from the knob declarations), make screenshots (docs/panel.png from a real browser run)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# One inductor cache for every compile in tests and notebooks (cold ~20 s, warm ~2 s here).
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.inductor-cache
# Which torch build: pip's own choice by default (on this machine, the CPU wheel pip finds for torch==2.13.0;
# from PyPI on Linux x86-64, the CUDA build, with its nvidia-* wheels). Choose one with PyTorch's index:
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu     (CPU only: a smaller download)
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cu128   (that CUDA version's build)
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
# JupyterLab refuses to start as root unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--ServerApp.allow_root=True,)

.PHONY: env env-test lab test test-quick bench docs screenshots clean

# The notebooks' install: the core + the notebook extra (a workshop laptop gets nothing more).
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# constraints.txt pins torch==2.13.0 for the set-up path (TORCH_INDEX picks its build); the package accepts torch>=2.4.
	$(BIN)/python -m pip install -q $(TORCH_FROM) -c constraints.txt torch -e '.[notebook]'
	touch $@

# The developers' install on top: the test extra (it pulls the tensorboard and cluster extras, transformers,
# accelerate and lightning too).
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -q $(TORCH_FROM) -c constraints.txt torch -e '.[notebook,test]'
	touch $@

env: $(VENV)/.installed

env-test: $(VENV)/.installed-test

lab: env
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/01_quickstart.ipynb

test: env-test
	$(BIN)/ruff check workbench tests benchmarks scripts
	$(BIN)/pytest --nbval-lax -p no:cacheprovider -ra --durations=15

test-quick: env-test
	$(BIN)/pytest -m "not slow and not browser" -q tests

bench: env-test
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_fixed_cost.py

# docs/knobs.md is generated from the knob declarations in workbench/core/knobs/ (tests/test_docs.py fails when it is stale).
docs: env
	$(BIN)/python scripts/gen_knobs_doc.py

# docs/panel.png: the quickstart notebook's panel, taken by the real-browser test (needs /usr/bin/chromium).
screenshots: env-test
	@test -x /usr/bin/chromium || { echo "make screenshots needs /usr/bin/chromium (apt-get install -y chromium)"; exit 1; }
	WORKBENCH_SCREENSHOT=$(CURDIR)/docs/panel.png $(BIN)/pytest tests/test_browser.py -k quickstart_panel -p no:cacheprovider -q

clean:
	rm -rf $(VENV) workbench-runs .inductor-cache .pytest_cache
