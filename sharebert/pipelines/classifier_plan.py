"""``--max-time`` for a classifier's whole compress (``compress_classifier``): what is measured before any export or
pass (torch's threads fitted on the student's step, the teacher's speed), the plan made from it
(:class:`ClassifierPlan`: the teacher's export, the task's logits, the end's export and measures, and what is left
split between the two phases), refused when too small naming the smallest budget that would do, and the clocks each
phase trains under (:class:`PhaseBudget`, :func:`task_clock`); a ``--resume`` carries its run's seconds
(:func:`carry`). Torch-free at import."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .plan import EXPORT_SENTENCES, TEACHER_RUNGS, TIMED_SENTENCES, BudgetTooSmall, TimeBudget, _seconds
from .run import CompressRun, Student

# Of the seconds the plan leaves the two phases, the task distillation's (its teacher pass over the task's rows in it);
# the rest is the general phase's (its teacher pass sized in it, at most a third). Even: the lab's best student had a
# long general phase, but a short one that never reaches the task leaves the classifier head untrained.
TASK_SHARE = 0.5
PARITY_SENTENCES = 128  # an export's parity pass through PyTorch (``export_once``'s check_limit)


@dataclass
class ClassifierPlan:
    """``--max-time`` for a classifier's whole compress, from what was measured before any work: the teacher's
    sentences a second in PyTorch (``rate``), one student step (``step``, seconds, batches of ``batch``), the
    unlabelled sentences the general phase may take, the teacher's texts of the task phase (its training rows times
    1 + ``--augment``, and the dev rows it scores the teacher on), the dev rows each artifact is scored on at the end,
    and the teacher's export still to come (``export`` seconds; 0: cached). Seconds, texts and steps only: the
    arithmetic is tested without a clock."""

    rate: float
    step: float
    batch: int
    general_sentences: int
    task_texts: int
    dev_rows: int
    export: float = 0.0

    def end(self) -> float:
        """Seconds after training: the student's export (its parity pass through PyTorch), two probes, the dev rows
        through both artifacts and the student's last scoring (each student text :data:`TimeBudget.STUDENT_SHARE`
        of a teacher one)."""
        b = TimeBudget
        return (
            b.EXPORT_SECONDS
            + PARITY_SENTENCES / self.rate
            + 2 * b.PROBE_SECONDS
            + (1 + 2 * b.STUDENT_SHARE) * self.dev_rows / self.rate
        )

    def task_pass(self) -> float:
        """The teacher's logits over the task phase's texts (training rows and their copies, the dev rows)."""
        return (self.task_texts + self.dev_rows) / self.rate

    def general_pass(self, span: float) -> int:
        """The sentences the general phase's teacher encodes in ``span`` seconds (``TimeBudget``'s rule: at most a
        third of it, at least four batches, at most what there is)."""
        return int(min(self.general_sentences, max(4 * self.batch, self.rate * max(span, 0.0) / 3)))

    def split(self, seconds: float) -> tuple[float, float, int]:
        """``(general phase's seconds, task phase's seconds, steps)`` of a run with ``seconds`` left before the
        teacher's export: what the export and :meth:`end` leave goes first to the task phase's teacher pass (it
        cannot be cut short: a share smaller than it overran the budget by the difference), then :data:`TASK_SHARE`
        of the rest to the task phase's training; the steps both phases train in it once their passes are done."""
        both = max(seconds - self.export - self.end(), 0.0)
        task = min(both, self.task_pass() + TASK_SHARE * max(both - self.task_pass(), 0.0))
        general = both - task
        train = max(general - self.general_pass(general) / self.rate, 0.0) + max(task - self.task_pass(), 0.0)
        return general, task, int(train / self.step)

    def smallest(self, spent: float, min_steps: int) -> int:
        """The least ``--max-time`` (whole 10 s) whose :meth:`split` gives ``min_steps`` steps after ``spent``
        seconds (the steps grow with the seconds: a bisection)."""
        import math

        low, high = 0.0, 1.0
        while self.split(high)[2] < min_steps:
            high *= 2
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if self.split(mid)[2] < min_steps else (low, mid)
        return 10 * math.ceil((spent + high) / 10)

    def refusal(self, seconds: float, spent: float, min_steps: int) -> str | None:
        """The one-line refusal of ``--max-time seconds`` (``spent`` of it gone) when its plan trains fewer than
        ``min_steps`` steps, naming the smallest that would do and where the time goes; None when it does."""
        general, task, steps = self.split(seconds - spent)
        if steps >= min_steps:
            return None
        export = f", the teacher's export ~{self.export:.0f} s (estimated: not cached)" if self.export else ""
        return (
            f"--max-time {seconds:.0f} s leaves {steps:,} steps of {self.batch} for both phases at the "
            f"{self.step:.2f} s a step measured, fewer than the {min_steps:,} a trained student needs: give --max-time "
            f"{self.smallest(spent, min_steps)} or more (measured here: {spent:.0f} s spent so far{export}, the "
            f"teacher at {self.rate:.0f} sentences/s over the task's {self.task_texts + self.dev_rows:,} texts "
            f"~{self.task_pass():.0f} s, ~{self.end():.0f} s of export and measures at the end), or fewer task rows "
            "with --max-train-samples, or --max-steps N, or --allow-untrained to run anyway"
        )


