"""`sharebert compress` of classifier teachers whose tokenizers are byte-level BPE (RoBERTa) and Unigram
(XLM-RoBERTa), each trained in the test (tests/tiny_teachers.py): their vocabulary cut, the student's ids mapped
exactly, a task distillation that learns. Apart from test_any_teacher.py, which holds the other teachers' tests,
so pytest-xdist can run the two files on two workers (each of these runs is ~1.5 minutes of CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


def _predictions(model, tokenizer, texts) -> np.ndarray:
    """The labels ``model`` gives ``texts`` read as compress reads them (128 tokens: Unigram's pieces make 30% of
    SST-2's dev rows longer than 64)."""
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        return model(**batch).logits.argmax(-1).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])  # BPE, Unigram
def test_compress_of_a_classifier_cuts_its_vocabulary_maps_ids_exactly_and_learns(model_type, tmp_path, capsys):
    """A classifier teacher's vocabulary cut (--vocab-size): the statement of what was kept, the student's and the
    device runtime's tokenizer giving the teacher's very tokens on covered text, and a short task distillation
    agreeing with the teacher's labels more than the student it started from."""
    from tiny_teachers import trained_classifier
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sharebert.formats.paths import data_path
    from sharebert.training.distill import load_student
    from sharebert.training.glue import get_task, read_split
    from sharebert_runtime import Runtime
    from sharebert_runtime.main import main

    teacher, out = trained_classifier(tmp_path, model_type), tmp_path / "out"
    assert (
        main(
            [
                "compress",
                str(teacher),
                "--out",
                str(out),
                "--max-steps",
                "60",
                "--max-train-samples",
                "300",
                "--eval-limit",
                "200",
                "--batch-size",
                "16",
                "--vocab-size",
                "600",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    r = json.loads((out / "report.json").read_text())
    cut = r["student"]["vocabulary"]
    assert cut["teacher_size"] == 1000 and cut["size"] <= 600 and 0.5 < cut["coverage"] < 1
    assert f"vocabulary cut from 1,000 to {cut['size']} tokens" in said and "vocabulary cut" in r["summary"]
    assert json.loads((out / "student" / "config.json").read_text())["vocab_size"] == cut["table_rows"]

    t_tok, s_tok = AutoTokenizer.from_pretrained(teacher), AutoTokenizer.from_pretrained(out / "student")
    runtime = Runtime(out / "artifact")
    rows = list(read_split(get_task("sst2"), data_path("glue", "SST-2"), "train").text_a[:300])  # the cut's text
    covered = [
        t for t in rows if all(t_tok.convert_ids_to_tokens(i) in s_tok.get_vocab() for i in t_tok(t)["input_ids"])
    ]
    assert len(covered) > 30
    for text in covered:  # the teacher's tokens, exactly, under the student's ids: in Python and on the device
        ids = s_tok(text)["input_ids"]
        assert s_tok.convert_ids_to_tokens(ids) == t_tok.convert_ids_to_tokens(t_tok(text)["input_ids"])
        assert runtime._tokenized([text])[0][0] == runtime._truncate(ids, True)  # cut to its length, [SEP] kept

    held = list(read_split(get_task("sst2"), data_path("glue", "SST-2"), "dev").text_a[:200])
    teacher_says = _predictions(AutoModelForSequenceClassification.from_pretrained(teacher).eval(), t_tok, held)
    start, start_tok = load_student(str(out / "general"), get_task("sst2"), None, None, 0)  # task distillation's start
    before = float((_predictions(start.eval(), start_tok, held) == teacher_says).mean())
    labels = ["negative", "positive"]
    after = float((np.array([labels.index(a["label"]) for a in runtime.classify(held)]) == teacher_says).mean())
    assert after > before, (before, after)
