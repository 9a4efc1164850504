"""--max-time's plan (sharebert.pipelines.plan): a budget too small is refused before the teacher's export, naming the
smallest that would do with the export estimated; a --resume carries the seconds its run already spent. The clock
stands still (the figures follow from the math). The refusal before the export end to end, on the real teacher:
tests/pipelines/test_compress_anywhere.py (a folder named masked-LM, a --max-time of 5 s)."""

from __future__ import annotations

import json
import time

import pytest

from sharebert.pipelines.plan import (
    EXPORT_SENTENCES,
    TEACHER_RUNGS,
    TRAINED_STEPS,
    BudgetTooSmall,
    TimeBudget,
)

MEASURED = dict(available=15000, rate=50.0, step=0.5, batch=32)  # the teacher's sentences/s, a student step


@pytest.fixture
def now(monkeypatch):
    """The clock stands still: no stall of a loaded machine counts."""
    t = time.monotonic()
    monkeypatch.setattr("time.monotonic", lambda: t)
    return t


def _budget(seconds, now, said, spent=20.0):
    b = TimeBudget(seconds, after_sentences=3600, say=said.append, start=now - spent)
    b.min_steps, b.exports = TRAINED_STEPS, 1
    return b


def test_a_budget_too_small_is_refused_before_the_export_naming_the_smallest_with_the_export_in_it(now):
    """Before the export: the estimated export counts in the reserve; the refusal names --max-time N, the least whole
    10 s whose plan gives TRAINED_STEPS with that export to come; N passes and says the estimate, N - 10 does not.
    The estimate is dropped after the plan (the real plan, after the export, counts the seconds it took)."""
    from sharebert.training.distill_embedding_budget import RATE_SAMPLE

    said = []
    export = TEACHER_RUNGS * (TimeBudget.EXPORT_SECONDS + EXPORT_SENTENCES / 50.0) + RATE_SAMPLE / 50.0
    with pytest.raises(BudgetTooSmall) as refused:
        _budget(300, now, said).before_export(**MEASURED, export=export)
    probe = _budget(300, now, said)
    probe.teacher_export = export
    smallest = probe.smallest(**MEASURED)
    assert smallest == 10 * -(-(20 + probe.reserve() + 1.5 * TRAINED_STEPS * 0.5) // 10)  # the pass: a third more
    message = str(refused.value)
    assert f"give --max-time {smallest} or more" in message and "\n" not in message
    assert f"the teacher's export ~{export:.0f} s of it, estimated: not cached" in message
    enough = _budget(smallest, now, said)
    enough.before_export(**MEASURED, export=export)
    assert enough.planned_steps >= TRAINED_STEPS and enough.teacher_export == 0.0
    assert enough.reserve() == _budget(smallest, now, []).reserve()
    assert said == [
        f"the teacher's artifact is not cached: its export is estimated at ~{export:.0f} s (the teacher at ~50 "
        f"sentences/s, a student step 0.50 s, measured now), which leaves about {enough.planned_steps:,} steps of 32 "
        f"in --max-time {smallest} s"
    ]
    with pytest.raises(BudgetTooSmall):
        _budget(smallest - 10, now, said).before_export(**MEASURED, export=export)
    untrained = _budget(300, now, said)
    untrained.min_steps = None  # --allow-untrained: the estimate is said, the run goes on
    untrained.before_export(**MEASURED, export=export)
    assert 0 < untrained.planned_steps < TRAINED_STEPS and "not cached" in said[-1]


def _checkpoint(folder, used):
    folder.mkdir(parents=True)
    clock = {"args": {"seconds": 150.0}, "attributes": {"used_seconds": used, "reached": False}}
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": 40, "stateful_callbacks": {"WallClockLimit": clock}})
    )
    return folder


