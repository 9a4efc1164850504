"""Export: compact vs materialized storage, quantized variants, ORT folding, parity, ORTModel loading,
the artifact contract and bad input. Tiny models with perturbed (trained-like) weights."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import sharebert
from sharebert.accounting.counts import count_flops
from sharebert.export import graph
from sharebert.export.exporter import ParityError, check_folding, export_model, session_options
from sharebert.export.parity import THRESHOLDS
from sharebert.formats.paths import data_path, default_vocab
from sharebert.formats.tokenization import hf_tokenizer
from sharebert_runtime.artifact import INT8_WEIGHT_MAX
from sharebert_runtime.main import main

SST2_DEV = data_path("glue", "SST-2", "dev.tsv")
SST2_TRAIN = data_path("glue", "SST-2", "train.tsv")
TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=32)
FAST = dict(check_limit=48, runs=3, progress=False)
SMALL_VOCAB = 3000  # [PAD] .. [MASK], [unusedN], the characters, then "the", "of", ...: SST-2 reads with some [UNK]


def _save(model, tokenizer, folder: Path) -> Path:
    torch.manual_seed(1)
    with torch.no_grad():  # trained-like weights: no zero biases or unit gains that exporters dedup
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    tok = hf_tokenizer(default_vocab())
    tok.model_max_length = 128
    return tok


def _config(tokenizer, **kw):
    return sharebert.ShareBertConfig.from_preset(
        "sharebert-tiny",
        vocab_size=sharebert.model.configuration_sharebert.pad_vocab_size(len(tokenizer)),
        **TINY,
        **kw,
    )


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """BERT's first SMALL_VOCAB WordPiece entries (the special tokens, every character, the commonest words): an
    export's CPU grows with the head's width (parity over 48 sentences' logits, the RAM-int8 measure, the stored
    reference), and what the tests on ``mlm_dir`` and ``clf_dir`` check (the command line's refusals and
    overwrites, bad input, a killed export's leftovers, the classifier and feature-extraction exports) does not."""
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(default_vocab().read_text(encoding="utf-8").splitlines()[:SMALL_VOCAB]) + "\n")
    tok = hf_tokenizer(vocab)
    tok.model_max_length = 128
    return tok


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, small_tokenizer):
    torch.manual_seed(0)
    model = sharebert.ShareBertForMaskedLM(_config(small_tokenizer))
    return _save(model, small_tokenizer, tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def full_vocab_mlm_dir(tmp_path_factory, tokenizer):
    """The tiny model over BERT's whole vocabulary: the file-size ratios (the embedding table outweighs the graph's
    own bytes, as in a real model) and int8-dynamic's and int8-static's parity against its thresholds on the head a
    real vocabulary gives (near-ties among 30,522 logits)."""
    torch.manual_seed(0)
    return _save(sharebert.ShareBertForMaskedLM(_config(tokenizer)), tokenizer, tmp_path_factory.mktemp("mlm-full"))


@pytest.fixture(scope="module")
def clf_dir(tmp_path_factory, small_tokenizer):
    torch.manual_seed(0)
    config = _config(
        small_tokenizer,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    return _save(sharebert.ShareBertForSequenceClassification(config), small_tokenizer, tmp_path_factory.mktemp("clf"))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, full_vocab_mlm_dir):
    """compact / materialized / int8 / fp16 fill-mask artifacts of the same model."""
    root = tmp_path_factory.mktemp("artifacts")
    out = {}
    for weights, quantize in (("compact", "none"), ("materialized", "none"), ("compact", "int8"), ("compact", "fp16")):
        name = f"{weights}-{quantize}"
        out[name] = (
            root / name,
            export_model(full_vocab_mlm_dir, root / name, weights=weights, quantize=quantize, **FAST),
        )
    return out


def _sentences(n=16):
    lines = SST2_DEV.read_text(encoding="utf-8").splitlines()[1 : n + 1]
    return [line.split("\t")[0] for line in lines]


def test_compact_stores_exactly_the_learned_tensors(artifacts, full_vocab_mlm_dir):
    folder, manifest = artifacts["compact-none"]
    model = onnx.load(str(folder / "model.onnx"))
    learned = sharebert.ShareBertForMaskedLM.from_pretrained(full_vocab_mlm_dir).num_parameters()
    assert manifest["learned_params"] == learned
    stored = graph.stored_tensors(model, min_numel=2)
    assert stored["float32"]["numel"] == learned  # no generated, transposed or duplicated copy
    assert (folder / "model.onnx").stat().st_size <= 1.02 * 4 * learned
    # the one overridable initializer is the optional depth (default: every layer); nothing else stays unfolded
    assert {i.name for i in model.graph.input} & {t.name for t in model.graph.initializer} == {"depth"}
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask", "token_type_ids", "depth"]
    assert manifest["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    folding = manifest["footprint"]["folding"]
    assert folding["computed_weights"] > 0 and folding["unfolded"] == [] and manifest["footprint"]["folded"]


def test_materialized_adds_the_generated_weights(artifacts, full_vocab_mlm_dir):
    _, compact = artifacts["compact-none"]
    folder, manifest = artifacts["materialized-none"]
    config = sharebert.ShareBertConfig.from_pretrained(full_vocab_mlm_dir)
    generated = sum(o * i for name, (o, i) in config.generated_targets() if name != "pooler")  # MLM: no pooler
    F, V = config.word_embedding_size, config.hidden_size
    stored = graph.stored_tensors(onnx.load(str(folder / "model.onnx")), 2)["float32"]["numel"]
    # The generator's own tensors (projection P: F x V, bias p: V) are not needed after folding.
    assert stored == compact["learned_params"] + generated - F * V - V
    assert manifest["footprint"]["folding"]["computed_weights"] < compact["footprint"]["folding"]["computed_weights"]
    feeds = _feeds(folder)
    a = ort.InferenceSession(str(folder / "model.onnx")).run(None, feeds)[0]
    b = ort.InferenceSession(str(artifacts["compact-none"][0] / "model.onnx")).run(None, feeds)[0]
    np.testing.assert_allclose(a, b, atol=1e-5)


def _feeds(folder, n=8):
    tok = hf_tokenizer(folder / "vocab.txt") if (folder / "vocab.txt").exists() else None
    from transformers import AutoTokenizer

    tok = tok or AutoTokenizer.from_pretrained(folder)
    enc = tok(_sentences(n), padding=True, return_tensors="np")
    return {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}


def test_parity_figures_in_manifest(artifacts):
    _, manifest = artifacts["compact-none"]
    p = manifest["parity"]
    assert p["sentences"] == 48 and p["max_abs_diff"] <= 1e-3 and p["cosine_min"] > 0.99999
    assert p["top1_agreement"] == 1.0
    q = artifacts["compact-int8"][1]["parity"]
    assert q["max_abs_diff"] > p["max_abs_diff"] and q["cosine_min"] > 0.99


def test_int8_quarter_file_folds_only_with_qdq_disabled(artifacts, tmp_path):
    fp32 = (artifacts["compact-none"][0] / "model.onnx").stat().st_size
    folder, manifest = artifacts["compact-int8"]
    path = folder / "model.onnx"
    assert path.stat().st_size <= 0.30 * fp32
    assert manifest["session_config"] == {"session.disable_quant_qdq": "1"}
    assert manifest["footprint"]["folded"]
    without = check_folding(path, {}, tmp_path)  # ORT keeps DequantizeLinear: weights recomputed every run
    assert not without["folded"] and without["unfolded"]
    dtypes = manifest["tensor_dtypes"]
    assert "int8" in dtypes["stored"] and dtypes["ops"]["DequantizeLinear"] == len(dtypes["stored"]["int8"])
    assert dtypes["computed_fp32_weights"]  # generated weights: computed in fp32 at load, reported


def test_fp16_half_file(artifacts):
    fp32 = (artifacts["compact-none"][0] / "model.onnx").stat().st_size
    folder, manifest = artifacts["compact-fp16"]
    assert (folder / "model.onnx").stat().st_size <= 0.52 * fp32
    assert "float16" in manifest["tensor_dtypes"]["stored"] and manifest["footprint"]["folded"]
    assert manifest["parity"]["max_abs_diff"] < 1e-2 and manifest["parity"]["top1_agreement"] >= 0.95


def test_manifest_contract(artifacts):
    folder, manifest = artifacts["compact-none"]
    on_disk = json.loads((folder / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(manifest))
    assert manifest["format"] == "sharebert-onnx" and manifest["format_version"] == 1
    assert manifest["task"] == "fill-mask" and manifest["labels"] is None and manifest["max_length"] == 128
    assert manifest["outputs"] == ["logits"] and manifest["opset"] == 17 and manifest["weights"] == "compact"
    assert set(manifest["special_tokens"]) == {"pad", "mask", "cls", "sep", "unk"}
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    assert files == set(manifest["files"]) and {"model.onnx", "config.json", "tokenizer.json"} <= files
    for name, meta in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert meta == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    for key in ("sharebert", "torch", "transformers", "onnx", "onnxruntime", "tokenizers"):
        assert key in manifest["versions"]
    f = manifest["footprint"]
    assert f["file_bytes"] == manifest["files"]["model.onnx"]["bytes"]
    assert f["peak_rss_run_mb"] >= f["peak_rss_load_mb"] >= f["rss_baseline_mb"] > 0
    assert f["latency"]["1x128"]["p95_ms"] >= f["latency"]["1x128"]["p50_ms"] > 0
    config = json.loads(
        (folder / "config.json").read_text()
    )  # the fill-mask model's FLOPs, as `sharebert report --head mlm`
    assert (
        f["gflops"] == pytest.approx(count_flops(config, "mlm", 128, 1)["inference"] / 1e9)
        and f["gflops_shape"] == "1x128"
    )
    assert not list(folder.parent.glob(".*tmp-*"))


def test_an_export_sweeps_what_a_killed_export_left_and_nothing_else(tmp_path, mlm_dir):
    """kill -9 midway leaves ``.NAME.tmp-PID-XXXXXXXX`` (and, between the two renames, ``.NAME.old-PID``) beside
    the artifact: the next export into it removes those of dead processes; never a live one's, a user's folder of
    a like name, a link (or its target), another artifact's, nor what a glob character in NAME would match."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = dead.pid
    for name in ("art", "a?"):
        root = tmp_path / ("plain" if name == "art" else "glob")
        root.mkdir()
        left = [root / f".{name}.tmp-{d}-x1abc_9z", root / f".{name}.old-{d}"]
        kept = [
            root / f".{name}.tmp-{os.getpid()}-x2abcdef",
            root / f".other.tmp-{d}-x3abcdef",
            root / f".{name}.tmp-{d}-notes",
            root / f".{name}.old-{d}-backup",
            root / f".{name}.old-2024-01-05",
            root / f".{name}x.old-{d}",
            root / ".ab.old-99991",
            root / "target",
        ]
        for folder in left + kept:
            folder.mkdir()
            (folder / "model.onnx").write_bytes(b"half")
        link = root / f".{name}.tmp-{d}-linkabcd"
        link.symlink_to(root / "target")
        export_model(mlm_dir, root / name, **FAST)
        assert not any(f.exists() for f in left) and all((f / "model.onnx").is_file() for f in kept), name
        assert link.is_symlink() and (root / name / "manifest.json").is_file()


def test_ortmodel_masked_lm_matches_torch(artifacts, full_vocab_mlm_dir, optimum_onnx):
    from optimum.onnxruntime import ORTModelForMaskedLM
    from transformers import AutoTokenizer

    ref = sharebert.ShareBertForMaskedLM.from_pretrained(full_vocab_mlm_dir).eval()
    for name in ("compact-none", "compact-int8"):
        folder = artifacts[name][0]
        ort_model = ORTModelForMaskedLM.from_pretrained(folder, session_options=session_options(folder))
        enc = AutoTokenizer.from_pretrained(folder)(_sentences(8), padding=True, return_tensors="pt")
        with torch.no_grad():
            diff = (ort_model(**enc).logits - ref(**enc).logits).abs().max().item()
        assert diff <= (1e-4 if name == "compact-none" else 0.1)


def _classifier_and_features(tmp_path, clf_dir, mlm_dir):
    """Classifier and feature-extraction artifacts, their manifests and parity checked; returns ``{name: folder}``."""
    manifest = export_model(clf_dir, tmp_path / "clf", **FAST)
    assert manifest["task"] == "text-classification" and manifest["labels"] == ["negative", "positive"]
    assert manifest["problem_type"] == "single_label_classification"
    p = manifest["parity"]
    assert p["agreement"] == 1.0 and p["accuracy_change"] == 0.0 and 0.0 <= p["accuracy_torch"] <= 1.0
    manifest = export_model(mlm_dir, tmp_path / "feat", task="feature-extraction", **FAST)
    assert (
        manifest["outputs"] == ["last_hidden_state", "sentence_embedding"]
        and manifest["parity"]["max_abs_diff"] <= 1e-3
    )
    assert (manifest["embedding"]["pooling"], manifest["embedding"]["normalize"]) == ("cls", False)  # no recipe files
    assert "no sentence-transformers files" in manifest["embedding"]["source"]
    return {"clf": tmp_path / "clf", "feat": tmp_path / "feat"}


def test_classifier_and_features_export(tmp_path, clf_dir, mlm_dir):
    from sharebert_runtime import Runtime

    for folder in _classifier_and_features(tmp_path, clf_dir, mlm_dir).values():
        assert Runtime(folder, threads=1).verify()["passed"]  # each carries its own check (`sharebert verify`)


def test_classifier_and_features_load_in_ortmodel(tmp_path, clf_dir, mlm_dir, optimum_onnx):
    """optimum's ONNX Runtime classes (the ``optimum`` extra) load the classifier and feature-extraction artifacts
    and give PyTorch's outputs."""
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTModelForSequenceClassification
    from transformers import AutoTokenizer

    folders = _classifier_and_features(tmp_path, clf_dir, mlm_dir)
    enc = AutoTokenizer.from_pretrained(folders["clf"])(_sentences(8), padding=True, return_tensors="pt")
    ref = sharebert.ShareBertForSequenceClassification.from_pretrained(clf_dir).eval()
    with torch.no_grad():
        got = ORTModelForSequenceClassification.from_pretrained(folders["clf"])(**enc).logits
        torch.testing.assert_close(got, ref(**enc).logits, atol=1e-4, rtol=0)
    ref = sharebert.ShareBertModel.from_pretrained(mlm_dir).eval()
    with torch.no_grad():
        got = ORTModelForFeatureExtraction.from_pretrained(folders["feat"])(**enc).last_hidden_state
        torch.testing.assert_close(got, ref(**enc).last_hidden_state, atol=1e-4, rtol=0)


def test_parity_accuracy_matches_the_labels_in_file_order(tmp_path, tokenizer):
    """Parity runs length-sorted batches; its accuracy must still pair each prediction with its own label."""
    torch.manual_seed(0)
    model = sharebert.ShareBertForSequenceClassification(_config(tokenizer, num_labels=2)).eval()
    with torch.no_grad():
        model.sharebert.embeddings.word_embeddings.weight.normal_(0.0, 1.0)  # predictions that vary by sentence
    folder = _save(model, tokenizer, tmp_path / "model")
    p = export_model(folder, tmp_path / "artifact", **FAST)["parity"]
    model = sharebert.ShareBertForSequenceClassification.from_pretrained(folder).eval()
    rows = [line.split("\t") for line in SST2_DEV.read_text(encoding="utf-8").splitlines()[1 : p["sentences"] + 1]]
    with torch.no_grad():
        preds = [model(**tokenizer(text, return_tensors="pt")).logits.argmax(-1).item() for text, _ in rows]
    assert 0 < sum(preds) < len(preds)  # else any pairing would give the same accuracy
    assert p["accuracy_torch"] == pytest.approx(sum(int(label) == y for (_, label), y in zip(rows, preds)) / len(rows))


def test_int8_dynamic_and_static_quantize_every_weight(tmp_path, full_vocab_mlm_dir):
    for quantize, extra in (("int8-dynamic", {}), ("int8-static", {"calibration": SST2_TRAIN})):
        manifest = export_model(full_vocab_mlm_dir, tmp_path / quantize, quantize=quantize, **extra, **FAST)
        dtypes = manifest["tensor_dtypes"]
        assert manifest["weights"] == "materialized" and manifest["session_config"] == {}
        assert dtypes["computed_fp32_weights"] == []  # nothing skipped by the quantizer
        assert "ram_int8" not in manifest
        if quantize == "int8-dynamic":
            assert dtypes["ops"]["MatMulInteger"] > 0
        else:
            assert dtypes["ops"]["QuantizeLinear"] > 0
            # the logits stay fp32: uint8 logits hold at most 256 values, so a trained model's top
            # candidates tied and argmax answered the lowest token id
            rt = ort.InferenceSession(str(tmp_path / quantize / "model.onnx"), providers=["CPUExecutionProvider"])
            tok = hf_tokenizer(default_vocab())
            enc = tok(["the capital of france is [MASK] ."], return_tensors="np")
            logits = rt.run(
                ["logits"],
                {
                    k: enc[k].astype(np.int64)
                    for k in ("input_ids", "attention_mask", "token_type_ids")
                    if k in {i.name for i in rt.get_inputs()}
                },
            )[0][0, 6]
            assert len(np.unique(logits)) > 256 and (logits == logits.max()).sum() == 1
        assert manifest["parity"]["cosine_mean"] > 0.95
        assert manifest["parity"]["below_thresholds"] == [] and manifest["parity"]["thresholds"]["top1"] > 0
        weights = [
            numpy_helper.to_array(t)
            for t in onnx.load(str(tmp_path / quantize / "model.onnx")).graph.initializer
            if t.data_type == onnx.TensorProto.INT8 and np.prod(t.dims) >= 256
        ]
        # 7-bit weights: no CPU's int8 kernel can saturate (tests/deploy/test_int8_every_cpu.py)
        assert weights and max(np.abs(w.astype(int)).max() for w in weights) <= INT8_WEIGHT_MAX


def test_causal_lm_export(tmp_path, small_tokenizer):
    tokenizer = small_tokenizer  # the next-token logits at every position: their width is the export's cost
    torch.manual_seed(0)
    config = sharebert.ShareBertConfig.from_preset(
        "charlm-tiny",
        vocab_size=sharebert.model.configuration_sharebert.pad_vocab_size(len(tokenizer)),
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
    )
    folder = _save(sharebert.ShareBertForCausalLM(config), tokenizer, tmp_path / "clm")
    manifest = export_model(folder, tmp_path / "out", **FAST)
    assert manifest["task"] == "causal-lm" and manifest["inputs"] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *(f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")),
    ]
    assert manifest["parity"]["top1_agreement"] == 1.0 and manifest["parity"]["max_abs_diff"] <= 1e-3
    from sharebert_runtime import Runtime

    result = Runtime(tmp_path / "out", threads=1).verify()  # next-token logits at every stored position
    assert result["passed"] and result["outputs"]["logits"]["top1_agreement"] == 1.0, result


def test_bad_input_writes_nothing(tmp_path, mlm_dir, monkeypatch):
    not_model = tmp_path / "gpt"
    not_model.mkdir()
    (not_model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    out = tmp_path / "out"
    cases = [
        (dict(model_dir=tmp_path / "missing"), FileNotFoundError, "not found"),
        (dict(model_dir=not_model), ValueError, "model_type 'gpt2'"),
        (dict(task="translation"), ValueError, "unsupported task"),
        (dict(opset=11), ValueError, "unsupported opset"),
        (dict(quantize="int8-static"), ValueError, "needs --calibration"),
        (dict(quantize="int8-static", calibration=tmp_path / "nope.tsv"), FileNotFoundError, "not found"),
        (dict(quantize="int8-static", calibration=empty), ValueError, "no sentences"),
        (dict(check_file=empty), ValueError, "no sentences"),
    ]
    for kwargs, error, message in cases:
        args = {"model_dir": mlm_dir, "out_dir": out, **FAST, **kwargs}
        with pytest.raises(error, match=message):
            export_model(**args)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "gpt"]
    # An fp32 export over the parity tolerance fails loudly and leaves nothing behind.
    monkeypatch.setattr("sharebert.export.parity.FP32_TOLERANCE", -1.0)
    with pytest.raises(ParityError, match="differs from PyTorch"):
        export_model(mlm_dir, out, **FAST)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "gpt"]


def test_cli_refuses_existing_output_unless_overwrite(tmp_path, mlm_dir, capsys, monkeypatch):
    out = tmp_path / "art"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    argv = ["export", "--model", str(mlm_dir), "--out", str(out), "--check-limit", "16"]
    assert main(argv + ["--overwrite"]) == 2  # a folder that is not an artifact is never replaced
    assert "not a sharebert artifact" in capsys.readouterr().err and (out / "keep.txt").read_text() == "old"
    (out / "keep.txt").unlink()
    assert main(argv) == 0  # an empty folder is taken
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(argv + ["--overwrite", "--quantize", "int8"]) == 0
    printed = capsys.readouterr().out
    assert "folded at load  yes" in printed and "parity" in printed
    assert json.loads((out / "manifest.json").read_text())["quantization"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]

    # A quantized export below its mode's parity thresholds fails in one line, publishes nothing and
    # leaves the existing artifact as it was; --allow-low-parity publishes it, with the shortfall recorded.
    # The table is raised past reach: the real figures are the same, only what they are held to changes.
    before = (out / "manifest.json").read_bytes()
    monkeypatch.setitem(THRESHOLDS, "fp16", {"top1": 1.5, "cosine": 0.999})
    assert main(argv + ["--overwrite", "--quantize", "fp16"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # beside the progress lines
    assert len(err) == 1 and "falls below its parity thresholds" in err[0] and "top1_agreement 1 < 1.5" in err[0], err
    err = err[0]
    assert "--allow-low-parity" in err and (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    assert main(argv + ["--overwrite", "--quantize", "fp16", "--allow-low-parity"]) == 0
    assert "LOW PARITY" in capsys.readouterr().out
    parity = json.loads((out / "manifest.json").read_text())["parity"]
    assert parity["below_thresholds"] and parity["below_thresholds"][0].startswith("top1_agreement")
