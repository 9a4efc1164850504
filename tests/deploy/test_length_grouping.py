"""Length-aware batching: ``Runtime`` orders a request's texts by token length into ONNX Runtime calls,
each padded to its own longest row, and answers in input order, exactly as calls in input order do."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from sharebert import ShareBertForSequenceClassification
from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert_runtime import Runtime

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=8, runs=1, progress=False)
TASKS = {"fill-mask": "model", "feature-extraction": "model", "text-classification": "cls"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """task -> artifact folder: a tiny ShareBERT exported as fill-mask, feature-extraction and a 2-label classifier."""
    root = tmp_path_factory.mktemp("grouping")
    build_model("sharebert-tiny", root / "model", TINY, seed=0)
    ShareBertForSequenceClassification.from_pretrained(root / "model", num_labels=2).save_pretrained(root / "cls")
    for f in (root / "model").iterdir():
        if not (root / "cls" / f.name).exists():
            shutil.copy(f, root / "cls")
    for task, folder in TASKS.items():
        export_model(root / folder, root / task, task=task, weights="compact", quantize="none", **QUICK)
    return {task: root / task for task in TASKS}


@pytest.fixture(scope="module")
def mix():
    """44 texts, shuffled: the 20 shortest and 20 longest SST-2 dev sentences, 4 of them 5 times over (> 128 tokens)."""
    lines = data_path("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = sorted((line.split("\t")[0] for line in lines), key=len)
    texts = sentences[:20] + sentences[-20:] + [" ".join([s] * 5) for s in sentences[-4:]]
    random.Random(0).shuffle(texts)
    return texts


def _masked(texts):
    """Each text with its middle word replaced by [MASK]."""
    out = []
    for t in texts:
        words = t.split()
        words[len(words) // 2] = "[MASK]"
        out.append(" ".join(words))
    return out


def _numbers(task, preds):
    """Per prediction a float array (fill-mask: token ids and scores of every [MASK], none when it was cut)."""
    if task == "fill-mask":
        return [np.array([c[k] for m in p for c in m for k in ("token_id", "score")]) for p in preds]
    if task == "text-classification":
        return [np.array(list(p["scores"].values())) for p in preds]
    return list(preds)


def _assert_same(a, b):
    """Two lists of arrays equal within 1e-5, every number finite."""
    assert [x.shape for x in a] == [y.shape for y in b]
    x, y = np.concatenate(a), np.concatenate(b)
    assert np.isfinite(x).all() and np.isfinite(y).all()
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-5, equal_nan=False)


def _runtimes(artifact):
    """Two runtimes of ``artifact`` with 8 texts per call: grouped by length, and in input order."""
    grouped, plain = Runtime(artifact, threads=1, batch_size=8), Runtime(artifact, threads=1, batch_size=8)
    plain.group_by_length = False
    return grouped, plain


def _calls(rt, texts):
    """Run ``rt.predict(texts)`` recording each ONNX Runtime call's ids and mask ``(B, T)``."""
    calls, run = [], rt._run
    rt._run = lambda ids, mask, past=None: calls.append((ids, mask)) or run(ids, mask, past)
    return rt.predict(texts), calls


@pytest.mark.parametrize("task", TASKS)
def test_grouped_results_equal_input_order_results(artifacts, mix, task):
    texts = _masked(mix) if task == "fill-mask" else mix
    grouped, plain = _runtimes(artifacts[task])
    (a, calls), b = _calls(grouped, texts), plain.predict(texts)
    assert len({ids.shape[1] for ids, _ in calls}) == len(calls)  # calls of different lengths
    cut = sum(len(e.ids) > grouped.max_length for e in grouped.tokenizer.encode_batch(texts))
    assert cut == 4 and a.truncated == b.truncated == cut
    assert len(a) == len(texts)
    _assert_same(_numbers(task, a), _numbers(task, b))
    alone = [_numbers(task, plain.predict([t]))[0] for t in texts[:12]]  # each text's own answer, in input order
    _assert_same(_numbers(task, a)[:12], alone)
    if task == "feature-extraction":  # the mean over real tokens: padding must not count
        _assert_same(grouped.embed(texts, pooling="mean"), plain.embed(texts, pooling="mean"))


@pytest.mark.parametrize("budget", [2048, 200])
def test_each_call_is_padded_to_its_longest_row_and_grouping_pads_less(artifacts, mix, budget):
    grouped, plain = _runtimes(artifacts["text-classification"])
    grouped.max_batch_tokens = plain.max_batch_tokens = budget
    padded = {}
    for rt in (grouped, plain):
        preds, calls = _calls(rt, mix)
        assert sum(len(ids) for ids, _ in calls) == len(mix) and preds.truncated == 4
        for ids, mask in calls:
            assert ids.shape == mask.shape and ids.shape[1] == mask.sum(1).max()
            assert len(ids) <= 8 and (len(ids) == 1 or ids.size <= budget)
        padded[rt.group_by_length] = sum(ids.size for ids, _ in calls)
    assert padded[True] < padded[False]


def test_predict_cli_answers_chunks_in_input_order(artifacts, mix, tmp_path, monkeypatch, capsys):
    from sharebert_runtime import cli
    from sharebert_runtime.main import main

    artifact = artifacts["fill-mask"]
    texts = _masked(mix)
    (tmp_path / "in.txt").write_bytes(
        b"\n".join([t.encode() for t in texts[:20]] + [b"\xff bad"] + [t.encode() for t in texts[20:]]) + b"\n"
    )
    monkeypatch.setattr(cli, "CHUNK_LINES", 16)  # several chunks, each grouped by the runtime
    args = [
        "predict",
        str(artifact),
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out.jsonl"),
        "--batch-size",
        "4",
        "--top-k",
        "2",
    ]
    assert main(args) == 1
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == [n for n in range(1, len(texts) + 2) if n != 21]
    assert [r["text"] for r in records] == texts
    expected = Runtime(artifact, threads=1).fill_mask(texts, top_k=2)
    assert [[[c["token_id"] for c in m] for m in r["result"]] for r in records] == [
        [[c["token_id"] for c in m] for m in p] for p in expected
    ]
    err = capsys.readouterr().err
    assert "line 21: not valid UTF-8" in err and "4 input(s) cut" in err


def test_predict_cli_names_the_line_that_fails_in_a_chunk(artifacts, tmp_path, monkeypatch, capsys):
    from sharebert_runtime.main import main

    predict = Runtime.predict

    def failing(self, texts, **kwargs):  # one text the runtime cannot answer, in a chunk of ten
        if "poison" in texts:
            raise RuntimeError("cannot answer poison")
        return predict(self, texts, **kwargs)

    monkeypatch.setattr(Runtime, "predict", failing)
    texts = [f"text number {i} [MASK]" for i in range(10)]
    texts[6] = "poison"
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    args = [
        "predict",
        str(artifacts["fill-mask"]),
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out.jsonl"),
    ]
    assert main(args) == 1
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5, 6, 8, 9, 10]
    assert "line 7: cannot be answered (RuntimeError: cannot answer poison); skipped" in capsys.readouterr().err
