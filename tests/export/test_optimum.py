"""optimum's own entry points on sharebert models: ``optimum-cli export onnx`` (the hook of
``optimum-register/``), ``main_export`` and ``ORTModel*.from_pretrained(folder, export=True)`` after
``import sharebert``, and ``ORTQuantizer`` on our artifacts. Real optimum, real ORT sessions. Those marked
``optimum`` need the ``optimum`` extra (transformers 4.57: ``make test-optimum``) and are skipped without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import Runtime, verify_artifact
from sharebert_runtime.artifact import MODEL, RAM_INT8_COMPUTE, RAM_INT8_GENERATOR

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
OPTIMUM_CLI = str(Path(sys.executable).parent / "optimum-cli")
SENTENCES = [
    "the capital of france is [MASK].",
    "he went to the [MASK] to buy some bread.",
    "a [MASK] movie , and a [MASK] one .",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model folder, compact fp32 fill-mask artifact) of a tiny ShareBERT (VEPS)."""
    root = tmp_path_factory.mktemp("optimum")
    build_model("sharebert-tiny", root / "model", TINY, seed=0)
    export_model(
        root / "model",
        root / "artifact",
        task="fill-mask",
        weights="compact",
        quantize="none",
        check_limit=8,
        runs=2,
        progress=False,
    )
    return root / "model", root / "artifact"


def _feeds(model_dir: Path, names) -> dict:
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(model_dir)(SENTENCES, padding=True, return_tensors="np")
    feeds = {k: v.astype(np.int64) for k, v in enc.items()}
    feeds.setdefault("token_type_ids", np.zeros_like(feeds["input_ids"]))
    return {n: feeds[n] for n in names}


def _torch_logits(model_dir: Path, feeds: dict) -> np.ndarray:
    from sharebert import ShareBertForMaskedLM

    model = ShareBertForMaskedLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()


def _ort_logits(path: Path, model_dir: Path) -> tuple[np.ndarray, dict]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(model_dir, [i.name for i in session.get_inputs()])
    return session.run(["logits"], feeds)[0], feeds


