"""The torch-free device runtime on artifacts written by the real exporter from tiny models."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import ArtifactError, Runtime, quantize_per_channel
from sharebert_runtime.artifact import INT8_WEIGHT_MAX

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=16, runs=3, progress=False)  # a short parity check and footprint timing
SENTENCES = [
    "the capital of france is [MASK].",
    "he went to the [MASK] to buy some bread.",
    "",
    "a [MASK] movie , and a [MASK] one .",
    "it 's a charming and often affecting journey .",
]

# Importing any of these raises in the device subprocess (onnx too: a device has only onnxruntime).
BLOCK_IMPORTS = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "optimum", "onnx"}:
            raise ImportError(f"{name} is not installed on the device (blocked by the test)")
sys.meta_path.insert(0, _Block())
"""


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """(model folder, fill-mask artifact) for a tiny ShareBERT (VEPS)."""
    root = tmp_path_factory.mktemp("mlm")
    build_model("sharebert-tiny", root / "model", TINY, seed=0)
    export_model(root / "model", root / "artifact", task="fill-mask", weights="compact", quantize="none", **QUICK)
    return root / "model", root / "artifact"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(model folder, text-classification artifact) with three named labels."""
    return _classifier(tmp_path_factory.mktemp("cls"))


def _classifier(root, **overrides):
    from sharebert import ShareBertForSequenceClassification
    from sharebert.formats.build import config_for_vocab
    from sharebert.formats.paths import default_vocab
    from sharebert.formats.tokenization import hf_tokenizer

    tokenizer = hf_tokenizer(default_vocab())
    config = config_for_vocab(
        "sharebert-tiny",
        {
            **TINY,
            "num_labels": 3,
            "id2label": {0: "neg", 1: "neu", 2: "pos"},
            "label2id": {"neg": 0, "neu": 1, "pos": 2},
            **overrides,
        },
        len(tokenizer),
    )
    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(config)
    with torch.no_grad():  # a classifier head large enough that the three probabilities differ visibly
        model.classifier.weight.normal_(0, 1.0)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    export_model(root / "model", root / "artifact", task="text-classification", **QUICK)
    return root / "model", root / "artifact"


def _torch_logits(model_dir, texts, head="mlm"):
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

    cls = AutoModelForMaskedLM if head == "mlm" else AutoModelForSequenceClassification
    model = cls.from_pretrained(model_dir).eval()
    enc = AutoTokenizer.from_pretrained(model_dir)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.numpy(), enc["input_ids"].numpy()


def test_device_subprocess_without_torch_matches_pytorch(mlm):
    """Import hook blocks torch/transformers/optimum/onnx; the runtime and the CLI still work end to end."""
    model_dir, artifact = mlm
    script = (
        BLOCK_IMPORTS
        + f"""
