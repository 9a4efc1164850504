"""The teacher's pass (``training.teacher_vectors``) on a tiny teacher: through its ONNX artifact where the artifact
keeps it, the vectors PyTorch gives within the artifact's own parity threshold, in input order; PyTorch otherwise."""

import json

import numpy as np
import pytest
from tiny_teachers import build, training_text

from sharebert.formats.recipe import read_recipe
from sharebert.training.distill_embedding_model import load_encoder, recipe_head
from sharebert.training.sentence_vectors import encode
from sharebert.training.teacher import teacher_tokenizer
from sharebert.training.teacher_vectors import TeacherPass, artifact_keeps

SEQ_LEN = 32
pytestmark = pytest.mark.slow  # a tiny teacher exported once: ~10 s of CPU


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny BERT sentence-transformers teacher, its weight-only int8 artifact (the rung compress's ladder keeps for
    all-MiniLM-L6-v2),
    its PyTorch encoder and the texts: ``(folder, artifact, pass kwargs, texts)``."""
    from sharebert.export import export_model

    root = tmp_path_factory.mktemp("teacher_vectors")
    folder = build(root, "bert")["embedding"]
    artifact = root / "artifact"
    export_model(folder, artifact, quantize="int8", check_limit=16, runs=1, progress=False)
    recipe = read_recipe(folder)
    model = load_encoder(folder)
    kwargs = {
        "model": model,
        "head": recipe_head(folder, recipe),
        "tokenizer": teacher_tokenizer(folder),
        "pooling": recipe.pooling,
        "seq_len": SEQ_LEN,
    }
    texts = training_text(60)
    texts = texts[:40] + [texts[40] * 6]  # one text past SEQ_LEN tokens: both paths cut it there
    return folder, artifact, kwargs, texts


def _cosine(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_artifact_that_keeps_its_teacher_gives_its_vectors_in_input_order(exported):
    """The pass runs on the artifact (the export's parity holds its threshold) and gives PyTorch's vectors: each
    text's cosine to PyTorch's at or above the artifact's own cosine threshold, texts in the order given (the runtime
    sorts them by length), the over-long text cut at the pass's length as PyTorch cuts it; finite throughout."""
    _, artifact, kwargs, texts = exported
    fast = TeacherPass(**kwargs, artifact=artifact)
    assert fast.path == "onnx" and artifact_keeps(artifact)
    ours = fast(texts)
    theirs = encode(kwargs["model"], kwargs["tokenizer"], texts, kwargs["pooling"], kwargs["head"], SEQ_LEN)
    threshold = json.loads((artifact / "manifest.json").read_text())["parity"]["sentence_embedding"]["thresholds"]
    cos = _cosine(ours, theirs)
    assert ours.shape == theirs.shape and ours.dtype == np.float32 and np.isfinite(ours).all()
    assert cos.min() >= threshold["cosine"], (cos.min(), threshold)  # every text's, where the export's is the mean
    assert np.allclose(fast(texts[::-1]), ours[::-1], atol=1e-5)  # input order, whatever the length order


def test_without_a_keeping_artifact_the_pass_is_pytorchs(exported, tmp_path):
    """No artifact, one whose export missed its parity threshold, or one that reads fewer tokens than the pass: the
    pass runs in PyTorch and equals ``encode``."""
    import shutil

    _, artifact, kwargs, texts = exported
    low = tmp_path / "low"
    shutil.copytree(artifact, low)
    manifest = json.loads((low / "manifest.json").read_text())
    manifest["parity"]["sentence_embedding"]["cosine_mean"] = 0.5
    (low / "manifest.json").write_text(json.dumps(manifest))
    short = tmp_path / "short"
    shutil.copytree(artifact, short)
    manifest = json.loads((short / "manifest.json").read_text())
    manifest["max_length"] = SEQ_LEN - 1
    (short / "manifest.json").write_text(json.dumps(manifest))
    expected = encode(kwargs["model"], kwargs["tokenizer"], texts[:8], kwargs["pooling"], kwargs["head"], SEQ_LEN)
    for given in (None, low, short, tmp_path / "missing"):
        slow = TeacherPass(**kwargs, artifact=given)
        assert slow.path == "torch" and slow.describe() == "PyTorch on the CPU"
        assert np.allclose(slow(texts[:8]), expected, atol=1e-6)
    assert not artifact_keeps(low) and not artifact_keeps(tmp_path / "missing")