def test_a_resume_carries_the_seconds_its_run_spent_and_stops_at_the_budget_in_all(now, tmp_path):
    """The run it continues spent 70 s before training and 50 s of training (its checkpoint's WallClockLimit): 180 s of
    300 are left; the training clock is the checkpoint's 50 s plus what is left less the end's reserve, so the
    resumed run stops at 300 s in all, not 300 more; the record keeps 70 s for a second resume."""
    from sharebert_runtime.outdir import read_json

    checkpoint = _checkpoint(tmp_path / "checkpoint-40", used=50.0)
    record = tmp_path / "budget.json"
    record.write_text(json.dumps({"before_training": 70.0, "rate": 40.0, "planned_steps": 500}))
    said = []
    b = TimeBudget(300, after_sentences=100, say=said.append, start=now)
    b.carry(record, checkpoint)
    assert b.left() == 180 and b.trained_before == 50 and b.rate == 40 and b.planned_steps == 500
    assert said == [
        "--resume: 120 s of --max-time 300 s were spent by the run it continues (70 s before its training, 50 s of "
        "training); 180 s are left"
    ]
    b.record = record
    assert b.training_seconds() == pytest.approx(50 + 180 - b.reserve())
    assert read_json(record)["before_training"] == pytest.approx(70)
    lost = TimeBudget(300, say=said.append, start=now)  # no record (a run stopped by an older sharebert): said
    lost.carry(tmp_path / "missing.json", checkpoint)
    assert lost.left() == 250 and lost.rate is None and "left no record of its time before training" in said[-1]


def test_a_fresh_run_records_the_seconds_it_spent_before_training(now, tmp_path):
    from sharebert_runtime.outdir import read_json

    b = TimeBudget(300, start=now - 40)
    b.rate, b.planned_steps, b.record = 25.0, 700, tmp_path / "budget.json"
    assert b.training_seconds() == pytest.approx(260 - b.reserve())
    assert read_json(b.record) == {"before_training": 40.0, "rate": 25.0, "planned_steps": 700}


@pytest.mark.parametrize(
    "stat, uptime, age",
    [
        ("4242 (python) R " + " ".join(["0"] * 18) + " 100000 12 34", "1012.50 33.0", 12.5),  # 100,000 ticks = 1,000 s
        ("4242 (a) b (c) R " + " ".join(["0"] * 18) + " 100000 12 34", "1012.50 33.0", 12.5),  # a name with ") "
        ("4242 (python) R " + " ".join(["0"] * 18) + " 100000", "900.0 1.0", 0.0),  # started after "now": disagree
        ("garbage", "1.0 1.0", 0.0),
    ],
)
def test_the_budget_counts_from_the_process_start(monkeypatch, now, stat, uptime, age):
    """--max-time counts the interpreter's start and the imports: process_start is now less the process's age (the
    uptime less its start in clock ticks since boot, 100 a second here); where /proc says nothing sensible, now."""
    import builtins
    import io
    import os

    from sharebert.pipelines import plan

    real_open = builtins.open
    files = {"/proc/self/stat": stat, "/proc/uptime": uptime}
    monkeypatch.setattr(
        builtins, "open", lambda p, *a, **k: io.StringIO(files[p]) if p in files else real_open(p, *a, **k)
    )
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    assert plan.process_start() == pytest.approx(now - age)


@pytest.mark.parametrize("program", [True, False])
def test_the_budget_counts_from_the_process_start_only_where_the_process_is_the_command(monkeypatch, program):
    """`sharebert compress` as a program counts its interpreter's start; main(argv) called inside a Python process
    that has run for an hour (a notebook, a test worker) counts from the call, or that hour spends the budget."""
    from sharebert.commands import compress as command
    from sharebert.pipelines import plan
    from sharebert_runtime import main

    monkeypatch.setattr(main, "PROGRAM", program)
    monkeypatch.setattr(plan, "process_start", lambda: time.monotonic() - 3600)
    before = time.monotonic()
    started = command.clock_start()
    after = time.monotonic()
    hour = 3600 if program else 0  # the process's age, or none: the order of readings, never their distance
    assert before - hour <= started <= after - hour


