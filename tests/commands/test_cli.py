"""Every subcommand's --help renders (argparse %-formats help strings, so a stray % breaks it)."""

from __future__ import annotations

import pytest

from sharebert_runtime.main import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_renders(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert f"usage: sharebert {name}" in capsys.readouterr().out


def test_no_command_prints_usage_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_overview_shows_every_command_with_its_line_and_the_version(capsys):
    from sharebert import __version__

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, (_, line) in COMMANDS.items():
        assert f"{name} {' '.join(line.split())}" in text
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"sharebert {__version__}"


# The overview, each command's --help and argument errors answer without torch (or transformers): every row runs
# in one of two fresh interpreters, which fails a row when torch is in sys.modules after its command. The overview
# and the device commands (sharebert_runtime) run as they are, on this workstation install; a library command's
# module imports sharebert, which registers with transformers here, so it runs as on a device install (torch and
# transformers blocked): its help and argument errors must not need them. The rows share an interpreter (two
# processes, not one per row): a row that imported torch stays caught, since torch is checked after each row and
# nothing takes it out of sys.modules again.
FAST = {
    "": [["--help"], ["--no-such-option"]],
    "build": [
        ["build", "--help"],
        ["build", "--no-such-option"],
        ["build", "--preset", "sharebrt-tiny", "--out", "{tmp}/m"],
        ["build", "--preset", "sharebert-tiny", "--out", "{tmp}/full"],
    ],  # a folder holding a file of the user's
    "report": [["report", "--help"], ["report", "--preset", "sharebert-tiny", "--seq-len", "x"]],
    "budget": [["budget", "--help"], ["budget", "--max-params", "10M", "--dtype", "fp8"]],
    "prepare": [
        ["prepare", "--help"],
        ["prepare", "--out", "{tmp}/d"],
        ["prepare", "--train", "/dev/zero", "--out", "{tmp}/d"],
    ],
    "pretrain": [
        ["pretrain", "--help"],
        ["pretrain", "--out", "{tmp}/p", "--max-steps", "x"],
        ["pretrain", "--preset", "sharebrt-tiny", "--out", "{tmp}/p"],
    ],
    "finetune": [
        ["finetune", "--help"],
        ["finetune", "--model", "m", "--task", "sst3", "--out", "{tmp}/f"],
        ["finetune", "--model", "m", "--task", "sst2", "--out", "{tmp}/f", "--epochs", "0"],
    ],
    "distill": [
        ["distill", "--help"],
        ["distill", "--teacher", "t", "--student", "s", "--out", "{tmp}/d", "--objective", "x"],
        ["distill", "--teacher", "t", "--student", "s", "--out", "{tmp}/d", "--task", "sst2", "--layer-map", "1-3"],
        ["distill", "--teacher", "t", "--student", "s", "--out", "{tmp}/d"],
    ],
    "evaluate": [
        ["evaluate", "--help"],
        ["evaluate", "glue", "--help"],
        ["evaluate", "noise", "--model", "m"],
        ["evaluate", "glue", "--model", "m", "--task", "sst2", "--plot", "x.txt", "--depths", "1"],
    ],
    "export": [["export", "--help"], ["export", "--model", "m", "--out", "{tmp}/e", "--quantize", "int3"]],
    "plot": [["plot", "--help"], ["plot"]],
    "predict": [["predict", "--help"], ["predict"]],
    "serve": [["serve", "--help"], ["serve", "--port", "x"]],
    "verify": [["verify", "--help"], ["verify"], ["verify", "{tmp}/no-such-artifact"]],
    "demo": [["demo", "--help"], ["demo", "--steps", "x"]],
    "compress": [
        ["compress", "--help"],
        ["compress", "{tmp}/teacher", "--out", "{tmp}/o", "--max-time", "-1"],
        ["compress", "{tmp}/teacher", "--out", "{tmp}/o", "--task", "sst3"],
        ["compress", "{tmp}/teacher", "--out", "{tmp}/o", "--task-lr", "0"],
    ],
}
DEVICE = ("", "predict", "serve", "verify")
PROBE = """
import contextlib, io, json, sys
if sys.argv[2] == "block":
    sys.modules.update(torch=None, transformers=None)
from sharebert_runtime.main import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    heavy = sorted(m for m in ("torch", "transformers") if sys.modules.get(m) is not None)
    results.append({"argv": argv, "code": code, "heavy": heavy, "err": err.getvalue()})
print(json.dumps(results))
"""


def test_fast_table_covers_every_command():
    assert set(FAST) == {"", *COMMANDS}


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Each row of ``FAST`` run by ``PROBE``: {command: [(argv, result)]}, the device commands' rows in one
    interpreter as installed, the library commands' in another with torch and transformers blocked."""
    import json
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("mine")
    out = {}
    for block, names in (("free", DEVICE), ("block", sorted(set(FAST) - set(DEVICE)))):
        rows = [(name, [a.format(tmp=tmp) for a in argv]) for name in names for argv in FAST[name]]
        done = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps([argv for _, argv in rows]), block],
            capture_output=True,
            text=True,
            timeout=300,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for (name, argv), result in zip(rows, json.loads(done.stdout.strip().splitlines()[-1]), strict=True):
            out.setdefault(name, []).append((argv, result))
    return out


@pytest.mark.parametrize("name", sorted(FAST))
def test_help_and_argument_errors_answer_without_torch(name, answers):
    for argv, result in answers[name]:
        help_asked = "--help" in argv
        assert result["code"] == (0 if help_asked else 2), (argv, result["err"])
        if not help_asked:
            assert "error" in result["err"], (argv, result["err"])
        assert result["heavy"] == [], (argv, result)
