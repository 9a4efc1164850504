"""`sharebert export --format ort`: ORT-format artifacts for ONNX Runtime mobile / minimal builds."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sharebert.export.exporter import export_model
from sharebert.export.ort_format import parse_required_operators
from sharebert.formats.build import build_model
from sharebert_runtime import ArtifactError, Runtime
from sharebert_runtime.artifact import (
    MANIFEST,
    MODEL,
    ORT_COMPUTE,
    ORT_GENERATOR,
    REQUIRED_OPERATORS,
    assemble_ort,
    verify_artifact,
)
from sharebert_runtime.main import main

QUICK = dict(check_limit=16, runs=3, progress=False)
SENTENCES = [
    "the capital of france is [MASK].",
    "he went to the [MASK] to buy some bread.",
    "",
    "a [MASK] movie , and a [MASK] one .",
    "it 's a charming and often affecting journey . " * 12,
]


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """(model folder, ONNX artifact, ORT-format artifact) of sharebert-tiny, fill-mask."""
    root = tmp_path_factory.mktemp("ort_mlm")
    build_model("sharebert-tiny", root / "model", seed=0)
    export_model(root / "model", root / "onnx", task="fill-mask", **QUICK)
    export_model(root / "model", root / "ort", task="fill-mask", format="ort", **QUICK)
    return root / "model", root / "onnx", root / "ort"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(ONNX artifact, ORT-format artifact) of a sharebert-tiny text classifier with three labels."""
    import torch

    from sharebert import ShareBertForSequenceClassification
    from sharebert.formats.build import config_for_vocab
    from sharebert.formats.paths import default_vocab
    from sharebert.formats.tokenization import hf_tokenizer

    root = tmp_path_factory.mktemp("ort_cls")
    tokenizer = hf_tokenizer(default_vocab())
    config = config_for_vocab(
        "sharebert-tiny",
        {"num_labels": 3, "id2label": {0: "neg", 1: "neu", 2: "pos"}, "label2id": {"neg": 0, "neu": 1, "pos": 2}},
        len(tokenizer),
    )
    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    export_model(root / "model", root / "onnx", task="text-classification", **QUICK)
    export_model(root / "model", root / "ort", task="text-classification", format="ort", **QUICK)
    return root / "onnx", root / "ort"


def _logits(rt: Runtime, texts) -> np.ndarray:
    ids, mask, _ = rt._encode(texts)
    return rt._run(ids, mask)[rt.output_names[0]]


def _assert_close(a: np.ndarray, b: np.ndarray) -> None:
    assert np.isfinite(a).all() and np.isfinite(b).all()
    assert a.shape == b.shape and float(np.max(np.abs(a - b))) <= 1e-5


def test_fill_mask_equals_the_onnx_artifact(mlm):
    _, onnx_dir, ort_dir = mlm
    a, b = Runtime(onnx_dir, threads=1), Runtime(ort_dir, threads=1)
    _assert_close(_logits(a, SENTENCES), _logits(b, SENTENCES))
    assert a.fill_mask(SENTENCES, top_k=3) == b.fill_mask(SENTENCES, top_k=3)
    if a.max_depth:  # layer gating survives the ORT conversion
        _assert_close(_logits(a.at_depth(1), SENTENCES), _logits(b.at_depth(1), SENTENCES))


def test_classify_equals_the_onnx_artifact(classifier):
    a, b = (Runtime(d, threads=1) for d in classifier)
    _assert_close(_logits(a, SENTENCES), _logits(b, SENTENCES))
    assert [r["label"] for r in a.classify(SENTENCES)] == [r["label"] for r in b.classify(SENTENCES)]


def test_files_are_the_learned_bytes(mlm):
    _, _, ort_dir = mlm
    manifest = verify_artifact(ort_dir)
    assert manifest["format_version"] == 2 and manifest["model_format"] == "ort"
    assert not (ort_dir / MODEL).exists() and not list(ort_dir.glob("ram_int8*"))
    on_disk = {p.relative_to(ort_dir).as_posix() for p in ort_dir.rglob("*") if p.is_file()} - {MANIFEST}
    assert on_disk == set(manifest["files"])
    model_bytes = sum(manifest["files"][n]["bytes"] for n in (ORT_GENERATOR, ORT_COMPUTE))
    learned_bytes = 4 * manifest["learned_params"]
    assert model_bytes <= 1.02 * learned_bytes, (model_bytes, learned_bytes)
    assert manifest["ort"]["parity_vs_onnx"]["max_abs_diff"] <= 1e-5