import json
import sharebert_runtime
from sharebert_runtime import Runtime
from sharebert_runtime.main import main
assert not any(m.split(".")[0] in ("torch", "transformers", "optimum", "onnx") for m in sys.modules)
texts = {SENTENCES!r}
out = {{mode: Runtime({str(artifact)!r}, threads=1, ram=mode).fill_mask(texts, top_k=3) for mode in ("fp32", "int8")}}
rc = main(["predict", {str(artifact)!r}, *texts, "--json", "--top-k", "3"])
print("RESULT " + json.dumps(out))
"""
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    out = json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])
    cli = [json.loads(line) for line in lines if line.startswith('{"line"')]
    assert [r["result"] for r in cli] == out["fp32"]

    logits, ids = _torch_logits(model_dir, SENTENCES)
    mask_id = json.loads((artifact / "manifest.json").read_text())["special_tokens"]["mask"]
    for row, answers in enumerate(out["fp32"]):
        positions = np.flatnonzero(ids[row] == mask_id)
        assert len(answers) == len(positions)
        for pos, candidates in zip(positions, answers):
            probs = torch.softmax(torch.from_numpy(logits[row, pos]), -1).numpy()
            assert [c["token_id"] for c in candidates] == list(np.argsort(-probs)[:3])
            np.testing.assert_allclose([c["score"] for c in candidates], np.sort(probs)[::-1][:3], rtol=1e-3)
    assert out["fp32"][2] == [] and out["int8"][2] == []  # the empty string: no [MASK], no answers


def test_tampered_or_truncated_model_is_refused(mlm, tmp_path):
    _, artifact = mlm
    bad = tmp_path / "bad"
    shutil.copytree(artifact, bad)
    data = bytearray((bad / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (bad / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model\.onnx.*sha256"):
        Runtime(bad)
    (bad / "model.onnx").write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ArtifactError, match=r"model\.onnx has \d+ bytes"):
        Runtime(bad)
    (bad / "model.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"model\.onnx is missing"):
        Runtime(bad)


def test_truncation_is_counted_and_keeps_sep(mlm):
    _, artifact = mlm
    rt = Runtime(artifact, threads=1)
    long = "word " * 300 + "[MASK]"
    texts = ["short [MASK] text", long, "also [MASK]", long.replace("[MASK]", "x")]
    ids, mask, cut = rt._encode(texts)
    assert cut == 2 and ids.shape == (4, rt.max_length)
    sep = rt.manifest["special_tokens"]["sep"]
    assert ids[1, -1] == sep and ids[3, -1] == sep and mask[0].sum() < rt.max_length
    preds = rt.fill_mask(texts, top_k=2)
    assert preds.truncated == 2
    assert len(preds) == 4 and len(preds[0]) == 1 and preds[1] == []  # the [MASK] past 128 tokens was cut


def test_the_python_api_refuses_a_lone_surrogate_and_absurd_threads_as_the_cli_does(mlm):
    """``Runtime(...).fill_mask(["\\ud800"])``: one ValueError naming the text and the cause (the tokenizers
    library raised a bare TypeError); ``threads=10**9``: refused before loading (ORT's std::bad_alloc named a graph)."""
    _, artifact = mlm
    rt = Runtime(artifact, threads=1)
    with pytest.raises(ValueError, match=r"text 1 is not valid Unicode \(a lone surrogate"):
        rt.fill_mask(["fine [MASK]", "a \ud800 [MASK]"])
    assert len(rt.fill_mask(["caf\u00e9 [MASK] \U0001f600"])[0]) == 1  # any real character is taken
    for threads in (10**9, 0, True, 2.0):
        with pytest.raises(ValueError, match=r"threads must be an integer in 1\.\.1024"):
            Runtime(artifact, threads=threads)


def test_padding_does_not_change_answers(mlm):
    _, artifact = mlm
    rt = Runtime(artifact, threads=1, batch_size=2)
    alone = [rt.fill_mask([t], top_k=4)[0] for t in SENTENCES]
    batched = rt.fill_mask(SENTENCES, top_k=4)  # batches of 2, padded to the longest
    for a, b in zip(alone, batched):
        assert [[c["token_id"] for c in m] for m in a] == [[c["token_id"] for c in m] for m in b]
        np.testing.assert_allclose([c["score"] for m in a for c in m], [c["score"] for m in b for c in m], rtol=1e-4)


def test_ram_int8_generates_quantized_weights_close_to_fp32(mlm):
    _, artifact = mlm
    manifest = json.loads((artifact / "manifest.json").read_text())
    ram = manifest["ram_int8"]
    fp32, int8 = Runtime(artifact, threads=1), Runtime(artifact, threads=1, ram="int8")
    arrays = {n: v.numpy() for n, v in int8._int8_inputs.items()}
    weights = [arrays[w["int8"]] for w in ram["weights"]]
    assert all(a.dtype == np.int8 for a in weights)
    assert sum(a.size for a in weights) == ram["generated_numel"]
    # The extra graphs reference model.onnx's bytes: together they are a few percent of it.
    extra = sum((artifact / ram[k]).stat().st_size for k in ("generator", "compute"))
    assert extra < 0.1 * (artifact / "model.onnx").stat().st_size
    ids, mask, _ = fp32._encode(SENTENCES)
    a, b = fp32._run(ids, mask)["logits"], int8._run(ids, mask)["logits"]
    real = mask.astype(bool)
    cosine = (a[real] * b[real]).sum(-1) / np.linalg.norm(a[real], axis=-1) / np.linalg.norm(b[real], axis=-1)
    assert cosine.min() > 0.99


def test_quantize_per_channel_error_is_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(48, 20)).astype(np.float32)
    w[:, 3] = 0.0  # an all-zero channel keeps scale 1 and quantizes to zeros
    for layout, given in (("kn", w.copy()), ("nk", w.T.copy())):
        q, scale = quantize_per_channel(given, layout)
        assert q.shape == (48, 20) and q.dtype == np.int8 and scale.shape == (20,)
        assert np.abs(q.astype(int)).max() == INT8_WEIGHT_MAX and not q[:, 3].any()  # 7-bit: no CPU saturates
        assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-6)


def test_classify_matches_pytorch_and_accepts_empty(classifier):
    model_dir, artifact = classifier
    texts = ["a charming movie", "", "dull and tedious " * 100]
    rt = Runtime(artifact, threads=1)
    preds = rt.classify(texts)
    assert preds.truncated == 1
    logits, _ = _torch_logits(model_dir, texts[:2], head="cls")
    probs = torch.softmax(torch.from_numpy(logits), -1).numpy()
    for p, ref in zip(preds[:2], probs):
        assert list(p["scores"]) == ["neg", "neu", "pos"]
        np.testing.assert_allclose(list(p["scores"].values()), ref, atol=1e-5)
        assert p["label"] == ["neg", "neu", "pos"][int(ref.argmax())]
    with pytest.raises(ValueError, match="task is 'text-classification'"):
        rt.fill_mask(texts)


