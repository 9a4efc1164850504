"""Task-data augmentation for distillation: the copies' perturbations, their labels, the hard loss that skips
them, and a real distillation whose cached teacher logits cover the copies."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_distill import STUDENT, teacher_dir  # noqa: F401  (the fixture)
from transformers import BertTokenizerFast

from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path, default_vocab
from sharebert.training.arguments import DistillArgs, DistillWeights
from sharebert.training.augment import IGNORE_LABEL, augment, nearest_words, word_ids
from sharebert.training.distill import distill_glue
from sharebert.training.distill_losses import hard_loss
from sharebert.training.encoded import encode
from sharebert.training.glue import get_task, read_split


@pytest.fixture(scope="module")
def tok():
    return BertTokenizerFast(str(default_vocab()))


@pytest.fixture(scope="module")
def sst2(tok):
    return encode(read_split(get_task("sst2"), data_path("glue", "SST-2"), "train").head(400), tok, 64, progress=False)


def test_nearest_words_by_cosine_never_itself():
    e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, -0.1], [0.5, 0.5]])
    near = nearest_words(e, np.array([0, 2]), np.array([True, True, True, True, False]), k=2)
    assert near[0].tolist() == [1, 2] and near[2].tolist() == [1, 0]  # id 4 is no candidate, nothing is its own


def test_word_ids_are_whole_words_only(tok):
    words = word_ids(tok)
    vocab = tok.get_vocab()
    assert words[vocab["film"]] and not words[vocab["##s"]] and not words[vocab["[MASK]"]]
    assert not words[vocab[","]] and not words[vocab["[unused0]"]]


def test_copies_keep_originals_lengths_and_specials_and_perturb_about_a_fifth_of_words(tok, sst2):
    torch.manual_seed(0)
    emb = torch.randn(len(tok), 16)
    out = augment(sst2, 3, tok, emb, seed=1)
    n = len(sst2)
    assert len(out) == 4 * n and out.labels[:n] == sst2.labels and set(out.labels[n:]) == {IGNORE_LABEL}
    words, mask_id = word_ids(tok), tok.mask_token_id
    near = nearest_words(emb, np.flatnonzero(words), words, 8)
    changed = total = 0
    for c in range(1, 4):
        for i in range(n):
            a, b = np.array(sst2.encodings["input_ids"][i]), np.array(out.encodings["input_ids"][c * n + i])
            assert (
                len(a) == len(b) and out.encodings["token_type_ids"][c * n + i] == sst2.encodings["token_type_ids"][i]
            )
            assert b[0] == tok.cls_token_id and b[-1] == tok.sep_token_id
            for x, y in zip(a[a != b], b[a != b]):
                assert y == mask_id or y in near[int(x)]  # a swap goes to one of the 8 nearest words
            changed += int((a != b).sum())
            total += len(a) - 2
    assert 0.12 <= changed / total <= 0.22, changed / total  # 20% of word tokens; punctuation is never touched
    again = augment(sst2, 3, tok, emb, seed=1)
    assert again.encodings["input_ids"] == out.encodings["input_ids"]  # a seed draws the same copies


def test_regression_copies_carry_nan_and_zero_copies_is_the_split_itself(tok, sst2):
    out = augment(sst2, 1, tok, torch.randn(len(tok), 8), regression=True)
    assert all(np.isnan(out.labels[len(sst2) :])) and augment(sst2, 0, tok, torch.randn(len(tok), 8)) is sst2


@pytest.mark.parametrize("labels, regression", [([1, IGNORE_LABEL, 0], False), ([0.5, float("nan"), 3.0], True)])
def test_hard_loss_skips_copies_and_is_zero_for_a_batch_of_copies_only(labels, regression):
    torch.manual_seed(0)
    logits = torch.randn(3, 1 if regression else 2)
    y = torch.tensor(labels)
    keep = [0, 2]
    want = F.mse_loss(logits[keep, 0], y[keep]) if regression else F.cross_entropy(logits[keep], y[keep])
    assert abs(float(hard_loss(logits, y, regression)) - float(want)) <= 1e-6
    none = torch.tensor([float("nan")] * 3) if regression else torch.full((3,), IGNORE_LABEL)
    zero = hard_loss(logits.requires_grad_(), none, regression)
    assert float(zero.detach()) == 0.0 and zero.requires_grad  # finite, and backward still works


def test_agreed_labels_keep_a_gold_label_only_where_the_teacher_gives_it():
    """compress's task distillation: a row the teacher labels wrong teaches by the teacher's logits alone."""
    from sharebert.training.distill_teacher import WithTeacherLogits
    from sharebert.training.encoded import EncodedSplit

    ds = EncodedSplit({"input_ids": [[2, 5, 3]] * 4, "attention_mask": [[1, 1, 1]] * 4}, [1, 0, 1, IGNORE_LABEL])
    logits = np.array([[0.1, 0.9], [0.2, 0.7], [2.0, -1.0], [0.0, 1.0]], dtype=np.float32)
    assert [WithTeacherLogits(ds, logits, agreed=True)[i]["labels"] for i in range(4)] == [
        1,
        IGNORE_LABEL,
        IGNORE_LABEL,
        IGNORE_LABEL,
    ]
    assert [WithTeacherLogits(ds, logits)[i]["labels"] for i in range(4)] == [1, 0, 1, IGNORE_LABEL]
    assert WithTeacherLogits(ds, logits, agreed=True)[0]["teacher_logits"] == pytest.approx([0.1, 0.9])


def test_distillation_with_copies_caches_teacher_logits_for_all_rows(teacher_dir, tmp_path):  # noqa: F811
    student = tmp_path / "s"
    build_model("sharebert-tiny", student, STUDENT, seed=0)
    cache = tmp_path / "cache"
    for copies in (0, 2):
        args = DistillArgs(
            max_steps=3,
            max_train_samples=48,
            max_eval_samples=16,
            batch_size=16,
            warmup_steps=1,
            seq_len=32,
            augment=copies,
            weights=DistillWeights(hidden=0.0, attention=0.0, embedding=0.0),
        )
        m = distill_glue(
            teacher_dir, str(student), "sst2", tmp_path / f"out{copies}", args=args, progress=False, cache_teacher=cache
        )
        assert m["train_samples"] == 48 * (1 + copies) and m["augment"] == copies
        assert json.loads((tmp_path / f"out{copies}" / "metrics.json").read_text())["augment"] == copies
    shapes = sorted(np.load(p).shape for p in cache.glob("*.npy"))
    assert shapes == [(48, 2), (144, 2)]  # one cache file per variant, the copies' rows included
    cached = np.load(next(p for p in cache.glob("*.npy") if np.load(p).shape[0] == 144))
    assert np.isfinite(cached).all() and not np.allclose(cached[:48], cached[48:96])  # the copies differ


def test_resume_on_other_copies_than_the_checkpoint_is_refused(teacher_dir, tmp_path):  # noqa: F811
    """A checkpoint keeps how its training set was augmented: --resume with another --augment (or seed) would
    continue on another dataset; refused before any model loads, and the same data resumes."""
    student = tmp_path / "s"
    build_model("sharebert-tiny", student, STUDENT, seed=0)
    base = dict(
        max_train_samples=32,
        max_eval_samples=16,
        batch_size=16,
        warmup_steps=1,
        seq_len=32,
        weights=DistillWeights(hidden=0.0, attention=0.0, embedding=0.0),
    )
    out = tmp_path / "out"
    distill_glue(
        teacher_dir,
        str(student),
        "sst2",
        out,
        args=DistillArgs(max_steps=2, augment=2, **base),
        progress=False,
        keep_checkpoints=True,
    )
    for other in (dict(augment=3), dict(augment=0), dict(augment=2, seed=7)):
        with pytest.raises(ValueError, match=r"trained with --augment 2 and --seed 0; resume with the same"):
            distill_glue(
                teacher_dir,
                str(student),
                "sst2",
                out,
                args=DistillArgs(max_steps=4, **{**base, **other}),
                progress=False,
                resume=True,
            )
    m = distill_glue(
        teacher_dir,
        str(student),
        "sst2",
        out,
        args=DistillArgs(max_steps=4, augment=2, **base),
        progress=False,
        resume=True,
    )
    assert m["steps"] == 4 and m["train_samples"] == 96