def _ort_ops(data: bytes) -> dict[str, set[str]]:
    """``{domain: {op}}`` of an ORT-format model, subgraphs included (ORT's flatbuffer reader)."""
    import onnxruntime.tools.ort_format_model  # noqa: F401  (puts the flatbuffer bindings on sys.path)
    from ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

    ops: dict[str, set[str]] = {}

    def walk(graph):
        for i in range(graph.NodesLength()):
            node = graph.Nodes(i)
            ops.setdefault(node.Domain().decode() or "ai.onnx", set()).add(node.OpType().decode())
            for k in range(node.AttributesLength()):
                attr = node.Attributes(k)
                if attr.G() is not None:
                    walk(attr.G())
                for j in range(attr.GraphsLength()):
                    walk(attr.Graphs(j))

    walk(InferenceSession.GetRootAs(data, 0).Model().Graph())
    return ops


def test_required_operators_list_the_graphs_ops(mlm):
    _, _, ort_dir = mlm
    manifest = verify_artifact(ort_dir)
    listed = parse_required_operators(ort_dir / REQUIRED_OPERATORS)
    rt = Runtime(ort_dir)
    generator = (ort_dir / ORT_GENERATOR).read_bytes()
    import onnxruntime as ort

    session = ort.InferenceSession(generator, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    compute = assemble_ort(
        (ort_dir / ORT_COMPUTE).read_bytes(), manifest["ort"], dict(zip(names, session.run(names, {})))
    )
    used: dict[str, set[str]] = {}
    for data in (generator, compute):
        for domain, ops in _ort_ops(data).items():
            used.setdefault(domain, set()).update(ops)
    assert used == listed
    assert "DynamicQuantizeMatMul" not in listed.get("com.microsoft", set())  # no RAM-int8 graph in ORT format
    assert rt.fill_mask(SENTENCES[:1], top_k=1)[0][0][0]["token"]


@pytest.mark.parametrize("name", [ORT_GENERATOR, ORT_COMPUTE])
def test_corrupted_ort_file_is_refused(mlm, tmp_path, name):
    _, _, ort_dir = mlm
    copy = tmp_path / "art"
    shutil.copytree(ort_dir, copy)
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as e:
        verify_artifact(copy)
    assert name in str(e.value) and "\n" not in str(e.value)


def _swap_two_holes(manifest: dict) -> None:
    """Two holes of the same size exchange their generator outputs: every size still fits."""
    holes = manifest["ort"]["holes"]
    a, b = next((a, b) for i, a in enumerate(holes) for b in holes[i + 1 :] if a["bytes"] == b["bytes"])
    a["output"], b["output"] = b["output"], a["output"]


@pytest.mark.parametrize(
    "change, field",
    [
        (_swap_two_holes, "does not match ort.compute_sha256"),
        (lambda m: m["ort"].pop("compute_sha256"), "compute_sha256"),
        (lambda m: m.update(format_version=1), "format_version"),
        (lambda m: m.update(model_format="tflite"), "model_format"),
        (lambda m: m["ort"].update(generator=None), "ort"),
        (lambda m: m["ort"]["holes"].reverse(), "ort"),
        (lambda m: m.update(format_version=3), "format_version"),
    ],
)
def test_bad_ort_manifest_is_refused(mlm, tmp_path, change, field):
    _, _, ort_dir = mlm
    copy = tmp_path / "art"
    shutil.copytree(ort_dir, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    change(manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=field):
        Runtime(copy)


def test_ram_int8_is_refused_clearly(mlm):
    with pytest.raises(ValueError, match="ORT-format"):
        Runtime(mlm[2], ram="int8")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--format", "ORT"], "--format must be one of onnx, ort, web, got 'ORT'"),
        (["--format", "ort "], "--format must be one of"),
        (["--format", "ort-format"], "--format must be one of"),
        (["--format", ""], "--format must be one of"),
        (["--format", "tflite"], "--format must be one of"),
        (["--format", "ort", "--weights", "materialized"], "needs --weights compact"),
        (["--format", "ort", "--quantize", "int8-dynamic"], "needs --weights compact"),
    ],
)
def test_format_typos_are_one_line_exit_2(mlm, tmp_path, capsys, argv, fragment):
    model_dir = mlm[0]
    out = tmp_path / "never"
    assert main(["export", "--model", str(model_dir), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
    assert not out.exists()


def test_predict_runs_unchanged(mlm, tmp_path, capsys):
    texts = tmp_path / "in.txt"
    texts.write_text("\n".join(SENTENCES[:2]) + "\n")
    assert main(["predict", str(mlm[2]), "--input", str(texts), "--top-k", "2"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert len(lines) == 2 and lines[0]["result"][0][0]["token"]