@pytest.mark.slow
def test_a_resumed_distillation_under_a_budget_continues_its_run_clock(tmp_path, stepped_clock):
    """End to end on real checkpoints of a tiny BERT teacher's distillation (each training step 0.5 s on the stepped
    clock): a budgeted run of 4 steps
    records its seconds before training; a second budget carrying them from checkpoint-4 counts its 2 s of training,
    and the resumed training's clock is that budget's (the 2 s and what is left less the end's reserve: at most the
    budget less the first run's time before training), continuing from 2 s to 3 s at step 6."""
    from tiny_teachers import build

    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.callbacks import latest_checkpoint, trainer_state
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert_runtime.outdir import read_json

    weights = DistillWeights(hidden=0, attention=0, embedding=0)
    args = EmbeddingArgs(batch_size=4, lr=1e-3, warmup_steps=0, max_train_samples=16, weights=weights, max_steps=4)
    out, record, said = tmp_path / "run", tmp_path / "budget.json", []
    shape = {"embedding_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    run = dict(overrides=shape, progress=False, score_sts=False)
    teacher = build(tmp_path / "teachers", "bert")["embedding"]
    first = TimeBudget(10_000, say=said.append, start=time.monotonic() - 100)
    first.record = record
    distill_embedding(teacher, "sharebert-tiny", out, args=args, budget=first, **run)
    before = read_json(record)["before_training"]
    assert before >= 100 and first.planned_steps > 0
    second = TimeBudget(10_000, say=said.append)
    second.carry(record, latest_checkpoint(out / "checkpoints"))
    assert second.trained_before == 2.0 and second.planned_steps == first.planned_steps
    assert said[-1].startswith(f"--resume: {before + 2:.0f} s of --max-time 10000 s were spent by the run it")
    longer = EmbeddingArgs(**{**args.__dict__, "max_steps": 6})
    distill_embedding(teacher, "sharebert-tiny", out, args=longer, resume=True, budget=second, **run)
    clock = trainer_state(out / "checkpoints" / "checkpoint-6")["stateful_callbacks"]["WallClockLimit"]
    assert clock["attributes"]["used_seconds"] == 3.0
    assert 2.0 < clock["args"]["seconds"] <= 10_000 - before


class _Measures:
    """The quality measures' cost as quality.MeasureCount gives it, without the files: 600 held-out sentences, 140
    search texts (never sized), STS-B dev's two sides of 1,500 and ``pairs`` --eval-pairs rows; none cached."""

    def __init__(self, pairs=0):
        self.pairs, self.most = pairs, 1500

    def __call__(self, rows):
        rows = 10**9 if rows is None else rows
        return min(rows, 600) + 140 + 2 * min(rows, 1500) + 2 * min(rows, self.pairs), 0


def _measured_budget(seconds, now, said, pairs=0, spent=20.0):
    """An --allow-untrained budget (no refusal) whose measures can be sized; the end's exports and probes as compress
    leaves them after the teacher's export (one export)."""
    measures = _Measures(pairs)
    b = TimeBudget(seconds, after_sentences=measures(None)[0], say=said.append, start=now - spent)
    b.exports, b.measures = 1, measures
    return b


def test_a_budget_that_cannot_pay_for_every_measure_sizes_them_and_says_so(now):
    """At 10 sentences/s all 3,740 quality sentences take 430 s (1.15x for the student's side): a 300 s budget gives
    them at most MEASURE_SHARE of what the exports and probes leave, and the plan cuts every sized list to the most
    rows that fit (the next row would not), says it, and keeps the rest for the pass and training."""
    said = []
    b = _measured_budget(300, now, said)
    b.plan(**{**MEASURED, "rate": 10.0})
    room = TimeBudget.MEASURE_SHARE * (
        280 - (TimeBudget.EXPORT_SECONDS + 2 * 128 / 10.0 + 2 * TimeBudget.PROBE_SECONDS)
    )
    rows = b.measure_rows
    assert TimeBudget.MEASURE_FLOOR < rows < 1500
    assert b.measure_seconds(rows) <= room < b.measure_seconds(rows + 1)
    assert b.measure_seconds(rows) == pytest.approx((1.15 * (min(rows, 600) + 140 + 2 * rows)) / 10.0)
    assert b.reserve() == pytest.approx(25 + 25.6 + 16 + b.measure_seconds(rows))
    assert f"the quality measures cut to {rows:,} evenly spaced rows of each list" in said[0]
    assert f"all of them take ~{1.15 * 3740 / 10:.0f} s: the budget" in said[0] and len(said) == 1
    assert b.planned_steps > 0  # the rest of the 300 s trains


def test_a_budget_with_time_to_spare_measures_everything(now):
    """The same measures at 50 sentences/s in a 600 s budget: all of them (86 s) fit their share; nothing is cut, the
    plan line says no cut, and the reserve counts every sentence; at the end, with time left, still all."""
    said = []
    b = _measured_budget(600, now, said)
    b.plan(**MEASURED)
    assert b.measure_rows is None and "cut to" not in said[0]
    assert b.reserve() == pytest.approx(25 + 2 * 128 / 50 + 16 + 1.15 * 3740 / 50)
    assert b.measure_rows_now() is None and len(said) == 1 and not b.cut_probes()  # the probes time all their runs
    late = _measured_budget(600, now, [], spent=600 - 16 - 1.15 * 3740 / 50 + 20)  # 20 s short, within END_SLACK
    late.rate = 50.0
    assert late.measure_rows_now() is None and not late.cut_probes()
    later = _measured_budget(600, now, [], spent=600 - 1.15 * 3740 / 50 + 40)  # the measures 40 s short: cut
    later.rate = 50.0
    assert later.cut_probes() and 100 < later.measure_rows_now() < 1500


def test_a_budget_already_spent_measures_the_floor_and_says_it_overruns(now):
    """At the end, 10 s past --max-time (more than its END_SLACK of 3 s): the measures keep their floor of
    MEASURE_FLOOR rows (fewer would mean nothing) and the line says by how much the run overruns; a list shorter than
    the floor (--eval-pairs of 5 rows) is kept whole."""
    said = []
    b = _measured_budget(60, now, said, pairs=5, spent=70.0)
    b.rate = 10.0
    assert b.cut_probes()  # the probes time report.PROBE_FEWEST runs
    assert b.measure_rows_now() == TimeBudget.MEASURE_FLOOR
    cost = 1.15 * (100 + 140 + 200 + 10) / 10.0
    assert b.measure_seconds(100) == pytest.approx(cost)
    assert said == [
        f"-10 s of --max-time are left: the quality measures cut to 100 evenly spaced rows of each list (held-out "
        f"sentences, --eval-pairs, STS-B dev pairs; up to 1,500), ~{cost:.0f} s where all of them take "
        f"~{1.15 * 3750 / 10:.0f} s: the budget; even the fewest that still mean something (100 rows) take "
        f"~{cost:.0f} s more than the budget has for them: the run will overrun --max-time by that much"
    ]


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), 0.0, -3.0])
def test_a_rate_that_is_no_positive_finite_number_plans_at_the_default(now, rate):
    """A teacher rate measured as NaN, infinite, zero or negative plans as before any was measured (50 a second):
    finite figures, the measures sized as at 50, no division by zero."""
    said, at_50 = [], _measured_budget(300, now, [])
    at_50.plan(**MEASURED)
    b = _measured_budget(300, now, said)
    n = b.plan(**{**MEASURED, "rate": rate})
    assert n == at_50.plan(**MEASURED) and b.measure_rows == at_50.measure_rows
    assert b.reserve() == pytest.approx(at_50.reserve()) and "at 50 sentences/s" in said[0]


