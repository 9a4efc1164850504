"""The package boundary: ``sharebert_runtime`` (the device runtime) never imports torch, transformers or the library,
on a workstation install too; ``import sharebert`` registers with transformers' Auto classes; the ``sharebert``
command answers its arithmetic (``report``, ``budget``) and every ``--help`` without torch, and registers before a
command that builds a model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_structure import TORCH_FREE

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
HEAVY = ("torch", "transformers", "sharebert", "optimum", "onnx")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(model folder, fill-mask artifact) of a tiny ShareBERT."""
    root = tmp_path_factory.mktemp("boundary")
    build_model("sharebert-tiny", root / "model", TINY, seed=0)
    export_model(root / "model", root / "artifact", task="fill-mask", check_limit=8, runs=1, progress=False)
    return root / "model", root / "artifact"


def _python(code: str, *args) -> str:
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_runtime_loads_and_answers_without_importing_torch(folders):
    code = f"""
import json, sys
import sharebert_runtime
from sharebert_runtime import Runtime
rt = Runtime(sys.argv[1], threads=1)
answer = rt.predict(["the capital of france is [MASK]."])[0]
print(json.dumps([len(answer), sorted(m for m in {HEAVY!r} if m in sys.modules)]))
"""
    candidates, heavy = json.loads(_python(code, folders[1]))
    assert candidates == 1 and heavy == []


def test_the_sharebert_command_predicts_without_importing_torch(folders):
    """``sharebert predict``, as its console script runs: the command line and the runtime, nothing heavier."""
    code = f"""
import contextlib, io, json, sys
from sharebert_runtime.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["predict", sys.argv[1], "--json", "a [MASK] day ."])
print(json.dumps([code, len(out.getvalue().splitlines()), sorted(m for m in {HEAVY!r} if m in sys.modules)]))
"""
    assert json.loads(_python(code, folders[1])) == [0, 1, []]


def test_import_sharebert_lets_auto_classes_load_a_sharebert_folder(folders):
    code = """
import json, sys
import sharebert
from transformers import AutoConfig, AutoModel
folder = sys.argv[1]
print(json.dumps([type(AutoConfig.from_pretrained(folder)).__name__, type(AutoModel.from_pretrained(folder)).__name__]))
"""
    assert json.loads(_python(code, folders[0])) == ["ShareBertConfig", "ShareBertModel"]


ARITHMETIC = (["report", "--preset", "sharebert-large", "--format", "json"], ["budget", "--max-params", "10M"])
# Each command as main runs it (`as_program`: with no argv, as the console script calls it), a `--help` of a model
# command, then every torch-free module of the library; printed: [[exit code, output] per command, torch and
# transformers if imported].
COMMANDS_THEN_MODULES = """
import contextlib, importlib, io, json, sys
from sharebert_runtime.main import main
given = sys.argv[1:]  # before each run replaces sys.argv's tail
as_program, runs, modules = json.loads(given[0])
outs = []
for argv in runs:
    sys.argv[1:] = argv
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = main() if as_program else main(argv)
        except SystemExit as e:  # argparse's --help
            code = e.code
    outs.append([code, out.getvalue()])
for name in modules:
    importlib.import_module(name)
print(json.dumps([outs, sorted(m for m in ("torch", "transformers") if sys.modules.get(m) is not None)]))
"""
# torch and transformers unimportable, as on an install without the full extra (import raises ImportError).
BLOCKED = "import sys; sys.modules.update(torch=None, transformers=None)\n"


def _in_process(argv, capsys) -> list:
    from sharebert_runtime.main import main

    capsys.readouterr()
    code = main(argv)
    return [code, capsys.readouterr().out]


@pytest.mark.parametrize("where", ["the sharebert command on this workstation", "torch and transformers blocked"])
def test_arithmetic_commands_and_torch_free_modules_import_no_torch(where, capsys):
    """`report`, `budget` and a model command's `--help` answer, and the torch-free modules import, without torch or
    transformers: in the `sharebert` process on a workstation (both installed, neither imported) and where neither
    can be imported. Their answers are those of this process, which has torch."""
    blocked = where.startswith("torch")
    runs = [*ARITHMETIC, ["build", "--help"]]
    code = (BLOCKED if blocked else "") + COMMANDS_THEN_MODULES
    outs, heavy = json.loads(_python(code, json.dumps([not blocked, runs, TORCH_FREE])))
    assert heavy == []
    assert outs[:2] == [_in_process(argv, capsys) for argv in ARITHMETIC]
    report = json.loads(outs[0][1])
    assert report["learned_params"] == sum(report["components"].values()) > 0
    assert outs[2][0] == 0 and "--preset" in outs[2][1]


def test_the_sharebert_command_registers_before_a_model_command_runs(tmp_path):
    """In the `sharebert` process, `import sharebert` leaves the registration to the command line, which registers
    before a command that builds a model: the folder `build` writes loads through the Auto classes."""
    code = (
        COMMANDS_THEN_MODULES
        + """
from transformers import AutoConfig, AutoModel
folder = given[1]
print(json.dumps([type(AutoConfig.from_pretrained(folder)).__name__, type(AutoModel.from_pretrained(folder)).__name__]))
"""
    )
    tiny = [f"--set={k}={v}" for k, v in TINY.items()]
    build = ["build", "--preset", "sharebert-tiny", *tiny, "--out", str(tmp_path / "model")]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps([True, [ARITHMETIC[0], build], []]), tmp_path / "model"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    (outs, heavy), classes = json.loads(lines[-2]), json.loads(lines[-1])
    assert [code for code, _ in outs] == [0, 0] and heavy == ["torch", "transformers"]
    assert classes == ["ShareBertConfig", "ShareBertModel"]
