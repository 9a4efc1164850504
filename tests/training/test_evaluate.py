"""Metrics against hand-computed cases and scipy; word similarity/analogy counts; noise; cross-domain."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path, default_vocab
from sharebert.model.configuration_sharebert import ShareBertConfig
from sharebert.training import metrics as M
from sharebert.training.encoded import encode, label_map, mean_embedding_norm, predict_logits
from sharebert.training.evaluate import (
    cross_domain,
    embedding_matrix,
    evaluate_glue,
    load_any,
    load_finetuned,
    noise_robustness,
    read_wordsim,
    word_analogy,
    word_similarity,
)
from sharebert.training.finetune import load_classifier
from sharebert.training.glue import get_task, read_split
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
VOCAB = [t for t in default_vocab().read_text(encoding="utf-8").split("\n") if t]


# ---------------------------------------------------------------- metrics


def test_metrics_by_hand():
    p, y = [1, 0, 1, 1], [1, 1, 1, 0]  # TP 2, FN 1, FP 1, TN 0
    assert M.accuracy(p, y) == 0.5
    assert M.f1(p, y) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert M.matthews_correlation(p, y) == pytest.approx((2 * 0 - 1 * 1) / math.sqrt(3 * 3 * 1 * 1))
    assert M.matthews_correlation(y, y) == 1.0 and M.matthews_correlation([1, 1, 1], [1, 0, 1]) == 0.0
    assert M.f1([0, 0], [0, 0]) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        M.accuracy([1], [1, 0])


def test_multiclass_mcc_is_the_correlation_of_one_hot_codes():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 3, 200))
    X, Y = np.eye(3)[p], np.eye(3)[y]
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    expected = (Xc * Yc).sum() / math.sqrt((Xc * Xc).sum() * (Yc * Yc).sum())
    assert M.matthews_correlation(p, y) == pytest.approx(expected)


def test_correlations_match_scipy():
    rng = np.random.default_rng(1)
    y = rng.random(50) * 5
    p = y + rng.normal(0, 1, 50)
    assert M.pearson(p, y) == pytest.approx(np.corrcoef(p, y)[0, 1])
    ranks = lambda v: stats.rankdata(v)  # noqa: E731
    assert M.spearman(p, y) == pytest.approx(np.corrcoef(ranks(p), ranks(y))[0, 1])
    assert M.spearman(np.exp(y), y) == pytest.approx(1.0)  # monotone transform
    assert math.isnan(M.pearson(np.ones(5), y[:5]))
    assert M.task_metrics(("f1", "accuracy"), [1, 0], [1, 1]) == {"f1": pytest.approx(2 / 3), "accuracy": 0.5}


# ---------------------------------------------------------------- embeddings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    build_model("sharebert-tiny", out, TINY, seed=0)
    return out


def _expected_counts(rows, vocab: set):
    used = sum(w1.lower() in vocab and w2.lower() in vocab for w1, w2, _ in rows)
    return used, len(rows) - used


@pytest.mark.parametrize("whole_words_only", [False, True])
def test_word_similarity_counts_follow_from_the_vocab(tiny, tmp_path, whole_words_only):
    """Full BERT vocab: words outside it split into pieces (multi-token). Without ## pieces: they are [UNK]."""
    if whole_words_only:
        vocab_file = tmp_path / "vocab.txt"
        vocab_file.write_text("\n".join(t for t in VOCAB if not t.startswith("##")) + "\n")
        model_dir = tmp_path / "m"
        build_model("sharebert-tiny", model_dir, TINY, vocab=vocab_file)
    else:
        model_dir = tiny
    model, tok = load_any(model_dir)
    vocab = set(tok.get_vocab())
    result = word_similarity(model, tok, ["wordsim353", "simlex999"], multi_token="skip")
    for name, rel in (("wordsim353", "wordsim353/wordsim353.tsv"), ("simlex999", "simlex999/simlex999.txt")):
        rows = read_wordsim(data_path("wordsim", rel))
        used, skipped = _expected_counts(rows, vocab)
        r = result[name]
        assert r["pairs"] == len(rows) and r["used"] == used and 0 < skipped < len(rows)
        assert (r["skipped_oov"], r["skipped_multitoken"]) == ((skipped, 0) if whole_words_only else (0, skipped))
        # Spearman of the cosines of the (virtual) embeddings.
        emb = embedding_matrix(model).numpy()
        ok = [(w1.lower(), w2.lower(), s) for w1, w2, s in rows if w1.lower() in vocab and w2.lower() in vocab]
        ids = tok.convert_tokens_to_ids
        cos = [emb[ids(a)] @ emb[ids(b)] / np.linalg.norm(emb[ids(a)]) / np.linalg.norm(emb[ids(b)]) for a, b, _ in ok]
        assert r["spearman"] == pytest.approx(stats.spearmanr(cos, [s for *_, s in ok])[0], abs=1e-5)