def test_the_sized_measures_are_evenly_spaced_and_their_labels_say_so(tmp_path):
    """quality.Spread keeps rows evenly spaced (STS-B dev is ordered by genre: its last pairs are news), the
    --eval-pairs file shorter than the rows whole; the tests' int limit stays the first N."""
    from sharebert.pipelines.quality import Spread, _pair_sets, quality_texts, taken, which

    assert taken(1500, Spread(200)) == [i * 15 // 2 for i in range(200)]  # the last, 1,492: a news pair
    assert taken(5, Spread(100)) == [0, 1, 2, 3, 4] and taken(1500, 3) == [0, 1, 2] and taken(4, None) == [0, 1, 2, 3]
    assert which(200, 1500, Spread(200)) == "200 of 1500 pairs, evenly spaced: sized to --max-time"
    assert which(200, 1500, 200) == "the first 200 of 1500 pairs" and which(1500, 1500, None) == "all 1500 pairs"
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"sentence {i}\tanother {i}\t{i % 2}\n" for i in range(5)))
    texts = quality_texts(pairs, Spread(100))
    assert [len(t) for t in texts[:5]] == [100, 35, 105, 5, 5]
    sets = {key: (a, kept) for key, _, a, _, _, kept in _pair_sets(pairs, Spread(100))}
    assert sets["eval_pairs_spearman"] == ([f"sentence {i}" for i in range(5)], "all 5 pairs")
    if "sts_spearman" in sets:  # the data folder holds STS-B
        assert (
            len(sets["sts_spearman"][0]) == 100
            and sets["sts_spearman"][1] == "100 of 1500 pairs, evenly spaced: sized to --max-time"
        )


