"""A classifier compress's ``--max-time`` (pipelines/classifier_plan.ClassifierPlan): the whole command's seconds
split between the teacher's export, the two phases and the end, a budget too small refused before any export naming
the smallest that would do, and the task phase's clock ending where the end's costs begin. The arithmetic is asserted
from the plan's own numbers, never a clock."""

import json

import pytest

from sharebert.pipelines.classifier_plan import (
    RUN_SECONDS,
    TASK_SHARE,
    ClassifierPlan,
    PhaseBudget,
    carry,
    task_clock,
)
from sharebert.pipelines.plan import TimeBudget

PLAN = ClassifierPlan(rate=10.0, step=0.5, batch=32, general_sentences=1000, task_texts=200, dev_rows=100, export=60.0)


def test_the_end_and_the_task_pass_are_the_sentences_they_run_at_the_measured_rate():
    b = TimeBudget
    assert PLAN.end() == pytest.approx(b.EXPORT_SECONDS + 128 / 10 + 2 * b.PROBE_SECONDS + 1.3 * 100 / 10)
    assert PLAN.task_pass() == pytest.approx((200 + 100) / 10)


def test_what_the_export_and_the_end_leave_is_split_between_the_phases():
    both = 600 - 60 - PLAN.end()
    general, task, steps = PLAN.split(600)
    assert task == pytest.approx(PLAN.task_pass() + TASK_SHARE * (both - PLAN.task_pass()))  # its pass first
    assert general + task == pytest.approx(both)
    encoded = int(min(1000, max(4 * 32, 10 * general / 3)))  # the general phase's teacher pass: a third of its span
    assert PLAN.general_pass(general) == encoded
    assert steps == int(((general - encoded / 10) + (task - PLAN.task_pass())) / 0.5)
    assert PLAN.split(PLAN.export + PLAN.end() - 5) == (0.0, 0.0, 0)  # nothing left: no steps, never negative
    assert [PLAN.split(s)[2] for s in (200, 400, 800, 1600)] == sorted(PLAN.split(s)[2] for s in (200, 400, 800, 1600))
    slow = ClassifierPlan(14.0, 2.2, 32, general_sentences=1000, task_texts=1000, dev_rows=400, export=85.0)
    general, task, _ = slow.split(243)  # the loaded box's real run: a pass of 1,400 texts ~100 s, 72 s to split
    assert task == pytest.approx(243 - 85 - slow.end()) and general == 0.0  # never a share smaller than its pass


@pytest.mark.parametrize("spent", [0.0, 37.0])
def test_the_smallest_budget_named_is_the_least_whole_ten_seconds_that_plans_enough_steps(spent):
    need = 400
    smallest = PLAN.smallest(spent, need)
    assert smallest % 10 == 0
    assert PLAN.split(smallest - spent)[2] >= need > PLAN.split(smallest - 10 - spent)[2]


def test_a_budget_too_small_is_refused_in_one_line_naming_the_smallest_and_a_sufficient_one_is_not():
    need = 400
    why = PLAN.refusal(300, 20.0, need)
    assert why is not None and "\n" not in why
    assert f"give --max-time {PLAN.smallest(20.0, need)} or more" in why
    assert f"leaves {PLAN.split(280)[2]:,} steps of 32" in why and "the teacher's export ~60 s" in why
    assert "--allow-untrained" in why and "--max-train-samples" in why
    assert PLAN.refusal(PLAN.smallest(20.0, need), 20.0, need) is None


def test_the_general_phase_ends_before_the_task_phase_and_the_end():
    whole = TimeBudget(600, say=lambda line: None, start=0.0)
    phase = PhaseBudget(whole, later=250.0)
    assert (phase.seconds, phase.start, phase.reserve()) == (600, 0.0, 250.0)
    assert phase.min_steps is None  # the whole plan refused first; the phase only sizes itself


def test_a_general_phase_with_no_time_to_train_says_its_plan_and_no_embedding_overrun():
    """Its share spent (the task phase and the end take what is left): the phase plans its fewest sentences and says
    what follows it; the embedding path's "exporting and measuring ... will overrun" is not this run's to say (the
    whole plan warns when the command cannot hold). The embedding path's budget still says it."""
    for budget, after, overrun in (
        (lambda say: PhaseBudget(TimeBudget(300, say=say, start=0.0), later=10_000.0), "the task phase", False),
        (lambda say: TimeBudget(60, after_sentences=3600, say=say, start=0.0), "export, speed and quality", True),
    ):
        said = []
        assert budget(said.append).plan(15000, rate=50.0, step=0.2, batch=32) == 4 * 32
        assert after in said[0] and any("will overrun it" in line for line in said) is overrun, said