class PhaseBudget(TimeBudget):
    """The general phase's share of the whole budget, for ``distill_embedding``: the whole budget's start and
    seconds, ending ``later`` seconds before its end (the task phase and the end's costs): its teacher pass and
    training are sized in what is left before that (``TimeBudget.plan``), never refused (the plan refused first)."""

    def __init__(self, whole: TimeBudget, later: float, out: Path | None = None):
        super().__init__(whole.seconds, say=whole.say, start=whole.start)
        self.later, self.out = later, out
        self.trained_before = whole.trained_before  # a --resume's general checkpoint (:func:`carry`)

    AFTER = "the task phase, the student's export and its scoring"

    def reserve(self) -> float:
        return self.later

    def _warn_overrun(self, reserve: float) -> None:
        """Nothing: a share too short to train in is the whole plan's to say (:class:`ClassifierPlan` warns when the
        command cannot hold); the embedding path's line ("exporting and measuring") would name the wrong costs."""

    def training_seconds(self) -> float:
        """``TimeBudget``'s clock, the seconds spent before it recorded in ``out``'s :data:`CLOCK` (general)."""
        if self.out is not None:
            record_start(self.out, "general", self.seconds - self.left() - self.trained_before)
        return super().training_seconds()


def task_clock(budget: TimeBudget, end: float, out: Path | None = None):
    """The task phase's ``WallClockLimit``, its seconds set when training begins (after the teacher's logits): what
    the whole budget has left less the ``end``'s costs, plus the training seconds a resumed checkpoint used (the
    seconds spent before them recorded in ``out``'s :data:`CLOCK`, for a ``--resume``). A ``WallClockLimit`` itself
    (checkpoints keep its state under that class's name), its ``on_train_begin`` wrapped."""
    from ..training.callbacks import WallClockLimit

    clock = WallClockLimit(budget.left())
    begin = clock.on_train_begin

    def on_train_begin(args, state, control, **kwargs):
        begin(args, state, control, **kwargs)
        if out is not None:
            record_start(out, "task", budget.seconds - budget.left() - clock.used())
        clock.seconds = clock.used() + max(1.0, budget.left() - end)

    clock.on_train_begin = on_train_begin
    return clock