def _unit(v):
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("mode", ["mean", "first"])
def test_word_similarity_scores_split_words_by_their_pieces(tiny, mode):
    """Every pair is used (the full vocab has no [UNK] here); a split word is the mean / first of its pieces' rows."""
    model, tok = load_any(tiny)
    r = word_similarity(model, tok, ["wordsim353"], multi_token=mode)["wordsim353"]
    rows = read_wordsim(data_path("wordsim", "wordsim353/wordsim353.tsv"))
    emb = embedding_matrix(model).numpy()
    pieces = {w: tok.convert_tokens_to_ids(tok.tokenize(w)) for row in rows for w in row[:2]}
    vec = {w: _unit(emb[ids].mean(0) if mode == "mean" else emb[ids[0]]) for w, ids in pieces.items()}
    split = sum(len(pieces[a]) > 1 or len(pieces[b]) > 1 for a, b, _ in rows)
    assert (r["pairs"], r["used"], r["used_multitoken"], r["skipped_oov"], r["skipped_multitoken"]) == (
        353,
        353,
        split,
        0,
        0,
    ) and split > 0
    want = stats.spearmanr([vec[a] @ vec[b] for a, b, _ in rows], [s for *_, s in rows])[0]
    assert r["spearman"] == pytest.approx(want, abs=1e-5)


def test_veps_models_are_scored_on_virtual_embeddings(tiny):
    model, _ = load_any(tiny)
    assert model.config.sharing == "veps"
    g = model.weight_generator
    A = model.embeddings.word_embeddings.weight
    expected = A @ g.projection + g.bias
    assert embedding_matrix(model).shape == (model.config.vocab_size, model.config.hidden_size)
    assert torch.allclose(embedding_matrix(model), expected.detach(), atol=1e-6)


def test_word_analogy_3cosadd(tiny, tmp_path):
    """Two crafted questions: one solvable exactly by b - a + c, one whose answer points the other way."""
    model, tok = load_any(tiny)
    ids = tok.convert_tokens_to_ids
    q1, q2 = ["king", "queen", "man", "woman"], ["paris", "france", "rome", "italy"]
    with torch.no_grad():
        A = model.embeddings.word_embeddings.weight
        A.mul_(0.01)  # every other word is short and random
        g = model.weight_generator
        g.projection.zero_()
        g.projection[:, :16] = torch.eye(16)  # virtual = [A, 0]: cosines of A
        g.bias.zero_()
        e = torch.eye(16)
        for (a, b, c, d), sign in ((q1, 1.0), (q2, -1.0)):
            off = 0 if sign > 0 else 4
            A[ids(a)], A[ids(b)], A[ids(c)] = e[off], e[off + 1], e[off + 2]
            A[ids(d)] = sign * (e[off + 1] - e[off] + e[off + 2])
    path = tmp_path / "q.txt"
    path.write_text(
        ": family\nKing Queen Man Woman\n: capitals\nParis France Rome Italy\n"
        "King Queen Man Womanhood\nzyxwvq queen man woman\n"
    )
    r = word_analogy(model, tok, path, progress=False, multi_token="skip")
    assert (r["questions"], r["used"], r["skipped_multitoken"], r["skipped_oov"]) == (4, 2, 2, 0)
    assert r["accuracy"] == 0.5 and r["sections"] == {"family": 1.0, "capitals": 0.0}


