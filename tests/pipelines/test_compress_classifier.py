"""`sharebert compress` of a classifier teacher: general then task distillation, an int8
text-classification artifact, and a report whose GLUE dev metric is the artifact's own.

One session run: a tiny BERT (hidden 256, 2 layers) fine-tuned a few steps on SST-2 with `sharebert finetune`
(so its task is recorded in metrics.json), compressed with a few steps per phase (one augmented copy of each
task example). Bad inputs are in
tests/pipelines/test_compress.py's table.
"""

import json

import numpy as np
import pytest
from open_count import count_opens

from sharebert_runtime.main import main

EVAL, STEPS, SENTENCES, MAX_PARAMS = 120, 6, 200, 2_500_000


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory):
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from sharebert.formats.paths import default_vocab

    root = tmp_path_factory.mktemp("compress_classifier")
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=30522,
            hidden_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=512,
            max_position_embeddings=128,
        )
    ).save_pretrained(root / "base")
    BertTokenizerFast(str(default_vocab())).save_pretrained(root / "base")
    assert (
        main(
            [
                "finetune",
                "--model",
                str(root / "base"),
                "--task",
                "sst2",
                "--out",
                str(root / "teacher"),
                "--max-steps",
                "10",
                "--max-train-samples",
                "320",
                "--max-eval-samples",
                "64",
                "--lr",
                "1e-3",
                "--batch-size",
                "32",
            ]
        )
        == 0
    )
    with pytest.MonkeyPatch.context() as m:  # the whole run's opens of the teacher's config.json, kept beside it
        opens = count_opens(m, root / "teacher" / "config.json")
        rc = main(
            [
                "compress",
                str(root / "teacher"),
                "--out",
                str(root / "out"),
                "--max-steps",
                str(STEPS),
                "--max-train-samples",
                str(SENTENCES),
                "--eval-limit",
                str(EVAL),
                "--batch-size",
                "16",
                "--max-params",
                str(MAX_PARAMS),
                "--augment",
                "1",
            ]
        )
    (root / "config_opens.json").write_text(json.dumps(opens))
    assert rc == 0
    return root


def _artifact_accuracy(artifact, rows):
    """Accuracy of an artifact on the first ``rows`` SST-2 dev examples, counted here from its answers."""
    from sharebert.formats.paths import data_path
    from sharebert.training.glue import read_split
    from sharebert_runtime import Runtime

    split = read_split("sst2", data_path("glue", "SST-2"), "dev").head(rows)
    answers = Runtime(artifact).classify(split.text_a)
    labels = np.array(split.labels)
    predicted = np.array([["negative", "positive"].index(a["label"]) for a in answers])
    return float((predicted == labels).mean()), len(answers)


def test_report_has_both_phases_and_the_budgeted_student(classifier_run):
    from sharebert.accounting.budget import student_for
    from sharebert.formats.model_folder import shape_fields

    out = classifier_run / "out"
    r = json.loads((out / "report.json").read_text())
    assert (
        r["task"] == "sst2" and r["metric"] == "accuracy" and r["dev_examples"] == EVAL
    )  # from finetune's metrics.json
    assert r["general"]["steps"] == STEPS and r["general"]["train_sentences"] == SENTENCES
    assert r["general"]["pooling"] == "cls"  # a plain classifier folder: the [CLS] state its head reads
    assert r["training"]["steps"] == STEPS and r["training"]["train_samples"] == 2 * SENTENCES  # --augment 1
    assert json.loads((out / "phases.json").read_text())["task"]["augment"] == 1
    assert set(json.loads((out / "phases.json").read_text())) == {"general", "task"}
    cand, head = student_for(shape_fields(classifier_run / "teacher"), {"max_params": MAX_PARAMS}, num_labels=2)
    assert r["student"]["learned_params"] == cand.params + head <= MAX_PARAMS  # the budget counts what is saved
    assert r["student"]["learned_params"] < r["teacher"]["learned_params"] / 3
    md = (out / "report.md").read_text()
    assert (
        f"| SST-2 dev accuracy ({r['dev_examples']} examples) |" in md
        and f"General distillation: {STEPS} steps" in md
        and "Task distillation on sst2" in md
    )
    assert (out / "report.png").stat().st_size > 1000
    assert not (out / "general" / "checkpoints").exists() and not (out / "student" / "checkpoints").exists()
    # the majority-label baseline on the same EVAL dev examples, counted here; the verdict first in report.md
    from sharebert.formats.paths import data_path
    from sharebert.training.glue import read_split

    labels = np.array(read_split("sst2", data_path("glue", "SST-2"), "dev").head(EVAL).labels)
    majority = int(labels.mean() > 0.5)
    assert r["baseline"] == {
        "label": ["negative", "positive"][majority],
        "examples": EVAL,
        "accuracy": float((labels == majority).mean()),
    }
    first = md.splitlines()[2]
    assert first == r["verdict"]["lines"][0] and first.startswith("Verdict: ")
    assert f"always answering '{r['baseline']['label']}' (the most frequent label there) " in first
    assert f"{r['baseline']['accuracy']:.4f}" in first and f"student {r['student']['glue_dev']:.4f}" in first


