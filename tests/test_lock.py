"""The locks (constraints.lock, constraints-optimum.lock; `make lock` writes them) against pyproject.toml's ranges,
constraints.txt's pins and the environment the tests run in: `make install` installs the lock's versions exactly, so
each lock must hold a pin, within its range, for everything the install pulls, and the locked venv must run them."""

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml takes Python 3.11's tomllib")

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "constraints.lock"
OPTIMUM_LOCK = REPO / "constraints-optimum.lock"
LOCKED_EXTRAS = ("full", "plot", "dev")  # the Makefile's `make install`: -e ".[full,plot,dev]"
# The Makefile's install-optimum adds these to the optimum extra (the test runner), by name
OPTIMUM_TOOLS = ("pytest", "pytest-xdist")
KEY_PACKAGES = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "tokenizers", "sentence-transformers")
OPTIMUM_KEY_PACKAGES = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "tokenizers", "optimum-onnx")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def _pins(path):
    """{canonical name: version} of a lock, refusing any line that is neither a comment nor one exact pin."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}:{number}: not a `name==version` pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{path.name}:{number}: {name} pinned twice"
        pins[name] = match[2]
    return pins


def _project():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirements(extras):
    """The base dependencies and those of the named extras, as pyproject.toml states them."""
    project = _project()
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _out_of_range(requirements, pins):
    """'name: why' for each requirement the pins miss or pin outside its range."""
    problems = []
    for req in requirements:
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: no pin")
        elif not req.specifier.contains(Version(version), prereleases=True):
            problems.append(f"{req.name}: pinned {version}, outside {req.specifier}")
    return problems


def _in_venv(name):
    return Path(sys.prefix).resolve() == (REPO / name).resolve()


def test_each_lock_is_exact_pins_under_a_header_saying_how_it_is_made():
    for lock in (LOCK, OPTIMUM_LOCK):
        header = " ".join(line for line in lock.read_text().splitlines() if line.startswith("#"))
        assert "make lock" in header, f"{lock.name}'s header does not say how it is made"
        pins = _pins(lock)
        assert "sharebert" not in pins  # the project itself is installed from the checkout, never pinned
        assert {"pip", "setuptools"} <= pins.keys()  # the installer and torch's and tensorboard's setuptools


def test_the_lock_pins_the_base_and_the_extras_full_plot_dev_within_their_ranges():
    assert _out_of_range(_requirements(LOCKED_EXTRAS), _pins(LOCK)) == []


def test_the_optimum_lock_pins_the_base_and_the_optimum_extra_within_their_ranges():
    pins = _pins(OPTIMUM_LOCK)
    assert _out_of_range(_requirements(["optimum"]), pins) == []
    assert [tool for tool in OPTIMUM_TOOLS if tool not in pins] == []
    assert Version(pins["transformers"]).release[:2] == (4, 57)  # optimum-onnx 0.1.0's cap, not full's 5


def test_the_range_check_refuses_a_missing_pin_and_one_out_of_range():
    requirements = [Requirement("numpy>=1.24"), Requirement("onnxruntime>=1.17,<2")]
    assert _out_of_range(requirements, {"numpy": "1.23.5"}) == [
        "numpy: pinned 1.23.5, outside >=1.24",
        "onnxruntime: no pin",
    ]


def test_constraints_txt_pins_are_each_locks():
    """constraints.txt (the CPU torch) is what `make lock` resolves with: a lock made before a change to it is stale."""
    pinned = _pins(REPO / "constraints.txt")
    assert pinned  # torch's +cpu build at least
    for lock in (LOCK, OPTIMUM_LOCK):
        pins = _pins(lock)
        assert {name: pins.get(name) for name in pinned} == pinned, f"{lock.name} is older than constraints.txt"


@pytest.mark.skipif(not _in_venv(".venv"), reason=f"runs outside the locked venv {REPO / '.venv'} (`make install`)")
def test_the_locked_venv_runs_the_locks_versions():
    pins = _pins(LOCK)
    assert {name: metadata.version(name) for name in KEY_PACKAGES} == {name: pins[name] for name in KEY_PACKAGES}, (
        "the venv is not at the lock's versions: `make install` installs them"
    )


def _closure(requirements, extras):
    """Every distribution the requirements pull in the running environment, markers evaluated, with each
    requirement on it: {canonical name: [Requirement, ...]}."""
    pulled, todo = {}, [(req, extras) for req in requirements]
    while todo:
        req, wanted = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": extra}) for extra in wanted or ("",)):
            continue
        name = canonicalize_name(req.name)
        first = name not in pulled
        pulled.setdefault(name, []).append(req)
        if first or req.extras:
            todo += [(Requirement(line), req.extras) for line in metadata.requires(name) or ()]
    return pulled


def _tree_problems(lock, requirements, extras):
    """Walked through the installed packages' own metadata: a distribution the install pulls that the lock misses
    (pip would take the newest), one the lock holds that nothing pulls, a pin outside a dependant's range (pip
    would refuse the lock)."""
    pins = _pins(lock)
    pulled = _closure(requirements, extras)
    assert len(pulled) > len(KEY_PACKAGES)
    missing = [f"{name}: pulled, not locked" for name in sorted(pulled.keys() - pins.keys())]
    stray = [f"{name}: locked, pulled by nothing" for name in sorted(pins.keys() - pulled.keys() - {"pip"})]
    conflicts = [
        f"{name}: locked {pins[name]}, {req} asked"
        for name, reqs in pulled.items()
        for req in reqs
        if name in pins and not req.specifier.contains(Version(pins[name]), prereleases=True)
    ]
    return missing + stray + conflicts


@pytest.mark.skipif(not _in_venv(".venv"), reason=f"runs outside the locked venv {REPO / '.venv'} (`make install`)")
def test_the_lock_pins_the_whole_tree_the_install_pulls_and_every_pin_meets_every_requirement_on_it():
    assert _tree_problems(LOCK, _requirements(LOCKED_EXTRAS), LOCKED_EXTRAS) == []


@pytest.mark.skipif(not _in_venv(".venv"), reason=f"runs outside the locked venv {REPO / '.venv'} (`make install`)")
def test_the_tree_check_names_a_missing_a_stray_and_a_conflicting_pin(tmp_path):
    pins = _pins(LOCK)
    pins.pop("tqdm")  # the base's own requirement
    pins["filelock"] = "2.0.0"  # below what transformers and torch ask
    pins["zzz-stray"] = "1.0"
    lock = tmp_path / "constraints.lock"
    lock.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    problems = _tree_problems(lock, _requirements(LOCKED_EXTRAS), LOCKED_EXTRAS)
    assert problems[:2] == ["tqdm: pulled, not locked", "zzz-stray: locked, pulled by nothing"]
    assert problems[2:] and all(problem.startswith("filelock: locked 2.0.0, filelock") for problem in problems[2:])


@pytest.mark.optimum
@pytest.mark.skipif(not _in_venv(".venv-optimum"), reason="runs outside .venv-optimum (`make install-optimum`)")
def test_the_optimum_lock_pins_the_whole_tree_its_install_pulls_and_every_pin_meets_every_requirement_on_it():
    tools = [Requirement(tool) for tool in OPTIMUM_TOOLS]
    assert _tree_problems(OPTIMUM_LOCK, _requirements(["optimum"]) + tools, ["optimum"]) == []


@pytest.mark.optimum
@pytest.mark.skipif(not _in_venv(".venv-optimum"), reason="runs outside .venv-optimum (`make install-optimum`)")
def test_the_optimum_venv_runs_its_locks_versions():
    pins = _pins(OPTIMUM_LOCK)
    assert {name: metadata.version(name) for name in OPTIMUM_KEY_PACKAGES} == {
        name: pins[name] for name in OPTIMUM_KEY_PACKAGES
    }, "the venv is not at the lock's versions: `make install-optimum` installs them"
