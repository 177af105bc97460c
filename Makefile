# Two commands on a fresh machine (see README.md):
#   make lab    create/refresh .venv, then open JupyterLab on the quickstart notebook
#   make test   create/refresh .venv, then lint + every test + every notebook (in headless Chromium, else nbval)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# One inductor cache for every compile in tests and notebooks (cold ~20 s, warm ~2 s here).
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.inductor-cache
# JupyterLab refuses to start as root unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--ServerApp.allow_root=True,)

.PHONY: env lab test test-quick bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# constraints.txt pins torch==2.13.0 (CPU build) for the set-up path; the package accepts torch>=2.4.
	$(BIN)/python -m pip install -q -c constraints.txt torch -e '.[notebook,tensorboard,test]'
	touch $@

env: $(VENV)/.installed

lab: env
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/01_quickstart.ipynb

test: env
	$(BIN)/ruff check workbench tests benchmarks
	$(BIN)/pytest --nbval-lax -p no:cacheprovider -ra --durations=15

test-quick: env
	$(BIN)/pytest -m "not slow and not browser" -q tests

bench: env
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_fixed_cost.py

clean:
	rm -rf $(VENV) workbench-runs .inductor-cache .pytest_cache