def test_the_run_reads_its_teachers_config_json_once(classifier_run):
    """The whole run (the teacher's export, both phases, the report) opens the teacher's config.json twice: read once
    (``run.Teacher``: its checks, transformers config and tokenizer, passed to the export, the teacher's rate and both
    distillations) and hashed once for the fingerprint (the caches' keys, --resume's checks); a whole run of
    test_run.py's tiny BERT classifier opened it 15 times before."""
    assert json.loads((classifier_run / "config_opens.json").read_text()) == ["os.open", "open"]


def test_the_verdict_weighs_teacher_and_student_against_the_majority_baseline():
    """Teacher and student both at the always-one-label score: said to mean nothing (not "0.997 of the teacher");
    a student at the baseline is not usable; otherwise the share of the teacher's gain over it."""
    from sharebert.pipelines.classifier_report import classifier_verdict

    base = {"label": "positive", "examples": 872, "accuracy": 0.509}
    (both,) = classifier_verdict(0.509, 0.509, base, "accuracy", "SST-2 dev accuracy (872 examples)")
    assert "teacher 0.5090, student 0.5090, always answering 'positive'" in both and "says nothing" in both
    (none,) = classifier_verdict(0.9, 0.5, base, "accuracy", "x")
    assert none.startswith("Verdict: NOT usable") and "no better than that baseline" in none
    (some,) = classifier_verdict(0.9, 0.8, base, "accuracy", "x")
    assert f"keeps {(0.8 - 0.509) / (0.9 - 0.509):.0%} of the teacher's gain" in some
    assert "no majority-label baseline" in classifier_verdict(0.8, 0.7, None, "pearson", "x")[0]


def test_the_artifact_classifies_and_its_metric_is_the_reported_one(classifier_run):
    from sharebert_runtime import Runtime

    out = classifier_run / "out"
    r = json.loads((out / "report.json").read_text())
    rt = Runtime(out / "artifact")
    assert rt.task == "text-classification" and rt.labels == ["negative", "positive"]
    answer = rt.classify(["a gorgeous, witty, seductive movie."])[0]
    assert answer["label"] in ("negative", "positive") and abs(sum(answer["scores"].values()) - 1) <= 1e-5
    student, n = _artifact_accuracy(out / "artifact", EVAL)
    teacher, _ = _artifact_accuracy(out / "teacher_artifact", EVAL)
    assert n == EVAL and 0 <= student <= 1
    assert abs(r["student"]["glue_dev"] - student) <= 1e-9
    assert abs(r["teacher"]["glue_dev_artifact"] - teacher) <= 1e-9
    assert np.isfinite([r["teacher"]["glue_dev"], r["student"]["glue_dev_fp32"], r["student"]["p50_ms_16"]]).all()


