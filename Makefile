# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint docs-check install clean

# optimum-register/ (optimum-cli's hook, docs/EXPORT.md "optimum") is installed non-editably: its module
# must lie in optimum's own folder.
$(STAMP): pyproject.toml constraints.txt optimum-register/pyproject.toml optimum-register/optimum/commands/register/sharebert.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[full,plot,dev]"
	$(PY) -m pip install -q -c constraints.txt ./optimum-register
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=2 $(VENV)/bin/sharebert demo

# `ruff format --check .` joins `lint` once the tree has had its one format commit (pyproject.toml [tool.ruff]).
lint: $(STAMP)
	$(PY) -m ruff check .

# Everything: the lint, then every test. Each recipe line's exit status is make's: a lint finding stops it
# before the tests, and pytest's own status (1 failures, 2 interrupted, 5 nothing collected) fails `make test`.
test: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# The fast tier (under 3 minutes on 2 cores): every test not marked `slow`.
test-fast: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider --durations=10 -m "not slow" tests

# The shell and Python blocks of README.md and docs/*.md, run in order with budgets capped (also part of `make test`).
docs-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/test_docs.py

clean:
	rm -rf $(VENV) runs artifacts *.egg-info optimum-register/build optimum-register/*.egg-info