def test_the_task_clock_is_set_when_training_begins_to_what_the_whole_budget_has_left_less_the_end():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    class Left:
        seconds = 300.0

        def left(self):
            return self.seconds

    budget = Left()
    clock = task_clock(budget, end=40.0)
    budget.seconds = 180.0  # the teacher's logits took 120 s before training began
    state = TrainerState()
    clock.on_train_begin(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl())
    assert clock.seconds == pytest.approx(clock.used() + 140.0, abs=0.5)
    resumed = task_clock(budget, end=40.0)  # a checkpoint that trained 30 s: its seconds count on top
    assert type(resumed).__name__ == "WallClockLimit"  # checkpoints keep its state under that name
    state.stateful_callbacks["WallClockLimit"] = {"attributes": {"used_seconds": 30.0}}
    resumed.on_train_begin(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl())
    assert resumed.seconds == pytest.approx(30.0 + 140.0, abs=0.5)


def test_a_resume_carries_the_seconds_its_run_spent_to_the_end_of_its_general_phase(tmp_path):
    said = []
    budget = TimeBudget(600, say=said.append, start=1000.0)
    carry(budget, {"general": {"steps": 5, RUN_SECONDS: 240.0}}, tmp_path)
    assert budget.start == 760.0 and "240 s of --max-time 600 s were spent by the run it continues" in said[0]
    for phases in ({}, {"general": {RUN_SECONDS: float("nan")}}, {"general": {RUN_SECONDS: "240"}}):
        untouched = TimeBudget(600, say=said.append, start=1000.0)
        carry(untouched, phases, tmp_path)  # nothing recorded, or not a count of seconds: nothing carried
        assert untouched.start == 1000.0
    finished = TimeBudget(600, say=said.append, start=1000.0)
    carry(finished, {"general": {RUN_SECONDS: 240.0}, "task": {"steps": 5}}, tmp_path)  # nothing left to train
    assert finished.start == 1000.0 and len(said) == 1


def _stopped_in_training(folder, step: int, trained: float):
    """``folder/checkpoints/checkpoint-<step>`` as a stopped run leaves it: the trainer state transformers saves, its
    ``WallClockLimit`` having trained ``trained`` seconds, and the completion marker."""
    from transformers import TrainerState

    from sharebert.training.callbacks import WallClockLimit, mark_complete

    clock = WallClockLimit(1000.0)
    clock._start, clock._end = 0.0, trained  # WallClockLimit.used(): the seconds between them
    checkpoint = folder / "checkpoints" / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    TrainerState(global_step=step, stateful_callbacks={"WallClockLimit": clock.state()}).save_to_json(
        str(checkpoint / "trainer_state.json")
    )
    mark_complete(checkpoint, step)


@pytest.fixture
def now(monkeypatch):
    """time.monotonic() stands at 10,000 s for the test: the budgets' arithmetic, no clock read."""
    import time

    monkeypatch.setattr(time, "monotonic", lambda: 10_000.0)
    return 10_000.0


def test_a_resume_of_a_general_phase_stopped_in_training_carries_its_seconds_before_and_in_training(tmp_path, now):
    """Issue 46: "--resume continues the run's clock". The run spent 100 s before its general phase's training (the
    export, the pass: recorded when training began) and 150 s training (its checkpoint's clock): the resumed run starts
    with 250 s of 600 gone, and its general phase's clock goes on from the 150 s to where its share ends."""
    from sharebert.pipelines.classifier_plan import CLOCK

    first = TimeBudget(600, say=lambda line: None, start=now - 100.0)
    PhaseBudget(first, later=200.0, out=tmp_path).training_seconds()  # the first run's training begins
    _stopped_in_training(tmp_path / "general", 5, trained=150.0)
    said = []
    resumed = TimeBudget(600, say=said.append)
    carry(resumed, {}, tmp_path)
    assert resumed.left() == pytest.approx(350.0) and resumed.trained_before == 150.0
    assert "250 s of --max-time 600 s were spent by the run it continues (100 s before its general phase's" in said[0]
    clock = PhaseBudget(resumed, later=200.0, out=tmp_path).training_seconds()
    assert clock == pytest.approx(150.0 + 350.0 - 200.0)
    assert json.loads((tmp_path / CLOCK).read_text())["general"] == pytest.approx(100.0)  # not 250: once


