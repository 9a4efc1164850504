"""The package boundary: ``sharebert_runtime`` (the device runtime) never imports torch, transformers or the library,
on a workstation install too; ``import sharebert`` registers with transformers' Auto classes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