def _pair_bound(threshold: float) -> float:
    """How far a pair's cosine can move when each of its two vectors is within cosine ``threshold`` of PyTorch's:
    each turns by at most arccos(threshold), so the angle between them by twice that, and a cosine moves no more than
    its angle (|cos x - cos y| <= |x - y|)."""
    return 2 * float(np.arccos(threshold))


def test_the_reports_teacher_figures_come_from_the_pass(exported, tmp_path, monkeypatch):
    """``embedding_quality`` measures the teacher through the run's pass (its artifact: PyTorch's ``encode`` made to
    fail proves nothing falls back to it, and the pass's PyTorch model is never loaded), and its figures are
    PyTorch's within what the artifact's parity threshold allows: every pair's cosine and the calibration's mean
    cosines within :func:`_pair_bound`, the Spearman row that of the pass's own pair cosines (Spearman is theirs alone;
    a bound on it from the threshold would be vacuous at 20 pairs); NaN fails every comparison. A second run takes
    every teacher vector from the cache: the pass is not called."""
    from sharebert.pipelines import quality
    from sharebert.pipelines.run import Teacher
    from sharebert.training import sentence_vectors
    from sharebert.training.metrics import cosine_spearman

    folder, artifact, kwargs, texts = exported
    monkeypatch.setenv("SHAREBERT_DATA", str(tmp_path / "empty"))  # no STS-B: the pairs below are the Spearman row
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\t{i % 5}\n" for i, (a, b) in enumerate(zip(texts[:20], texts[20:40]))))
    teacher = Teacher.read(folder)
    student = TeacherPass(**kwargs, artifact=artifact)  # any student: its figures are not compared here

    def measure(vectors):
        return quality.embedding_quality(teacher, student, pairs, lambda *_: None, 40, vectors)

    reference = measure(None)  # the teacher in PyTorch fp32, as the report measured it before the pass
    a, b, gold = quality.read_eval_pairs(pairs)
    pair_cosines = _cosine(*(TeacherPass.of(teacher, teacher.max_length)(t) for t in (a, b)))
    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setattr(sentence_vectors, "encode", lambda *a, **k: pytest.fail("the teacher fell back to PyTorch"))
    on_artifact = TeacherPass.of(teacher, teacher.max_length, artifact)
    ours = measure(on_artifact)
    assert reference["teacher_pass"] == "torch" and ours["teacher_pass"] == "onnx"
    assert on_artifact.model is None  # its PyTorch teacher never loaded
    threshold = json.loads((artifact / "manifest.json").read_text())["parity"]["sentence_embedding"]["thresholds"]
    bound = _pair_bound(threshold["cosine"])
    assert set(ours["calibration"]) == set(reference["calibration"]) == {"related", "unrelated"}
    for kind, row in reference["calibration"].items():
        assert abs(ours["calibration"][kind]["teacher"] - row["teacher"]) <= bound, (kind, row, bound)
    ours_a, ours_b = on_artifact(a), on_artifact(b)
    assert np.isfinite(ours_a).all() and np.abs(_cosine(ours_a, ours_b) - pair_cosines).max() <= bound
    assert ours["measures"]["eval_pairs_spearman"]["teacher"] == cosine_spearman(ours_a, ours_b, gold)
    calls = []
    again = TeacherPass.of(teacher, teacher.max_length, artifact)
    monkeypatch.setattr(again, "_onnx", lambda *a: calls.append(a))
    assert measure(again)["measures"] == ours["measures"] and calls == []  # every teacher vector from the cache