def test_a_mean_pooling_classifier_artifact_matches_pytorch_on_padded_batches(tmp_path):
    """`classifier_pooling="mean"` is in the exported graph: one batch of sentences of different lengths (padded
    by the runtime) gives PyTorch's probabilities, each sentence as it gives alone."""
    model_dir, artifact = _classifier(tmp_path, classifier_pooling="mean", pooler="none")
    texts = ["a charming movie", "dull , tedious and far too long for what it has to say", "fine"]
    batch = Runtime(artifact, threads=1).classify(texts)
    for i, text in enumerate(texts):
        logits, _ = _torch_logits(model_dir, [text], head="cls")
        ref = torch.softmax(torch.from_numpy(logits), -1).numpy()[0]
        assert np.abs(np.array(list(batch[i]["scores"].values())) - ref).max() <= 1e-5  # NaN fails


def test_concurrent_threads_get_the_sequential_answers(classifier):
    _, artifact = classifier
    rt = Runtime(artifact, threads=1, ram="int8")
    texts = [f"sentence number {i} is {'good ' * (i % 7)}" for i in range(24)]
    # Dynamic int8 quantizes each batch's activations with one scale, so compare like batches.
    expected = {k: rt.classify(texts[k::6]) for k in range(6)}
    results, errors = {}, []

    def work(k):
        try:
            results[k] = rt.classify(texts[k::6])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(6):
        assert results[k] == expected[k]


def test_predict_cli_streams_and_reports_malformed_lines(mlm, tmp_path, capsys):
    from sharebert_runtime.main import main

    _, artifact = mlm
    lines = [
        b"the [MASK] is red .",
        b'{"text": "a [MASK] day", "id": 7}',
        b"{not json",
        b"\xff\xfe broken",
        b"",
        b'{"txt": "x"}',
        b"last [MASK] line",
    ]
    src = tmp_path / "in.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    # exit status 1: a line was skipped (the others are answered all the same)
    assert (
        main(["predict", str(artifact), "--input", str(src), "--output", str(out), "--batch-size", "2", "--top-k", "1"])
        == 1
    )
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 5, 6, 7]  # lines 3 and 6 start with "{" but are text
    assert records[1]["id"] == 7 and records[3]["result"] == [] and len(records[0]["result"][0]) == 1
    assert records[2]["text"] == "{not json" and records[4]["text"] == '{"txt": "x"}'
    err = capsys.readouterr().err
    assert "line 4:" in err and "1 line(s) skipped" in err and not (tmp_path / "out.jsonl.partial").exists()
    assert main(["predict", str(artifact)]) == 2  # no texts, no --input: a clear error


@pytest.mark.parametrize(
    "p, text",
    [(0.6123, "0.612"), (0.1, "0.100"), (0.0421, "0.0421"), (0.00123, "0.00123"), (3.2e-05, "3.2e-05"), (0.0, "0")],
)
def test_predict_prints_small_probabilities_readably(p, text):
    from sharebert_runtime.cli import _score

    assert _score(p) == text


def test_probe_measures_an_artifact_in_a_fresh_process_without_torch(classifier, tmp_path):
    """compress's report figures: finite, positive, from a process where torch cannot be imported; a bad
    argument or artifact is one line and exit 2."""
    import math
    import time

    run_probe = BLOCK_IMPORTS + "import runpy, sys; runpy.run_module('sharebert_runtime.probe', run_name='__main__')"

    def probe(*args):
        return subprocess.run(
            [sys.executable, "-c", run_probe, *map(str, args)], capture_output=True, text=True, timeout=300
        )

    proc = probe(classifier[1], 2, time.time())
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert set(figures) == {"peak_rss_bytes", "added_rss_bytes", "first_answer_ms", "p50_ms_16", "p50_ms_128"}
    assert all(math.isfinite(v) and v > 0 for v in figures.values()), figures
    for bad in [(), (classifier[1], 0, 0), (classifier[1], 2, "nan"), (tmp_path / "missing", 2, 0)]:
        proc = probe(*bad)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.parametrize(
    "runs, started", [("1", "1e308"), ("1", "-1e308"), ("1", "-5"), ("1", "4e9"), ("1000000000", "1")]
)
def test_probe_refuses_a_start_time_not_in_the_past_or_endless_runs(runs, started, capsys):
    """A STARTED after now or before the epoch would make first_answer_ms negative, absurd or inf (a traceback from
    the strict JSON); a billion RUNS would not end: each is the usage line and exit 2, before any artifact is read."""
    from sharebert_runtime.probe import main

    assert main(["no-such-artifact", runs, started]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: usage:") and len(err.splitlines()) == 1