def plan_classifier(run: CompressRun, task_, data_dir: Path, student: Student, phases: dict):
    """Torch's thread count fitted on the student's step (``training.threads``; kept where OMP_NUM_THREADS names
    one) and, under a budget, the :class:`ClassifierPlan` measured now and said in one line, refused
    (:class:`BudgetTooSmall`) when it trains fewer steps than the budget's ``min_steps`` (a --resume: never, the run
    was planned when it started). Returns ``(plan or None, threads callback or None)``."""
    from ..training.distill_embedding import IN_MEMORY
    from ..training.distill_sentences import default_corpus, read_sentences
    from ..training.threads import fit_student_threads

    o, teacher, budget, say = run.options, run.teacher, run.budget, run.say
    args = o.args
    sentences = read_sentences(o.train or default_corpus(), args.max_train_samples or IN_MEMORY)
    rows = teacher.shape["vocab_size"] if student.vocab is None else student.vocab.table_rows
    fit = fit_student_threads(student.overrides, rows, teacher.tokenizer, sentences, args.batch_size, args.seq_len, say)
    if budget is None:
        return None, fit
    rate = _teacher_rate(teacher, sentences, args.seq_len)
    plan = ClassifierPlan(
        rate,
        fit.reference if fit is not None else _step(student, rows, teacher.tokenizer, sentences, args),
        args.batch_size,
        len(sentences),
        _rows(task_, data_dir, "train", o.task_args.max_train_samples) * (1 + (o.task_args.augment or 0)),
        _rows(task_, data_dir, task_.dev_splits[0], o.task_args.max_eval_samples),
        0.0 if _teacher_exported(run) else TEACHER_RUNGS * (TimeBudget.EXPORT_SECONDS + EXPORT_SENTENCES / rate),
    )
    if o.resume:
        carry(budget, phases, run.out)
    spent = budget.seconds - budget.left()
    if budget.min_steps is not None and not o.resume:
        why = plan.refusal(budget.seconds, spent, budget.min_steps)
        if why is not None:
            raise BudgetTooSmall(why)
    general, task, budget.planned_steps = plan.split(budget.left())
    export = f"the teacher's export ~{plan.export:.0f} s (not cached), " if plan.export else ""
    say(
        f"plan for --max-time {budget.seconds:.0f} s ({budget.left():.0f} s left): {export}the general phase "
        f"~{general:.0f} s, the task phase ~{task:.0f} s (the teacher's logits over "
        f"{plan.task_texts + plan.dev_rows:,} texts ~{plan.task_pass():.0f} s in it), about "
        f"{budget.planned_steps:,} steps of {plan.batch} in both "
        f"(~{plan.step:.2f} s a step, the teacher at {rate:.0f} sentences/s), then export and measures "
        f"(~{plan.end():.0f} s)"
    )
    over = plan.export + plan.task_pass() + plan.end() - budget.left()
    if over > 0:  # --allow-untrained (a refused plan never gets here): said, never a silent overrun
        say(
            f"--max-time {budget.seconds:.0f} s is less than the teacher's export, its logits and the end take here: "
            f"the run will overrun it by ~{over:.0f} s; give more time, or fewer task rows with --max-train-samples"
        )
    return plan, fit


RUN_SECONDS = "run_seconds"  # in a phase's record: the seconds of --max-time the run had spent when the phase ended
# in out: {phase: the seconds of --max-time its run had spent when the phase's training began, its own earlier training
# (a checkpoint's) not counted}, written as each phase starts training, so that a --resume of a stopped one carries them
CLOCK = "clock.json"
PHASE_FOLDERS = {"general": "general", "task": "student"}


def record_start(out: Path, phase: str, before: float) -> None:
    """``out``'s :data:`CLOCK` with ``phase``'s seconds before its training (the other phase's entry kept)."""
    from sharebert_runtime.outdir import write_json

    write_json(out / CLOCK, {**_clock(out), phase: before})