def test_resume_of_a_finished_run_trains_no_phase_again(classifier_run):
    out = classifier_run / "out"
    before = json.loads((out / "report.json").read_text())
    stamps = {
        p: p.stat().st_mtime_ns for p in (out / "general" / "model.safetensors", out / "student" / "model.safetensors")
    }
    assert (
        main(
            [
                "compress",
                str(classifier_run / "teacher"),
                "--out",
                str(out),
                "--max-steps",
                str(STEPS),
                "--eval-limit",
                str(EVAL),
                "--max-params",
                str(MAX_PARAMS),
                "--augment",
                "1",
                "--resume",
            ]
        )
        == 0
    )
    after = json.loads((out / "report.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # both phases recorded: neither ran again
    assert after["general"] == before["general"] and after["training"] == before["training"]
    assert after["student"]["glue_dev"] == before["student"]["glue_dev"]


def test_resume_of_a_finished_run_with_a_larger_budget_is_refused_not_ignored(classifier_run, capsys):
    """Both phases done, their checkpoints gone: more --max-steps (or --max-time) cannot train on, and saying
    nothing while exiting 0 would claim it did; one line instead, nothing changed."""
    out = classifier_run / "out"
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    capsys.readouterr()
    for budget in (
        ["--max-steps", str(STEPS * 4)],
        ["--max-time", "600"],
        ["--max-steps", str(STEPS), "--augment", "4"],
        ["--max-steps", str(STEPS)],
    ):  # the last: without the run's --augment 1
        assert (
            main(
                [
                    "compress",
                    str(classifier_run / "teacher"),
                    "--out",
                    str(out),
                    *budget,
                    "--max-params",
                    str(MAX_PARAMS),
                    "--resume",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds a finished compress trained with" in err, err
        assert f"--max-steps {STEPS} and --augment 1; a finished phase keeps no checkpoint" in err
        assert "start again with --overwrite" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == stamps


@pytest.mark.parametrize(
    "part, text, message",
    [
        ("phases.json", "{", "phases.json is not valid JSON (Expecting property name"),
        ("phases.json", "[" * 100_000 + "]" * 100_000, "phases.json is not valid JSON (nested too deeply)"),
        ("phases.json", "[]", "phases.json is not a record of compress phases"),
        ("phases.json", '{"general": 5, "task": []}', "phases.json is not a record of compress phases"),
        ("student/config.json", "[1, 2]", "student/config.json is not a model config (a JSON object)"),
        ("general/config.json", "garbage", "general/config.json is not a model config (a JSON object)"),
    ],
)
def test_resume_with_a_damaged_record_is_one_line_naming_the_file(
    classifier_run, tmp_path, part, text, message, capsys
):
    """A file the finished run wrote, changed since: the marker no longer vouches for the folder, so it is neither
    resumed nor replaced (the refusal names the file); a record damaged before the run sealed it (the marker
    vouching for it) is refused by its reader, naming it."""
    import shutil

    from sharebert_runtime.outdir import seal_out

    out = tmp_path / "out"
    shutil.copytree(classifier_run / "out", out)
    (out / part).write_text(text)
    argv = ["compress", str(classifier_run / "teacher"), "--out", str(out), "--max-steps", str(STEPS)]
    argv += ["--max-params", str(MAX_PARAMS), "--augment", "1", "--resume"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{part} is not the file the run wrote" in err and "move it away" in err
    seal_out(out)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--overwrite" in err, err


def test_resume_with_nothing_to_resume_is_refused(classifier_run, tmp_path, capsys):
    """compress --resume of a classifier into a new folder says there is nothing to resume and writes nothing (no
    training from scratch)."""
    out = tmp_path / "new"
    assert (
        main(
            [
                "compress",
                str(classifier_run / "teacher"),
                "--out",
                str(out),
                "--max-steps",
                str(STEPS),
                "--max-params",
                str(MAX_PARAMS),
                "--resume",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"--resume: {out} holds no complete checkpoint to continue from; run without --resume to start"
    ), err
    assert not out.exists()


@pytest.mark.parametrize("hidden", [16, 32, 128])
def test_a_teacher_narrower_than_every_student_is_refused_by_name(hidden):
    """compress of a teacher narrower than every candidate said 'min() arg is an empty sequence'."""
    from sharebert.accounting.budget import student_for

    with pytest.raises(ValueError, match=rf"as narrow as this teacher \(hidden_size {hidden}\); the narrowest"):
        student_for({"vocab_size": 30522, "hidden_size": hidden, "num_hidden_layers": 2}, {"max_params": 5e6})