def test_the_measures_cut_to_the_budget_are_computed_on_the_spread_rows(monkeypatch, tmp_path):
    """embedding_quality under Spread(100): each sized list's 100 evenly spaced rows are what teacher and student
    encode (no model: each text's vector a fixed random one, the student's the teacher's plus noise), the search
    queries whole, and every label says the cut; the figures are finite."""
    import math
    import zlib

    import numpy as np

    from sharebert.pipelines import quality

    def teacher(texts):
        return np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=8) for t in texts])

    teacher.path = "torch"
    encoded = []
    monkeypatch.setattr(quality, "teacher_vectors_key", lambda t: "key")
    monkeypatch.setattr(quality, "cached_teacher_vectors", lambda key, texts, compute: compute())
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"sentence {i}\tanother {i % 7}\t{i % 5}\n" for i in range(300)))

    def student(texts):
        encoded.append(len(texts))
        return list(teacher(texts) + 0.3 * np.random.default_rng(0).normal(size=(len(texts), 8)))

    q = quality.embedding_quality(None, student, pairs, lambda line: None, quality.Spread(100), teacher)
    labels = {key: row["label"] for key, row in q["measures"].items()}
    assert "100 of 600 held-out WikiText-2 sentences, evenly spaced: sized to --max-time" in labels["agreement_cosine"]
    assert labels["eval_pairs_spearman"].endswith("(100 of 300 pairs, evenly spaced: sized to --max-time)")
    assert "(35 queries over 105 sentences)" in labels["search_top1"]
    assert encoded[:5] == [100, 35, 105, 100, 100]
    assert all(math.isfinite(row["student"]) and math.isfinite(row["teacher"]) for row in q["measures"].values())


def test_a_run_whose_budget_planned_no_step_is_said_untrained():
    """--allow-untrained at a --max-time the imports and the export spent: the plan had 0 steps, the floor's 1 step
    ran; the verdict says untrained (it said '1 of the 0 planned steps' and not untrained)."""
    from sharebert.pipelines.quality import search_verdict

    training = {"steps": 1, "train_seconds": 6.9, "train_sentences": 128, "train_word_strings": 64}
    r = {"student": {"search_top1": 14 / 35, "agreement_cosine": 0.17}, "training": training}
    v = search_verdict(r, 32, planned=0, available=15000, elapsed=630.0, queries=35)
    assert v["untrained"] and not v["usable_for_search"]
    assert "It trained 1 steps of 32" in v["lines"][1] and "of the 0 planned" not in v["lines"][1]
    assert v["lines"][1].endswith(
        "The budget left no time to train (--allow-untrained ran it anyway): it is untrained."
    )
