"""The run object (sharebert/pipelines/run.py): a compress run reads its teacher's config.json once."""

from __future__ import annotations

from pathlib import Path

import pytest
from open_count import count_opens

from sharebert.pipelines.run import CompressOptions, Teacher

SHAPE = dict(vocab_size=2500, hidden_size=256, intermediate_size=512, num_attention_heads=4)


class _Stop(Exception):
    """Raised where the run's first work (the teacher's export) would begin."""


def _teacher(root: Path, model_type: str, labels: dict | None = None) -> Path:
    """A small ``model_type`` encoder (transformers' own folder, no recipe) a ShareBERT student can be built for
    (hidden 256; a 2,500-row word table, which its layers' weights are generated from), beside its 1,000-token
    tokenizer; with ``labels`` (``id2label`` and the rest), an untrained sequence classifier."""
    import transformers
    from tiny_teachers import ARCHITECTURES, TOKEN_TYPES, make_config, make_tokenizer

    _, _, kind, style = ARCHITECTURES[model_type]
    tokenizer = make_tokenizer(kind, style, model_type in TOKEN_TYPES)
    folder = root / model_type
    auto = transformers.AutoModelForSequenceClassification if labels else transformers.AutoModel
    auto.from_config(make_config(model_type, tokenizer, **SHAPE, **(labels or {}))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # a tokenizer trained, a 2.5M-parameter teacher saved, compress's checks and student (~4 s)
@pytest.mark.parametrize("model_type", ["bert", "distilbert"])  # sharebert's own reader, and any encoder's
def test_a_compress_run_reads_its_teachers_config_json_once(model_type, tmp_path, monkeypatch):
    """From the command's first check to the first work (the teacher's export): the teacher's config.json is opened
    twice, once read as its config (checked, then the transformers config, shape, tokenizer and length made from
    that read) and once hashed for the fingerprint (the caches' keys and --resume's check); before the run object,
    the command's checks and this path opened it 17 times (bert) and 15 times (distilbert)."""
    from sharebert.pipelines import compress as flow
    from sharebert.pipelines.plan import precheck
    from sharebert.training.arguments import EmbeddingArgs

    teacher = _teacher(tmp_path, model_type)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the threads the user gave: none fitted before the export
    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "cache"))

    def first_work(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(flow, "export_teacher", first_work)
    opens = count_opens(monkeypatch, teacher / "config.json")
    options = CompressOptions(teacher, tmp_path / "out", {"max_params": 2.5e6}, EmbeddingArgs(max_train_samples=64))
    run = precheck(options)
    run.say = lambda *_: None
    with pytest.raises(_Stop):
        flow.compress(run)
    assert len(opens) == 2, opens
    assert run.teacher.max_length == 128 and run.teacher.shape["hidden_size"] == 256  # what the one read said


@pytest.mark.slow  # a tokenizer trained, a 2.5M-parameter classifier saved, compress's checks and student (~4 s)
def test_a_classifier_compress_run_reads_its_teachers_config_json_once(tmp_path, monkeypatch):
    """The classifier path, from the command's first check to its first work (the teacher's export, or the general
    distillation): the task told, its labels checked against the teacher's and the student picked from the run's one
    read, the file hashed once for the fingerprint; its label check opened the file again before."""
    from sharebert.pipelines import teacher_pass
    from sharebert.pipelines.compress_classifier import compress_classifier
    from sharebert.pipelines.plan import precheck
    from sharebert.training import distill_embedding
    from sharebert.training.arguments import DistillArgs, EmbeddingArgs

    labels = {"num_labels": 2, "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    teacher = _teacher(tmp_path, "bert", labels)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "cache"))

    def first_work(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(teacher_pass, "export_teacher", first_work)
    monkeypatch.setattr(distill_embedding, "distill_embedding", first_work)
    opens = count_opens(monkeypatch, teacher / "config.json")
    args, task_args = EmbeddingArgs(max_train_samples=64), DistillArgs(max_train_samples=64)
    run = precheck(CompressOptions(teacher, tmp_path / "out", {"max_params": 2.5e6}, args, task_args, task="sst2"))
    run.say = lambda *_: None
    with pytest.raises(_Stop):
        compress_classifier(run)
    assert len(opens) == 2, opens
    assert run.teacher.is_classifier and run.teacher.config.num_labels == 2


def test_the_teachers_config_is_the_one_transformers_reads(tmp_path):
    """The transformers config made from the run's one read equals ``AutoConfig.from_pretrained`` of the folder."""
    from transformers import AutoConfig, DistilBertConfig

    folder = tmp_path / "distilbert"
    DistilBertConfig(vocab_size=2500, dim=256, hidden_dim=512, n_layers=2, n_heads=4).save_pretrained(folder)
    made, read = Teacher.read(folder).config.to_dict(), AutoConfig.from_pretrained(folder).to_dict()
    assert made == read
