# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs-check install clean

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

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# The shell and Python blocks of README.md and docs/*.md, run in order with budgets capped (also part of `make test`).
docs-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/test_docs.py

clean:
	rm -rf $(VENV) runs artifacts *.egg-info optimum-register/build optimum-register/*.egg-info