def test_word_analogy_with_split_question_words_by_hand(tiny, tmp_path):
    """a, b, c that WordPiece splits get their pieces' mean; the argmax is checked against numpy over the candidates."""
    model, tok = load_any(tiny)
    questions = [
        ("zyxwvq", "queen", "man", "woman"),
        ("paris", "quxbarland", "rome", "italy"),
        ("king", "queen", "man", "womanhood"),
    ]  # the last: d is split, so it cannot be answered
    path = tmp_path / "q.txt"
    path.write_text(": mixed\n" + "\n".join(" ".join(q) for q in questions) + "\n")
    r = word_analogy(model, tok, path, progress=False)
    assert (r["questions"], r["used"], r["used_multitoken"], r["skipped_multitoken"], r["skipped_oov"]) == (
        3,
        2,
        2,
        1,
        0,
    )
    emb = embedding_matrix(model).numpy()
    vocab = tok.get_vocab()
    special = set(tok.all_special_tokens)
    cand = np.array(
        sorted(
            i
            for t, i in vocab.items()
            if t not in special and not t.startswith("##") and not (t.startswith("[") and t.endswith("]"))
        )
    )
    cand_emb = np.stack([_unit(emb[i]) for i in cand])
    correct = []
    for q in questions[:2]:
        ids = [tok.convert_tokens_to_ids(tok.tokenize(w)) for w in q]
        a, b, c = (_unit(emb[i].mean(0)) for i in ids[:3])
        scores = cand_emb @ (b - a + c)
        for i in ids[:3]:
            if len(i) == 1:
                scores[cand == i[0]] = -np.inf
        correct.append(cand[np.argmax(scores)] == ids[3][0])
    assert r["accuracy"] == pytest.approx(np.mean(correct))


def test_word_analogy_counts_on_the_google_set(tiny, tmp_path):
    lines = data_path("analogy", "questions-words.txt").read_text().splitlines()
    subset = lines[:600]  # capital-common-countries and the start of capital-world
    path = tmp_path / "sub.txt"
    path.write_text("\n".join(subset) + "\n")
    model, tok = load_any(tiny)
    vocab = set(tok.get_vocab())
    qs = [ln.split() for ln in subset if not ln.startswith(":")]
    used = sum(all(w.lower() in vocab for w in q) for q in qs)
    r = word_analogy(model, tok, path, progress=False, multi_token="skip")
    assert (r["questions"], r["used"], r["skipped_multitoken"], r["skipped_oov"]) == (len(qs), used, len(qs) - used, 0)
    assert 0 <= r["accuracy"] <= 1


# ---------------------------------------------------------------- classifiers


def _classifier(base, task, out, seed):
    torch.manual_seed(seed)
    model = load_classifier(base, get_task(task))
    with torch.no_grad():
        model.classifier.weight.normal_(0, 2.0)  # an untrained but decisive head
    model.save_pretrained(out)
    load_any(base)[1].save_pretrained(out)
    return out


def test_noise_zero_equals_clean_and_noise_changes_predictions(tiny, tmp_path):
    clf = _classifier(tiny, "sst2", tmp_path / "sst2", 0)
    clean = evaluate_glue(clf, "sst2", max_eval_samples=160, progress=False)
    result = noise_robustness(clf, "sst2", levels=(0.0, 0.4, 1.0), max_eval_samples=160, progress=False)
    rows = {r["level"]: r["accuracy"] for r in result["rows"]}
    assert rows[0.0] == clean["accuracy"] and result["eval_samples"] == 160 and result["mean_norm"] > 0
    # The same seeded draws scaled by the level: larger noise moves the logits further.
    model, tok = load_finetuned(clf)
    ds = encode(read_split("sst2", data_path("glue", "SST-2"), "dev").head(64), tok, 128, progress=False)
    norm = mean_embedding_norm(model, ds)
    base = predict_logits(model, ds, progress=False)
    moved = [
        np.abs(predict_logits(model, ds, noise=x, mean_norm=norm, progress=False) - base).mean() for x in (0.1, 0.4)
    ]
    assert 0 < moved[0] < moved[1]
    with pytest.raises(ValueError, match="outside 0..1"):
        noise_robustness(clf, "sst2", levels=(2.0,), max_eval_samples=8, progress=False)


def test_batched_logits_run_sorted_by_length_and_come_back_in_dataset_order(tiny, tmp_path):
    """predict_logits batches examples of similar length (the teacher's pass over a training set pads less) and
    returns row i for example i: the same logits as one example at a time, where nothing is padded."""
    model, tok = load_finetuned(_classifier(tiny, "sst2", tmp_path / "sst2", 0))
    ds = encode(read_split("sst2", data_path("glue", "SST-2"), "dev").head(48), tok, 128, progress=False)
    lengths = [len(r) for r in ds.encodings["input_ids"]]
    assert lengths != sorted(lengths)  # the dev set is not already in length order
    one_by_one = predict_logits(model, ds, batch_size=1, progress=False)
    batched = predict_logits(model, ds, batch_size=16, progress=False)
    assert batched.shape == (48, 2) and np.isfinite(batched).all()
    assert np.abs(batched - one_by_one).max() <= 1e-5


