# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# optimum's integration needs transformers 4.57 (optimum-onnx 0.1.0): a second environment of its own
OPTIMUM_VENV := .venv-optimum
OPTIMUM_STAMP := $(OPTIMUM_VENV)/.installed
# The exact versions each environment last passed its tests with (`make lock` refreshes them on purpose): a new
# release of a dependency cannot change what a fresh clone installs. LOCK=constraints.txt installs from the ranges.
LOCK := constraints.lock
OPTIMUM_LOCK := constraints-optimum.lock

.PHONY: demo test test-fast test-optimum test-latest lint docs-check install install-optimum lock clean

# The current stack (transformers 5, sentence-transformers 6, CPU torch), at the lock's versions, pip's own
# included. pip builds the editable install in isolation (setuptools >= 77 reads project.license; an older one
# beside it does not). A changed lock reinstalls.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) -e ".[full,plot,dev]"
	touch $(STAMP)

install: $(STAMP)

# No OMP_NUM_THREADS: compress measures its student's step at each thread count the CPU gives and trains at the
# fastest, measured again when the load moves (sharebert/training/threads.py); a fixed 2 collapsed beside a busy process.
demo: $(STAMP)
	$(VENV)/bin/sharebert demo

# The linter and the formatter (pyproject.toml [tool.ruff]): a finding or an unformatted file stops `make test`.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# pytest-xdist workers, one a core, each test file on one worker (`--dist loadfile`: a file's module fixtures
# are built once, and test_docs.py's blocks run in order); OMP_NUM_THREADS=1 keeps each to its core. Both
# tiers run on two (the CI machine's cores); `make test WORKERS=0` runs the suite in one process.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile

# Everything but the web tier (`make test-web`, which needs npm's modules): the lint, then every test. Each recipe
# line's exit status is make's: a lint finding stops it before the tests, and pytest's own status (1 failures,
# 2 interrupted, 5 nothing collected) fails `make test`.
test: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=25 -m "not web" tests

# The fast tier (under 3 minutes on 2 cores): every test not marked `slow`.
test-fast: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=10 -m "not slow" tests

# The `optimum` extra in its own venv, with optimum-cli's hook (optimum-register/, docs/EXPORT.md "optimum"),
# installed non-editably: its module must lie in optimum's own folder. test-optimum runs the tests marked
# `optimum` (skipped in `make test`, whose transformers 5 optimum-onnx cannot be installed beside).
$(OPTIMUM_STAMP): pyproject.toml $(OPTIMUM_LOCK) optimum-register/pyproject.toml optimum-register/optimum/commands/register/sharebert.py
	test -x $(OPTIMUM_VENV)/bin/python || $(PYTHON) -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/python -m pip install -q -c $(OPTIMUM_LOCK) --upgrade pip
	$(OPTIMUM_VENV)/bin/python -m pip install -q -c $(OPTIMUM_LOCK) -e ".[optimum]" "pytest>=8" "pytest-xdist>=3.5"
	$(OPTIMUM_VENV)/bin/python -m pip install -q -c $(OPTIMUM_LOCK) --no-deps ./optimum-register
	touch $(OPTIMUM_STAMP)

install-optimum: $(OPTIMUM_STAMP)

test-optimum: $(OPTIMUM_STAMP)
	OMP_NUM_THREADS=1 $(OPTIMUM_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile -m optimum --durations=10 tests

# The locks refreshed on purpose: each environment built afresh in a scratch venv from pyproject.toml's ranges
# (constraints.txt: the CPU torch), then frozen: every installed distribution but the project's own (editable,
# or the hook's local folder), the lock's header (its comment lines) kept. Then `make test test-optimum`, commit.
LOCK_VENV := .venv-lock
freeze = { grep '^\#' $(2) || true; $(1)/bin/python -m pip freeze --all --exclude-editable | grep -v ' @ '; } > $(2).new && mv $(2).new $(2)
lock:
	rm -rf $(LOCK_VENV)
	$(MAKE) install VENV=$(LOCK_VENV) LOCK=constraints.txt
	$(call freeze,$(LOCK_VENV),$(LOCK))
	rm -rf $(LOCK_VENV)
	$(MAKE) install-optimum OPTIMUM_VENV=$(LOCK_VENV) OPTIMUM_LOCK=constraints.txt
	$(call freeze,$(LOCK_VENV),$(OPTIMUM_LOCK))
	rm -rf $(LOCK_VENV)

# Drift seen on purpose, never in `make test`: a fresh venv with the newest versions the ranges allow (no lock;
# constraints.txt's CPU torch), the versions that differ from the lock (<: locked, >: newest), then the fast
# tier there. Green: `make lock` may take them. Red: a fix or a capped range, in a commit.
LATEST_VENV := .venv-latest
test-latest:
	rm -rf $(LATEST_VENV)
	$(MAKE) install VENV=$(LATEST_VENV) LOCK=constraints.txt
	$(LATEST_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v ' @ ' | diff $(LOCK) - | grep '^[<>] [^#]' || true
	OMP_NUM_THREADS=1 $(LATEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) --durations=10 -m "not slow" tests

# The torch-free runtime on aarch64 under qemu's user-mode emulation (docs/DEVICE.md "aarch64 (emulated)"): the
# qemu, the arm64 Python and the wheels are built once into .aarch64/, then `sharebert verify`, the agreement with
# x86-64 and tests/deploy/ run there, on artifacts this venv exports.
.PHONY: test-aarch64
test-aarch64: $(STAMP)
	PY=$(PY) bash .ci/aarch64

# The web tier (docs/DEVICE.md "In a web page or in Node"): examples/web's npm modules from its lock (no install
# scripts: .npmrc), then the tests marked `web`: Node always, headless Chromium where it is installed
# (/usr/bin/chromium or $CHROMIUM; `apt-get install chromium`). Each is skipped, in one line, without them.
.PHONY: test-web
test-web: $(STAMP)
	cd examples/web && npm ci --no-audit --no-fund
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -p no:cacheprovider -m web --durations=10 tests/deploy/test_web.py

# The shell and Python blocks of README.md and docs/*.md, run in order with budgets capped (also part of `make test`).
docs-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/test_docs.py

clean:
	rm -rf $(VENV) $(OPTIMUM_VENV) $(LOCK_VENV) $(LATEST_VENV) runs artifacts *.egg-info optimum-register/build optimum-register/*.egg-info
