"""`compress` outside this workspace (the text shipped in the package, `--eval-pairs`, agreement with the teacher on
held-out text) and a report that reads right (every figure says what it was measured on, the cosine calibration, the
picture's title, units and values)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharebert.formats.paths import packaged_corpus, packaged_heldout
from sharebert.pipelines.quality import neighbour_agreement, read_eval_pairs
from sharebert.pipelines.report import report_markdown
from sharebert.pipelines.teacher_pass import teacher_name


def test_the_package_ships_its_text_with_its_licence():
    corpus = packaged_corpus().read_text(encoding="utf-8").splitlines()
    held = packaged_heldout().read_text(encoding="utf-8").splitlines()
    assert len(corpus) >= 2000 and len(held) >= 500
    assert not set(corpus) & set(held)  # held out: never trained on by default
    assert packaged_corpus().stat().st_size + packaged_heldout().stat().st_size < 500_000
    readme = (packaged_corpus().parent / "README.md").read_text(encoding="utf-8")
    assert "CC BY-SA 3.0" in readme and "WikiText-2" in readme
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"text/*.txt"' in pyproject  # shipped as package data


def test_the_package_ships_a_search_set_whose_queries_each_name_one_answer():
    """At least 30 queries over at least 100 sentences, shipped as package data."""
    from sharebert.formats.paths import packaged_search

    corpus, queries, answers = packaged_search()
    assert len(corpus) >= 100 and len(queries) >= 30 and len(set(corpus)) == len(corpus)
    assert len(answers) == len(queries) and all(0 <= a < len(corpus) for a in answers)
    assert not set(queries) & set(corpus)
    assert '"text/*.tsv"' in (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()


def test_search_agreement_counts_queries_whose_top1_sentence_is_the_teachers():
    from sharebert.formats.paths import packaged_search
    from sharebert.pipelines.quality import search_agreement

    corpus, queries, answers = packaged_search()
    rng = np.random.default_rng(0)
    table = {text: rng.normal(size=8) for text in corpus}

    # the teacher: each query is its answer sentence's vector; the student: the same, but the first 7 queries point
    # at another sentence
    def t_vec(texts):
        return np.stack([table[t] if t in table else table[corpus[answers[queries.index(t)]]] for t in texts])

    wrong = {q: corpus[(answers[i] + 1) % len(corpus)] for i, q in enumerate(queries[:7])}

    def s_vec(texts):
        return t_vec([wrong.get(t, t) for t in texts])

    row = search_agreement(t_vec, s_vec, say=lambda _: None)
    assert row["student"] == pytest.approx(1 - 7 / len(queries)) and row["teacher"] == 1.0
    assert f"({len(queries)} queries over {len(corpus)} sentences)" in row["label"]
    assert search_agreement(t_vec, t_vec, say=lambda _: None)["student"] == 1.0


def test_the_student_has_the_positions_of_its_teachers_maximum_length(minilm_dir):
    """Compress's student reads what its teacher reads (MiniLM's recipe: 256 tokens), its positions counted in the
    budget; without a length, 128."""
    from sharebert.accounting.budget import student_for
    from sharebert.pipelines.plan import embedding_shape
    from sharebert.pipelines.run import Teacher

    shape = embedding_shape(Teacher.read(minilm_dir))
    assert shape["max_length"] == 256
    long, head = student_for(shape, {"max_params": 5e6})
    short, _ = student_for({k: v for k, v in shape.items() if k != "max_length"}, {"max_params": 5e6})
    assert long.config["max_position_embeddings"] == 256 and short.config["max_position_embeddings"] == 128
    assert long.params - short.params == 128 * long.config["hidden_size"]  # the extra positions are counted
    assert long.params + head <= 5e6


def test_a_second_run_takes_the_teachers_artifact_from_the_cache(minilm_dir, tmp_path, monkeypatch):
    """The teacher's artifact and its refusals are kept by the teacher's fingerprint: a second compress of the same
    teacher exports nothing; another teacher (a changed file) or a damaged cache exports again."""
    import shutil

    from sharebert.pipelines import teacher_pass as t
    from sharebert.pipelines.run import Teacher

    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "cache"))
    exported = []

    def ladder(teacher, out, task, progress, say):  # the real ladder's result, without its minutes of export
        _hashed_artifact(out, {"model.onnx": b"graph", "tokenizer.json": b"{}"}, quantization="int8")
        exported.append(teacher)
        return "int8", {"int8-dynamic": "mean cosine 0.9866 to PyTorch < 0.99"}

    monkeypatch.setattr(t, "_teacher_ladder", ladder)
    folder = tmp_path / "teacher"
    shutil.copytree(minilm_dir, folder)
    teacher = Teacher.read(folder)  # as a run reads it, once
    first = t.export_teacher(teacher, tmp_path / "a" / "teacher_artifact", "feature-extraction", False, lambda _: None)
    said = []
    second = t.export_teacher(teacher, tmp_path / "b" / "teacher_artifact", "feature-extraction", False, said.append)
    assert first[1:] == second[1:] == ("int8", {"int8-dynamic": "mean cosine 0.9866 to PyTorch < 0.99"})
    assert (second[0] / "model.onnx").read_bytes() == b"graph" and len(exported) == 1 and "from the cache" in said[0]
    cache = t.teacher_cache(teacher, "feature-extraction")
    (cache / t.CACHE_CHOICE).write_text("{not json")
    t.export_teacher(teacher, tmp_path / "c" / "teacher_artifact", "feature-extraction", False, lambda _: None)
    assert len(exported) == 2  # damaged: exported again, and cached again
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")  # another file, another key
    teacher = Teacher.read(folder)  # the next run's
    assert t.teacher_cache(teacher, "feature-extraction") != cache
    t.export_teacher(teacher, tmp_path / "d" / "teacher_artifact", "feature-extraction", False, lambda _: None)
    assert len(exported) == 3


def _hashed_artifact(out: Path, files: dict, **fields) -> None:
    """An artifact folder holding ``files`` (name: bytes) and a manifest that lists their sha256 and size, as
    ``verify_artifact`` checks them (the graphs are not opened: what the cache's check reads)."""
    import hashlib

    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    listed = {n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in files.items()}
    manifest = {"format": "sharebert-onnx", "format_version": 1, "task": "feature-extraction", "max_length": 8}
    (out / "manifest.json").write_text(json.dumps({**manifest, **fields, "files": listed}))


@pytest.mark.parametrize("where", ["cache", "resumed"])
def test_a_teachers_artifact_that_fails_its_manifest_is_exported_again_never_used(minilm_dir, tmp_path, where):
    """A truncated model.onnx in the cache (or in a resumed run's teacher_artifact) fails its manifest's sha256 and
    size: said in one line, exported again; the run never measures the damaged file."""
    import shutil

    from sharebert.pipelines import teacher_pass as t
    from sharebert.pipelines.run import Teacher

    exported = []

    def ladder(teacher, out, task, progress, say):
        _hashed_artifact(out, {"model.onnx": b"graph" * 400, "tokenizer.json": b"{}"}, quantization="int8")
        exported.append(teacher)
        return "int8", {}

    shutil.copytree(minilm_dir, tmp_path / "teacher")
    teacher = Teacher.read(tmp_path / "teacher")
    first = tmp_path / "a" / "teacher_artifact"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(t, "_teacher_ladder", ladder)
        t.export_teacher(teacher, first, "feature-extraction", False, lambda _: None)
        cache = t.teacher_cache(teacher, "feature-extraction") / "artifact"
        damaged = cache if where == "cache" else first
        if where == "resumed":
            shutil.rmtree(cache.parent)  # the resumed run's own artifact is the only one
        os.truncate(damaged / "model.onnx", 1000)
        said = []
        second = tmp_path / "b" / "teacher_artifact" if where == "cache" else first
        art, mode, _ = t.export_teacher(teacher, second, "feature-extraction", False, said.append)
    assert len(exported) == 2 and mode == "int8"
    assert (art / "model.onnx").read_bytes() == b"graph" * 400
    assert len(said) == 1 and f"{damaged}" in said[0] and "1000 bytes" in said[0] and "exported again" in said[0]


@pytest.mark.slow
def test_compress_takes_a_folder_named_masked_lm_and_refuses_a_budget_too_small(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """all-MiniLM-L6-v2 whose config.json says BertForMaskedLM (no head saved, as many published folders): compress
    takes it as the sentence encoder it is (it plans an encoder's student); a --max-time of 5 s, far from the 1,600
    steps of 8 a trained student takes, is refused at the plan made before the teacher's export (this test's cache is
    empty: the export estimated) and pass, naming the smallest budget and --allow-untrained, and the new folder is
    left as empty as it was (no --overwrite needed to run again)."""
    import shutil

    from sharebert.pipelines import teacher_pass as t
    from sharebert_runtime.main import main

    asked = []

    def ladder(teacher, out, task, progress, say):  # the real ladder's result, without its minutes of export
        _hashed_artifact(out, {"model.onnx": b"graph", "tokenizer.json": b"{}"}, quantization="int8")
        asked.append(task)
        return "int8", {}

    monkeypatch.setattr(t, "_teacher_ladder", ladder)
    teacher = tmp_path / "teacher"
    shutil.copytree(minilm_dir, teacher)
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    out = tmp_path / "out"
    argv = ["compress", str(teacher), "--out", str(out), "--max-time", "5", "--max-params", "2.5M"]
    assert main([*argv, "--max-train-samples", "64", "--batch-size", "8"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "fewer than the 1,600 a trained student needs: give --max-time" in err, err
    assert "or --allow-untrained to run anyway" in err and "estimated: not cached" in err and asked == []
    assert "exporting the teacher" not in captured.out and "teacher's vectors for" not in captured.out
    assert not out.exists() or {p.name for p in out.iterdir()} <= {".lock"}


def test_defaults_fall_back_to_the_packaged_text_without_a_data_folder(tmp_path, monkeypatch):
    from export.exporter import default_check_file
    from sharebert.training.distill_sentences import default_corpus, sts_available

    monkeypatch.setenv("SHAREBERT_DATA", str(tmp_path))
    assert default_corpus() == [packaged_corpus()]
    assert default_check_file() == packaged_heldout()
    assert not sts_available()
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    assert default_check_file() == tmp_path / "glue" / "SST-2" / "dev.tsv"


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\tb\n", "expected 3 tab-separated fields"),
        ("a\tb\tsame\nc\td\tmaybe\n", "line 2"),
        # a label that is no label: named as such, never "expected 3 fields, got 3"
        ("a\tb\tsame\nc\td\thigh\n", "line 2: the gold value 'high' .* is neither a number nor one of the labels"),
        ("a\tb\tsame\nc\td\tsame\n", "different gold values"),
        ("a\tb\t1\nc\td\tnan\n", "line 2"),
        ("", "different gold values"),
    ],
)
def test_eval_pairs_refuses_malformed_files_in_one_line(text, message, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        read_eval_pairs(path)
    assert "\n" not in str(e.value)


def test_eval_pairs_reads_scores_labels_and_a_header(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tgold\nA\tB\tsame\nC\tD\tdifferent\nE\tF\t3.5\n")
    assert read_eval_pairs(path) == (["A", "C", "E"], ["B", "D", "F"], [1.0, 0.0, 3.5])
    with pytest.raises(ValueError, match="not a regular file|FIFO"):
        os.mkfifo(tmp_path / "fifo")
        read_eval_pairs(tmp_path / "fifo")


def test_neighbour_agreement_counts_equal_nearest_neighbours():
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(50, 8))
    assert neighbour_agreement(teacher, teacher) == 1.0
    assert neighbour_agreement(teacher * 3 + 0, teacher) == 1.0  # cosine: the scale does not matter
    scrambled = teacher[rng.permutation(50)]
    assert neighbour_agreement(scrambled, teacher) < 0.3


def test_the_verdict_weighs_search_agreement_against_its_threshold_and_suggests_a_budget(tmp_path):
    """Issue 46's first run: 30 of 441 planned steps, 430 of 7,336 sentences, 17 of 35 queries: not usable, said
    untrained, and the budget is the run's time outside training plus USEFUL_STEPS at the measured 2 s a step."""
    from sharebert.pipelines.quality import USABLE_SEARCH, USEFUL_BATCH, USEFUL_STEPS, search_verdict

    training = {"steps": 30, "train_seconds": 60.0, "train_sentences": 860, "train_word_strings": 430}
    r = {"student": {"search_top1": 17 / 35, "agreement_cosine": 0.13}, "training": training}
    v = search_verdict(r, USEFUL_BATCH, planned=441, available=7336, elapsed=420.0, queries=35)
    assert not v["usable_for_search"] and v["untrained"] and v["threshold"] == USABLE_SEARCH == 0.9
    assert (v["sentences"], v["available_sentences"], v["seconds_per_step"]) == (430, 7336, 2.0)
    assert v["suggested_max_time"] == 60 * -(-(420 - 60 + USEFUL_STEPS * 2.0) // 60) == 4800
    first, seen, budget = v["lines"]
    assert first.startswith("Verdict: NOT usable for search") and "17 of 35 search queries (usable from 0.90" in first
    assert "mean cosine to the teacher's vectors 0.130" in first
    assert "30 of the 441 planned steps of 32 sentences (2.00 s a step, measured)" in seen
    assert "on 430 of the 7,336 sentences of its training text (6%): 1.1 passes over them and their" in seen
    assert "untrained" in seen
    assert "--max-time 4800" in budget and "360 s this run spent outside training" in budget
    # half the batch: twice the steps for the same sentences drawn
    assert search_verdict(r, 16, 441, 7336, 420.0, 35)["suggested_max_time"] == 60 * -(-(360 + 4400 * 2.0) // 60)
    usable = search_verdict(
        {**r, "student": {"search_top1": 34 / 35, "agreement_cosine": 0.63}}, 32, 441, 7336, 420.0, 35
    )
    assert usable["usable_for_search"] and not usable["untrained"] and usable["suggested_max_time"] is None
    assert usable["lines"][0].startswith("Verdict: usable for search") and "34 of 35" in usable["lines"][0]
    md = report_markdown({**_report(tmp_path), "verdict": v}).splitlines()
    assert md[:4] == ["# Compression report", "", first, ""]  # the report's first lines


@pytest.mark.slow
def test_agreement_and_calibration_of_a_perturbed_teacher(minilm_dir, tmp_path, monkeypatch):
    """The teacher as its own student is in full agreement; the same with noise agrees less, each row named by
    what it was measured on; without a data folder there is no STS-B row."""
    from transformers import AutoTokenizer

    from sharebert.formats.recipe import read_recipe
    from sharebert.pipelines.quality import embedding_quality
    from sharebert.pipelines.run import Teacher
    from sharebert.training.distill_embedding_model import load_encoder, recipe_head
    from sharebert.training.sentence_vectors import encode

    monkeypatch.setenv("SHAREBERT_DATA", str(tmp_path / "empty"))
    recipe, model, tok = read_recipe(minilm_dir), load_encoder(minilm_dir), AutoTokenizer.from_pretrained(minilm_dir)
    rng = np.random.default_rng(0)
    noise = {"value": 0.0}

    def student(texts):
        v = encode(model, tok, texts, recipe.pooling, recipe_head(minilm_dir, recipe), 256)
        return v + rng.normal(scale=noise["value"], size=v.shape)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "A man plays a guitar.\tA man is playing the guitar.\tsame\nA cat sleeps.\tThe market fell.\t"
        "different\nDogs run in the snow.\tTwo dogs run across a snowy field.\tsame\nRain flooded the "
        "city.\tChildren play football in the park.\tdifferent\n"
    )
    same = embedding_quality(Teacher.read(minilm_dir), student, pairs, say=lambda *_: None, limit=60)
    noise["value"] = 0.05
    noisy = embedding_quality(Teacher.read(minilm_dir), student, pairs, say=lambda *_: None, limit=60)
    assert set(same["measures"]) == {"agreement_cosine", "agreement_top1", "search_top1", "eval_pairs_spearman"}
    assert same["measures"]["agreement_cosine"]["student"] == pytest.approx(1.0, abs=1e-5)
    assert same["measures"]["agreement_top1"]["student"] == same["measures"]["search_top1"]["student"] == 1.0
    assert noisy["measures"]["agreement_cosine"]["student"] < 0.999
    assert "60 held-out" in same["measures"]["agreement_top1"]["label"]
    assert "pairs.tsv (4 pairs)" in same["measures"]["eval_pairs_spearman"]["label"]
    c = same["calibration"]
    assert c["related"]["teacher"] > c["unrelated"]["teacher"] + 0.3


def _report(tmp_path) -> dict:
    side = dict(
        learned_params=22_713_216,
        file_bytes=90_000_000,
        artifact_bytes=23_000_000,
        peak_rss_bytes=120_000_000,
        added_rss_bytes=50_000_000,
        p50_ms_16=4.0,
        p50_ms_128=20.0,
        agreement_top1=1.0,
        sts_spearman=0.867,
    )
    return {
        "teacher": {"folder": "/x/model", "name": "all-MiniLM-L6-v2", **side},
        "student": {
            "folder": "/x/out/student",
            "shape": "F=64 V=256 N=4",
            **side,
            "learned_params": 4_900_000,
            "file_bytes": 5_000_000,
            "agreement_top1": 0.91,
            "sts_spearman": 0.80,
        },
        "quality": [
            {
                "label": "top-1 neighbour agreement with the teacher (600 held-out WikiText-2 sentences)",
                "key": "agreement_top1",
            },
            {"label": "STS-B dev Spearman (all 1500 pairs)", "key": "sts_spearman"},
        ],
        "calibration": {"unrelated": {"teacher": 0.05, "student": 0.2, "measured_on": "600 pairs"}},
        "summary": "...",
    }


def test_report_rows_say_what_they_measured_and_the_calibration(tmp_path):
    md = report_markdown(_report(tmp_path))
    assert "all-MiniLM-L6-v2" in md
    assert "| peak RSS at load (1 thread, fresh process) | 120.0 MB |" in md
    assert "STS-B dev Spearman (all 1500 pairs) | 0.8670 | 0.8000 |" in md
    assert "600 held-out" in md and "| unrelated pairs | 0.050 | 0.200 |" in md


def test_report_names_the_cpu_its_figures_came_from(tmp_path):
    from sharebert.pipelines.report import write_report
    from sharebert_runtime.cpu import cpu_info, describe

    report = _report(tmp_path)
    written = write_report(tmp_path, {k: v for k, v in report.items() if k != "summary"}, "done.")
    assert written["cpu"] == cpu_info() == json.loads((tmp_path / "report.json").read_text())["cpu"]
    assert f"measured on {describe(cpu_info())}" in (tmp_path / "report.md").read_text()
    assert describe(cpu_info()) not in report_markdown(report)  # a report written before the field: no line


def test_teacher_name_reads_the_model_card_heading(minilm_dir, tmp_path):
    assert teacher_name(minilm_dir) == "all-MiniLM-L6-v2"
    (tmp_path / "model").mkdir()
    assert teacher_name(tmp_path / "model") == f"{tmp_path.name}/model"


@pytest.mark.slow
def test_compress_runs_with_an_empty_data_folder_outside_the_checkout(minilm_user_run):
    """A user's machine: `SHAREBERT_DATA` an empty folder, the working folder not the checkout, no --train: the
    package's own text trains and measures; no STS-B row; the plan line comes before the first step; the
    student folder is the model alone, the work folder gone; the teacher's artifact and vectors left in the cache
    for the next run (the run: conftest's minilm_user_run, whose cache later compress runs of the tests start from)."""
    empty, work, cache = (minilm_user_run / name for name in ("empty", "work", "cache"))
    proc = json.loads((minilm_user_run / "proc.json").read_text())
    assert proc["returncode"] == 0, proc["stderr"][-2000:]
    report = json.loads((work / "R" / "report.json").read_text())
    keys = [q["key"] for q in report["quality"]]
    assert keys == ["agreement_cosine", "agreement_top1", "search_top1"]
    # the 64 sentences, each followed by one string of vocabulary words (--word-strings' default 1)
    assert report["training"]["train_sentences"] == 128 and report["training"]["train_word_strings"] == 64
    assert "64 sentences and 64 strings of vocabulary words" in (work / "R" / "report.md").read_text()
    for side in ("teacher", "student"):  # the first answer includes the load and one request: longer than a request
        d = report[side]
        assert math.isfinite(d["first_answer_ms"]) and d["first_answer_ms"] > d["p50_ms_16"] > 0
    assert (
        "| time to first answer (fresh process: start, imports, load, 1 request) |"
        in (work / "R" / "report.md").read_text()
    )
    assert not list(empty.iterdir())
    assert proc["stdout"].index("plan for --max-time") < proc["stdout"].index("exporting the student")
    assert not (work / "R" / "work").exists() and not (work / "R" / "student" / "checkpoints").exists()
    # what the next compress of this teacher skips: its export ladder, its side of the held-out and search rows
    assert len(list(cache.glob("teacher-artifacts/*/artifact/manifest.json"))) == 1
    assert len(list(cache.glob("teacher-vectors/*.npy"))) == 3  # held-out sentences, search queries, search corpus


def test_time_budget_plans_the_teachers_pass_and_training_within_the_budget(monkeypatch):
    """The plan: what the end needs is kept back, the teacher's pass takes at most a third of the rest, training
    the remainder; a budget below the end's costs is said so (all from measured rates, no clock in the test)."""
    from sharebert.pipelines.plan import TimeBudget

    said = []
    now = __import__("time").monotonic()
    monkeypatch.setattr("time.monotonic", lambda: now)  # the clock stands still: no stall of a loaded machine counts
    budget = TimeBudget(600, after_sentences=3600, say=said.append, start=now)
    n = budget.plan(15000, rate=50.0, step=0.2, batch=32)
    reserve = budget.reserve()
    assert reserve == pytest.approx(
        2 * (TimeBudget.EXPORT_SECONDS + 2 * 128 / 50)
        + 2 * TimeBudget.PROBE_SECONDS
        + (1 + TimeBudget.STUDENT_SHARE) * 3600 / 50
    )
    assert n == pytest.approx(50 * (600 - reserve) / 3, rel=0.02)  # a third of what is left, at 50 sentences a second
    assert budget.training_seconds() + reserve == pytest.approx(budget.left(), abs=1)  # set when training starts
    budget.exports = 1  # the teacher's artifact made before training: only the student's export is still to come
    assert budget.reserve() == pytest.approx(reserve - TimeBudget.EXPORT_SECONDS - 2 * 128 / 50)
    assert f"in ~{600 - reserve - n / 50:.0f} s of training" in said[0]
    assert len(said) == 1 and "plan for --max-time 600 s" in said[0] and f"{n:,} of 15,000 sentences" in said[0]
    small = TimeBudget(60, after_sentences=3600, say=said.append, start=now)
    assert small.plan(15000, rate=50.0, step=0.2, batch=32) == 4 * 32
    assert "will overrun it" in said[-1]
    assert TimeBudget(600, start=now).plan(100, rate=50.0, step=0.2, batch=32) == 100  # never more than there is


def test_a_budget_too_small_for_a_trained_student_is_refused_naming_the_smallest_that_would_do(monkeypatch):
    """The plan's steps below min_steps: BudgetTooSmall naming --max-time N, the least whole 10 s whose plan (same
    measured rate, step and time spent) gives min_steps; N - 10 does not; without min_steps the plan runs."""
    from sharebert.pipelines.plan import TRAINED_STEPS, BudgetTooSmall, TimeBudget, trained_steps
    from sharebert.pipelines.quality import USEFUL_BATCH

    now = __import__("time").monotonic()
    monkeypatch.setattr("time.monotonic", lambda: now)  # the clock stands still: the figures follow from the math
    assert trained_steps(USEFUL_BATCH) == TRAINED_STEPS and trained_steps(16) == 2 * TRAINED_STEPS

    def budget(seconds):
        b = TimeBudget(seconds, after_sentences=3600, say=lambda _: None, start=now - 100)  # 100 s spent already
        b.min_steps, b.exports = TRAINED_STEPS, 1
        return b

    measured = dict(available=15000, rate=50.0, step=0.5, batch=32)
    with pytest.raises(BudgetTooSmall) as refused:
        budget(300).plan(**measured)
    smallest = budget(300).smallest(**measured)
    message = str(refused.value)
    assert f"fewer than the {TRAINED_STEPS:,} a trained student needs: give --max-time {smallest} or more" in message
    assert "100 s spent so far" in message and "--allow-untrained" in message and smallest % 10 == 0
    # 400 steps of 0.5 s and the pass they size (a third of the spend, 50 sentences a second) after the reserve
    assert smallest == 10 * -(-(100 + budget(300).reserve() + 1.5 * TRAINED_STEPS * 0.5) // 10)
    enough = budget(smallest)
    enough.plan(**measured)
    assert enough.planned_steps >= TRAINED_STEPS
    with pytest.raises(BudgetTooSmall):
        budget(smallest - 10).plan(**measured)
    untrained = budget(300)
    untrained.min_steps = None  # --allow-untrained
    untrained.plan(**measured)
    assert 0 < untrained.planned_steps < TRAINED_STEPS


@pytest.mark.slow
def test_the_published_student_is_the_model_alone_portable_and_reads_what_its_positions_allow(minilm_dir, tmp_path):
    """`--out/student` from a distillation's folder: no checkpoint, teacher vectors, metrics or marker; its
    tokenizer's model_max_length and the recipe's max_seq_length are the length it was trained at; AutoModel and
    SentenceTransformer load it with trust_remote_code=True in a process where sharebert cannot be imported."""
    from transformers import AutoTokenizer

    from sharebert.formats.recipe import read_recipe
    from sharebert.model.configuration_sharebert import ShareBertConfig
    from sharebert.model.modeling_sharebert import ShareBertModel
    from sharebert.pipelines.out_folder import publish_student
    from sharebert.training.distill_embedding_model import save_student
    from sharebert_runtime.outdir import mark_out

    work = tmp_path / "work" / "student"
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    assert tok.model_max_length == 512  # the teacher's tokenizer says more than the student has positions
    model = ShareBertModel(
        ShareBertConfig.from_preset("sharebert-tiny", vocab_size=len(tok), pooler="none", max_position_embeddings=128)
    )
    save_student(model, None, tok, work, read_recipe(minilm_dir), seq_len=128)
    (work / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (work / "teacher_targets-abc.npy").write_bytes(b"x")
    (work / "metrics.json").write_text("{}")
    mark_out(work, "distill")
    student = publish_student(work, tmp_path / "out" / "student", portable=True)
    names = {p.name for p in student.iterdir()}
    assert not names & {"checkpoints", "teacher_targets-abc.npy", "metrics.json", "sharebert_run.json"}
    assert {"configuration_sharebert.py", "modeling_sharebert.py", "modules.json", "config.json"} <= names
    assert json.loads((student / "tokenizer_config.json").read_text())["model_max_length"] == 128
    assert json.loads((student / "sentence_bert_config.json").read_text())["max_seq_length"] == 128
    code = (
        "import sys, json\n"
        "sys.modules['sharebert'] = sys.modules['transformers_sharebert'] = None  # import fails\n"
        "from transformers import AutoModel, AutoTokenizer\n"
        "from sentence_transformers import SentenceTransformer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "enc = tok('word ' * 1000, truncation=True, return_tensors='pt')\n"
        "out = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)(**enc).last_hidden_state\n"
        "st = SentenceTransformer(sys.argv[1], trust_remote_code=True, device='cpu')\n"
        "print(json.dumps([enc['input_ids'].shape[1], list(out.shape), st.encode(['a', 'b']).shape[1]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(student)],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    tokens, shape, width = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tokens == 128 and shape[1] == 128 and width == model.config.hidden_size


def test_pca_basis_gives_the_top_principal_directions_in_order():
    """The student's start (student_init): the covariance's eigenvectors are the SVD's right singular vectors, the
    largest variance first; k >= H keeps the space whole."""
    import torch

    from sharebert.training.student_init import pca_basis

    torch.manual_seed(0)
    table = torch.randn(2000, 24) @ torch.diag(torch.linspace(3.0, 0.1, 24)) @ torch.linalg.qr(torch.randn(24, 24))[0]
    mean, basis = pca_basis(table, 10)
    centred = table.double() - table.double().mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    assert torch.allclose(mean, table.mean(0), atol=1e-5) and basis.shape == (24, 10)
    assert torch.allclose((basis.double() * vh[:10].T).sum(0).abs(), torch.ones(10, dtype=torch.float64), atol=1e-5)
    variance = (centred @ basis.double()).var(0)
    assert (variance[:-1] >= variance[1:]).all()
    assert torch.equal(pca_basis(table, 30)[1], torch.eye(24, 30))


def test_the_teachers_quality_vectors_are_computed_once_per_teacher(tmp_path, monkeypatch):
    """The teacher's side of the report's measures is kept in the cache by the teacher's key and the texts; a damaged
    file is computed again; the plan counts what is cached (its reserve shrinks by those teacher passes)."""
    from sharebert.pipelines import plan, quality
    from sharebert.pipelines import teacher_pass as t

    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SHAREBERT_DATA", str(tmp_path / "empty"))  # no STS-B: held-out and search sets only
    calls = []

    def compute(texts):
        calls.append(len(texts))
        return np.arange(len(texts) * 3, dtype=np.float32).reshape(len(texts), 3)

    texts = ["a b c", "d e f"]
    first = t.cached_teacher_vectors("k1", texts, lambda: compute(texts))
    again = t.cached_teacher_vectors("k1", texts, lambda: compute(texts))
    assert np.array_equal(first, again) and calls == [2]
    t.cached_teacher_vectors("k2", texts, lambda: compute(texts))  # another teacher
    t.cached_teacher_vectors("k1", texts[:1], lambda: compute(texts[:1]))  # other texts
    assert calls == [2, 2, 1]
    t.vectors_path("k1", texts).write_bytes(b"not an array")
    assert np.array_equal(t.cached_teacher_vectors("k1", texts, lambda: compute(texts)), first) and calls[-1] == 2

    monkeypatch.setattr(quality, "teacher_vectors_key", lambda teacher: "kq")
    sets = quality.quality_texts()
    assert [len(s) for s in sets] == [600, 35, 105] and quality.quality_sentences() == 740
    assert quality.cached_quality_sentences("any") == 0
    t.cached_teacher_vectors("kq", sets[1], lambda: compute(sets[1]))
    assert quality.cached_quality_sentences("any") == 35
    budget = plan.TimeBudget(300, after_sentences=740, say=lambda _: None)
    budget.rate = 10.0
    before = budget.reserve()
    budget.cached_sentences = 35
    assert before - budget.reserve() == pytest.approx(3.5)


def test_padded_tokens_of_a_length_sorted_pass():
    """The teacher's pass sorts its texts by length: each batch costs its longest text times its size."""
    from sharebert.training.distill_embedding_budget import padded_tokens

    assert padded_tokens([5, 1, 3, 2], batch=2) == 2 * 2 + 2 * 5  # batches (1, 2) and (3, 5)
    assert padded_tokens([7, 7, 7], batch=2) == 21 and padded_tokens([4], batch=64) == 4
    lengths = list(range(1, 129))
    assert padded_tokens(lengths, batch=1) == sum(lengths)  # no padding at all
    assert padded_tokens(lengths, batch=128) == 128 * 128  # one batch: everything padded to the longest
    assert sum(lengths) < padded_tokens(lengths, batch=64) == 64 * 64 + 64 * 128 < 128 * 128


def test_a_training_text_of_a_handful_of_tokens_is_said_and_a_vocab_size_above_the_teachers_refused(minilm_dir):
    """2,000 lines of emoji are all the unknown token for MiniLM's WordPiece: the cut says so in its line (the log
    and report.md's summary both carry ``describe()``), with what to do, and has no word to add strings of (compress
    ended in an internal IndexError); real text of 100 lines is not warned about.
    ``--vocab-size`` above the teacher's 30,522 tokens is refused naming both (10**12 was cut to 527 tokens)."""
    from transformers import AutoTokenizer

    from sharebert.training.corpus import vocabulary_words
    from sharebert.training.vocab import cut_vocabulary, plan_vocabulary

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    emoji = ["".join(chr(0x1F600 + (i * 7 + j) % 80) for j in range(8)) for i in range(2000)]
    cut = cut_vocabulary(tok, emoji, 5000)
    line = cut.describe()
    assert vocabulary_words(cut.tokenizer) == []  # no whole word to add strings of: an IndexError inside transformers
    assert "WARNING: the training text uses only 1 distinct tokens of the teacher's 30,522" in line
    assert "100% of its tokens the unknown token" in line and "--train FILE of thousands of sentences" in line
    text = packaged_corpus().read_text(encoding="utf-8").splitlines()[:100]
    assert "WARNING" not in cut_vocabulary(tok, text, 5000).describe()
    shape = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "max_length": 256}
    with pytest.raises(ValueError, match=r"--vocab-size 1,000,000,000,000 is more than the teacher's 30,522 tokens"):
        plan_vocabulary(tok, shape, {}, lambda *_: None, lambda: text, 10**12, print)