def test_cross_domain_matrix(tiny, tmp_path):
    rte = tmp_path / "RTE"
    rte.mkdir()
    qnli_dev = data_path("glue", "QNLI", "dev.tsv").read_text().splitlines()[:41]
    (rte / "dev.tsv").write_text(
        "\n".join(["index\tsentence1\tsentence2\tlabel"] + ["\t".join(line.split("\t")[:4]) for line in qnli_dev[1:]])
        + "\n"
    )
    models = {
        "qnli": _classifier(tiny, "qnli", tmp_path / "q", 1),
        "rte": _classifier(tiny, "rte", tmp_path / "r", 2),
        "mnli": _classifier(tiny, "mnli", tmp_path / "m", 3),
        "sst2": _classifier(tiny, "sst2", tmp_path / "s", 4),
    }
    assert list(label_map(ShareBertConfig.from_pretrained(models["mnli"]), get_task("rte"))) == [
        1,
        0,
        1,
    ]  # contradiction/neutral -> not_entailment
    result = cross_domain(
        {t: models[t] for t in ("qnli", "rte", "sst2")}, {"rte": rte}, max_eval_samples=40, progress=False
    )
    m = result["matrix"]
    assert result["tasks"] == ["qnli", "rte", "sst2"]
    assert m["sst2"]["qnli"] is None and m["qnli"]["sst2"] is None and m["rte"]["sst2"] is None
    # The RTE file holds the first 40 QNLI dev pairs, so any model scores the same on both columns.
    for t in ("qnli", "rte"):
        assert (
            m[t]["qnli"]
            == m[t]["rte"]
            == evaluate_glue(models[t], "qnli", max_eval_samples=40, progress=False)["accuracy"]
        )
    assert m["sst2"]["sst2"] == evaluate_glue(models["sst2"], "sst2", max_eval_samples=40, progress=False)["accuracy"]
    with pytest.raises(ValueError, match="not trained on rte"):
        cross_domain({"rte": models["sst2"]}, max_eval_samples=4, progress=False)
    # MNLI (3 classes) scores on the 2-way entailment tasks, not the other way round.
    mnli = tmp_path / "MNLI"
    mnli.mkdir()
    head = "index\tpromptID\tpairID\tgenre\tp1\tp2\tq1\tq2\tsentence1\tsentence2\tlabel1\tgold_label"
    body = [
        f"{i}\t0\t0\tg\t-\t-\t-\t-\t{ln.split(chr(9))[1]}\t{ln.split(chr(9))[2]}\tneutral\tneutral"
        for i, ln in enumerate(qnli_dev[1:])
    ]
    for split in ("dev_matched", "dev_mismatched"):
        (mnli / f"{split}.tsv").write_text("\n".join([head, *body]) + "\n")
    out = tmp_path / "cd.json"
    assert (
        main(
            [
                "evaluate",
                "cross-domain",
                "--models",
                f"qnli={models['qnli']}",
                f"mnli={models['mnli']}",
                "--data-dirs",
                f"mnli={mnli}",
                "--max-eval-samples",
                "16",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    assert saved["matrix"]["qnli"]["mnli"] is None and 0 <= saved["matrix"]["mnli"]["qnli"] <= 1
    assert (
        saved["matrix"]["qnli"]["qnli"]
        == evaluate_glue(models["qnli"], "qnli", max_eval_samples=16, progress=False)["accuracy"]
    )


def test_cli_wordsim_and_errors(tiny, tmp_path, capsys):
    out = tmp_path / "ws.json"
    assert main(["evaluate", "wordsim", "--model", str(tiny), "--sets", "wordsim353", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["wordsim353"]["pairs"] == 353
    assert "skipped_multitoken" in capsys.readouterr().out
    assert main(["evaluate", "glue", "--model", str(tiny / "missing"), "--task", "sst2"]) == 2
    assert "model folder not found" in capsys.readouterr().err
    assert main(["evaluate", "glue", "--model", str(tiny), "--task", "sst2"]) == 2
    assert "ShareBertForMaskedLM model, not a fine-tuned classifier" in capsys.readouterr().err
    assert main(["evaluate", "noise", "--model", str(tiny), "--task", "sst2", "--levels", "0,x"]) == 2
    assert "--levels expects comma-separated numbers" in capsys.readouterr().err
