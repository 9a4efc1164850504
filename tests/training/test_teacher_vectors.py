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