def _clock(out: Path) -> dict:
    """``out``'s :data:`CLOCK` (``{}`` when missing or not a record: only the checkpoint's training then counts)."""
    from sharebert_runtime.outdir import read_json

    try:
        saved = read_json(out / CLOCK)
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def carry(budget: TimeBudget, phases: dict, out: Path) -> None:
    """A ``--resume`` under ``budget``: the seconds the run it continues spent count against this run's ``--max-time``
    (the time between the two runs does not), as the embedding path's ``TimeBudget.carry`` counts them. A phase
    stopped in training: the seconds before its training (:data:`CLOCK`) and those its checkpoint's
    ``WallClockLimit`` kept (a general phase's go on in its clock: ``budget.trained_before``); a run stopped between
    the phases: those to the end of its general phase (:data:`RUN_SECONDS`). Said in one line."""
    from ..training.callbacks import latest_checkpoint

    if "task" in phases:
        return  # nothing left to train: the report only
    phase = "task" if "general" in phases else "general"
    checkpoint = latest_checkpoint(out / PHASE_FOLDERS[phase] / "checkpoints")
    ended = _seconds((phases.get("general") or {}).get(RUN_SECONDS))
    if checkpoint is None:
        if ended:
            budget.start -= ended
            budget.say(
                f"--resume: {ended:.0f} s of --max-time {budget.seconds:.0f} s were spent by the run it continues "
                f"(to the end of its general phase); {budget.left():.0f} s are left"
            )
        return
    trained = _checkpoint_seconds(checkpoint)
    before = _seconds(_clock(out).get(phase)) or ended
    budget.start -= before + trained
    if phase == "general":
        budget.trained_before = trained
    known = "" if before else " (it left no record of its time before training: only its training counted)"
    budget.say(
        f"--resume: {before + trained:.0f} s of --max-time {budget.seconds:.0f} s were spent by the run it continues "
        f"({before:.0f} s before its {phase} phase's training, {trained:.0f} s of that training){known}; "
        f"{budget.left():.0f} s are left"
    )


def _checkpoint_seconds(checkpoint: Path) -> float:
    """The training seconds a checkpoint's ``WallClockLimit`` kept (0 when it kept none)."""
    from ..training.callbacks import WallClockLimit, trainer_state

    clock = (trainer_state(checkpoint).get("stateful_callbacks") or {}).get(WallClockLimit.__name__)
    return _seconds(((clock or {}).get("attributes") or {}).get("used_seconds") if isinstance(clock, dict) else None)


def _rows(task_, data_dir: Path, split: str, limit: int | None) -> int:
    """The examples of a task's split a phase reads (its first ``limit``)."""
    from ..training.glue import read_split

    return len(read_split(task_, data_dir, split).head(limit).labels)


def _teacher_exported(run: CompressRun) -> bool:
    """Whether the teacher's artifact is made already: cached by an earlier run, or this --resume's own."""
    from .teacher_pass import CACHE_CHOICE, teacher_cache

    own = run.options.resume and (run.out / "teacher_artifact" / "manifest.json").is_file()
    return own or (teacher_cache(run.teacher, "text-classification") / CACHE_CHOICE).is_file()


def _teacher_rate(teacher, sentences: list[str], seq_len: int) -> float:
    """The teacher backbone's sentences a second in PyTorch, timed on :data:`TIMED_SENTENCES` spread over
    ``sentences`` after four untimed (the first pass's one-time costs are no rate)."""
    import time

    from ..training.distill_embedding_model import load_encoder
    from ..training.sentence_vectors import encode

    encoder = load_encoder(teacher.folder, teacher.config)
    sample = sentences[:: max(1, len(sentences) // TIMED_SENTENCES)][:TIMED_SENTENCES]
    encode(encoder, teacher.tokenizer, sample[:4], "mean", None, seq_len)
    start = time.monotonic()
    encode(encoder, teacher.tokenizer, sample, "mean", None, seq_len)
    return len(sample) / max(time.monotonic() - start, 1e-6)


def _step(student: Student, rows: int, tok, sentences: list[str], args) -> float:
    """One student step's seconds at torch's present thread count (the user's OMP_NUM_THREADS: nothing fitted)."""
    import torch

    from ..training.distill_embedding_setup import build_student
    from ..training.threads import step_seconds, training_batch

    model = build_student("sharebert-tiny", student.overrides, rows)
    batch = training_batch(tok, sentences, args.batch_size, args.seq_len, rows)
    return step_seconds(model, batch, torch.get_num_threads())


def general_budget(run: CompressRun, plan: ClassifierPlan | None) -> TimeBudget | None:
    """The general phase's share of ``--max-time`` (:class:`PhaseBudget`), split again from what is left now that
    the teacher is exported; None without a plan (no --max-time: ``args.max_time`` bounds its training)."""
    if plan is None:
        return None
    _, task, _ = replace(plan, export=0.0).split(run.budget.left())
    return PhaseBudget(run.budget, task + plan.end(), run.out)