def test_a_resume_of_a_task_phase_stopped_in_training_carries_the_whole_runs_seconds(tmp_path, now):
    """The general phase ended at 240 s, the teacher's logits took 60 s more, the task phase trained 100 s: the resumed
    run starts with 400 s gone (not the 240 s of the general phase alone), and the task clock goes on from its 100 s to
    what is left less the end."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "unused"), report_to=[])
    phases = {"general": {"steps": 5, RUN_SECONDS: 240.0}}
    first = TimeBudget(600, say=lambda line: None, start=now - 300.0)
    task_clock(first, end=40.0, out=tmp_path).on_train_begin(args, TrainerState(), TrainerControl())
    _stopped_in_training(tmp_path / "student", 9, trained=100.0)
    said = []
    resumed = TimeBudget(600, say=said.append)
    carry(resumed, phases, tmp_path)
    assert resumed.left() == pytest.approx(200.0) and resumed.trained_before == 0.0
    assert "400 s of --max-time 600 s were spent" in said[0] and "100 s of that training" in said[0]
    state = TrainerState(stateful_callbacks={"WallClockLimit": {"attributes": {"used_seconds": 100.0}}})
    clock = task_clock(resumed, end=40.0, out=tmp_path)
    clock.on_train_begin(args, state, TrainerControl())
    assert clock.seconds == pytest.approx(100.0 + 200.0 - 40.0)


@pytest.mark.parametrize("record", ["{not json", "[1, 2]", None])
def test_a_resume_whose_clock_record_is_unreadable_or_missing_counts_the_checkpoints_training_and_says_so(
    tmp_path, record
):
    from sharebert.pipelines.classifier_plan import CLOCK

    if record is not None:
        (tmp_path / CLOCK).write_text(record)
    _stopped_in_training(tmp_path / "general", 5, trained=150.0)
    said = []
    resumed = TimeBudget(600, say=said.append, start=1000.0)
    carry(resumed, {}, tmp_path)
    assert resumed.start == 850.0 and "left no record of its time before training" in said[0]


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tiny_teachers import trained_classifier

    return trained_classifier(tmp_path_factory.mktemp("plan"), "bert", steps=1)


@pytest.mark.slow
def test_a_classifier_budget_too_small_is_refused_before_any_export(tiny_classifier, tmp_path, capsys, monkeypatch):
    """--max-time 20 cannot train a student here: refused in one line naming a larger whole-ten budget, nothing
    exported, no out parts left, the teacher's artifact not cached."""
    import re

    from sharebert_runtime.main import main

    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["compress", str(tiny_classifier), "--out", str(out), "--max-time", "20", "--max-train-samples", "200"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fewer than the" in err, err
    named = int(re.search(r"give --max-time (\d+) or more", err).group(1))
    assert named > 20 and named % 10 == 0
    assert not (out / "teacher_artifact").exists() and not (out / "general").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("manifest.json"))


def test_a_classifier_run_stopped_between_its_phases_run_again_is_told_to_resume(tmp_path):
    """Ctrl-C after the general phase was recorded (its checkpoints removed) and before the task phase's first
    checkpoint (its teacher logits): the same command again names --resume, which continues from phases.json; a
    run with neither phases nor checkpoints names --overwrite alone."""
    from sharebert.pipelines.out_folder import COMMAND, check_out
    from sharebert_runtime.outdir import mark_out

    teacher, out = tmp_path / "teacher", tmp_path / "out"
    teacher.mkdir()
    mark_out(out, COMMAND, {})
    (out / "teacher_artifact").mkdir()
    with pytest.raises(ValueError) as plain:
        check_out(out, teacher, None, overwrite=False, resume=False)
    assert "--resume" not in str(plain.value) and "pass --overwrite" in str(plain.value)
    (out / "phases.json").write_text(json.dumps({"general": {"steps": 5, RUN_SECONDS: 240.0}}))
    with pytest.raises(ValueError) as stopped:
        check_out(out, teacher, None, overwrite=False, resume=False)
    said = str(stopped.value)
    assert "stopped before its end (its finished phases, phases.json): pass --resume to continue it" in said
    assert check_out(out, teacher, None, overwrite=False, resume=True) == out