def _ops(graph) -> list[str]:
    """Op types of ``graph``'s nodes, those of subgraphs (``If`` branches) included."""
    out = []
    for node in graph.node:
        out.append(node.op_type)
        for attr in node.attribute:
            for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                out += _ops(sub)
    return out


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.optimum
def test_optimum_cli_exports_a_sharebert_folder(tiny, tmp_path):
    model_dir, _ = tiny
    out = tmp_path / "cli"
    done = _run([OPTIMUM_CLI, "export", "onnx", "--model", str(model_dir), "--task", "fill-mask", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    logits, feeds = _ort_logits(out / MODEL, model_dir)
    diff = float(np.abs(logits - _torch_logits(model_dir, feeds)).max())
    assert diff <= 1e-4, diff  # fails on NaN too


@pytest.mark.optimum
def test_main_export_and_ortmodel_export_true_after_the_import(tiny, tmp_path):
    """In a fresh process: ``import sharebert``, then optimum's Python entry points."""
    model_dir, _ = tiny
    script = f"""
import json, numpy as np, sharebert
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTModelForMaskedLM, ORTModelForFeatureExtraction
from transformers import AutoTokenizer
main_export({str(model_dir)!r}, {str(tmp_path / "main")!r}, task="feature-extraction")
enc = AutoTokenizer.from_pretrained({str(model_dir)!r})({SENTENCES!r}, padding=True, return_tensors="pt")
mlm = ORTModelForMaskedLM.from_pretrained({str(model_dir)!r}, export=True)
fe = ORTModelForFeatureExtraction.from_pretrained({str(tmp_path / "main")!r})
print(json.dumps({{"logits": mlm(**enc).logits.tolist(), "hidden": fe(**enc).last_hidden_state.tolist()}}))
"""
    done = _run([sys.executable, "-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    from sharebert import ShareBertForMaskedLM, ShareBertModel

    enc = AutoTokenizer.from_pretrained(model_dir)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = ShareBertForMaskedLM.from_pretrained(model_dir).eval()(**enc).logits.numpy()
        hidden = ShareBertModel.from_pretrained(model_dir).eval()(**enc).last_hidden_state.numpy()
    for name, want in (("logits", logits), ("hidden", hidden)):
        diff = float(np.abs(np.asarray(got[name]) - want).max())
        assert diff <= 1e-4, (name, diff)


HOOK = Path(__file__).resolve().parents[2] / "optimum-register" / "optimum" / "commands" / "register" / "sharebert.py"


def _damaged(root: Path, model_dir: Path) -> Path:
    import shutil

    shutil.copytree(model_dir, root / "damaged")
    (root / "damaged" / "config.json").write_text('{"model_type": "sharebert", "hidden')
    return root / "damaged"


# (id, --model (M: the tiny model, A: its artifact, or a function of (tmp_path, M)), further arguments, message)
HOOK_CASES = [
    ("missing-folder", lambda t, m: t / "nope", ["--task", "fill-mask"], "model folder not found"),
    ("empty-folder", lambda t, m: t / "empty", ["--task", "fill-mask"], "config.json not found"),
    ("damaged-config", _damaged, ["--task", "fill-mask"], "config.json is not valid JSON"),
    ("artifact-folder", "A", ["--task", "fill-mask"], "is an exported ONNX artifact"),
    ("unknown-task", "M", ["--task", "fill-mak"], "--task fill-mak: sharebert exports"),
    ("output-is-a-file", "M", ["--task", "fill-mask", "--out-file"], "is a file, not a folder"),
    ("head-not-trained", "M", ["--task", "text-classification"], "holds no trained weights"),
]


@pytest.mark.optimum
@pytest.mark.parametrize("model, args, said", [c[1:] for c in HOOK_CASES], ids=[c[0] for c in HOOK_CASES])
def test_optimum_cli_preflight_names_the_problem(tiny, tmp_path, model, args, said):
    from sharebert.export.optimum_cli import check_export_onnx

    model_dir, artifact = tiny
    (tmp_path / "empty").mkdir()
    (tmp_path / "out.txt").write_text("mine\n")
    source = {"M": model_dir, "A": artifact}[model] if isinstance(model, str) else model(tmp_path, model_dir)
    out = tmp_path / "out.txt" if "--out-file" in args else tmp_path / "out"
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        check_export_onnx(["--model", str(source), *[a for a in args if a != "--out-file"], str(out)])
    assert said in str(e.value)
    assert not (tmp_path / "out").exists() and (tmp_path / "out.txt").read_text() == "mine\n"
    check_export_onnx(["--model", str(model_dir), "--task", "fill-mask", str(tmp_path / "out")])  # a good one passes


@pytest.mark.optimum
def test_optimum_cli_hook_refuses_in_one_line_exit_2(tiny, tmp_path, capfd, monkeypatch):
    """The registration hook as optimum-cli imports it (this checkout's file, run with optimum-cli's argv), in this
    process (an exception other than the exit escaping it fails the test; ``capfd``: all that reaches fd 2)."""
    import runpy

    argv = [
        "optimum-cli",
        "export",
        "onnx",
        "--model",
        str(tiny[0]),
        "--task",
        "text-classification",
        str(tmp_path / "o"),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    capfd.readouterr()
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(HOOK))
    stderr = capfd.readouterr().err
    lines = stderr.strip().splitlines()
    assert done.value.code == 2 and len(lines) == 1 and "holds no trained weights" in lines[0], stderr
    assert "Traceback" not in stderr and not (tmp_path / "o").exists()


def test_ram_int8_graphs_sit_in_a_subfolder_and_run(tiny):
    _, artifact = tiny
    manifest = verify_artifact(artifact)
    assert sorted(p.name for p in artifact.glob("*.onnx")) == [MODEL]
    assert {RAM_INT8_GENERATOR, RAM_INT8_COMPUTE} <= set(manifest["files"])
    model_bytes = (artifact / MODEL).stat().st_size
    for name in (RAM_INT8_GENERATOR, RAM_INT8_COMPUTE):  # tensors stay in model.onnx: stored once
        assert (artifact / name).stat().st_size < model_bytes / 20
    fp32 = Runtime(artifact).fill_mask(SENTENCES[:2], top_k=1)
    int8 = Runtime(artifact, ram="int8").fill_mask(SENTENCES[:2], top_k=1)
    scores = [[m[0]["score"] for m in text] for text in fp32], [[m[0]["score"] for m in text] for text in int8]
    diff = float(np.abs(np.asarray(sum(scores[0], [])) - np.asarray(sum(scores[1], []))).max())
    assert diff <= 0.05, diff


@pytest.mark.optimum
def test_ortquantizer_quantizes_an_artifact(tiny, tmp_path):
    """``ORTQuantizer.from_pretrained(artifact)`` (one .onnx in the folder), dynamic int8 for avx2; the result runs
    in ORT and stays near the fp32 artifact. It quantizes every MatMul, the generated weights per run (their
    inputs are computed, so they get DynamicQuantizeLinear rather than stored int8)."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    model_dir, artifact = tiny
    ORTQuantizer.from_pretrained(artifact).quantize(
        AutoQuantizationConfig.avx2(is_static=False, per_channel=False), save_dir=tmp_path / "q"
    )
    quantized = tmp_path / "q" / "model_quantized.onnx"
    ops = _ops(onnx.load(str(quantized), load_external_data=False).graph)
    assert ops.count("MatMulInteger") > 0 and "MatMul" not in ops, sorted(set(ops))
    want, _ = _ort_logits(artifact / MODEL, model_dir)
    got, _ = _ort_logits(quantized, model_dir)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    assert rel <= 0.1, rel


@pytest.mark.optimum
def test_optimum_cli_quantizes_an_artifact(tiny, tmp_path):
    """``optimum-cli onnxruntime quantize``: the hook registers sharebert, so the artifact's config.json is
    copied beside the quantized graph (without it, optimum warns and writes none) and ORTModel loads it."""
    model_dir, artifact = tiny
    out = tmp_path / "q"
    done = _run([OPTIMUM_CLI, "onnxruntime", "quantize", "--onnx_model", str(artifact), "--avx2", "-o", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["model_type"] == "sharebert"
    want, _ = _ort_logits(artifact / MODEL, model_dir)
    got, _ = _ort_logits(out / "model_quantized.onnx", model_dir)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    assert rel <= 0.1, rel
