"""``sharebert compress`` for a classifier teacher (``...ForSequenceClassification``): general distillation, then
task distillation, then the int8 artifact and the report (:mod:`classifier_report`, with the embedding path's
probe, exports and table).

0. The GLUE task (:func:`classifier_task`): ``--task``, else the task the teacher's ``metrics.json`` records
   (``sharebert finetune`` writes it), else the one task whose label names are the teacher's ``id2label``.
   The teacher's labels and the task's files are checked before any work.
1. General distillation -> ``out/general`` (``distill_embedding``): the student, picked by
   ``budget.student_for`` (its classifier counted) and started from the teacher's embedding tables, learns the
   teacher backbone's pooled state on unlabelled text. A plain transformers classifier folder has no
   sentence-transformers recipe, so that state is its [CLS] vector, the one its classification head reads.
   The teacher runs once over the sentences (cached targets); hidden-state terms would run it at every step.
2. Task distillation -> ``out/student`` (``distill_glue`` from ``out/general``): soft targets at T=2 plus the
   gold labels on the task's training rows the teacher labels right (the student is the teacher made small: a gold
   label its teacher contradicts would teach it to disagree), the teacher's logits computed once
   (``out/teacher_logits``); the best student by the dev metric is kept.
3. Export int8, task text-classification -> ``out/artifact``; the teacher at the first quantization that keeps it
   (``teacher_pass.export_teacher``) -> ``out/teacher_artifact``.
   Report: size, memory and speed rows, and the task's dev metric of teacher (PyTorch fp32; its artifact in the
   JSON) and student (its int8 artifact through the torch-free runtime; PyTorch fp32 in the JSON).

``--max-time T`` bounds the whole command (:class:`ClassifierPlan`), counted from the process's start: before any
export or pass, torch's thread count is fitted on the student's step and the teacher's speed measured; the teacher's
export (estimated where not cached), its pass over the task's rows, the end's export, probes and dev scoring are
planned, and what is left goes to the two phases (:data:`TASK_SHARE` to the task's). A plan whose steps are fewer
than a trained student takes is refused there, naming the smallest ``--max-time`` that would do (unless
``--allow-untrained`` or ``--max-steps``). The general phase trains to its share's end (the embedding path's
``TimeBudget``: its own teacher pass sized in it); the task phase's clock, set when it starts training, ends where
the end's costs begin (:func:`_task_clock`), so a slow general phase shortens the task phase, not the budget.

Each phase is recorded in ``out/phases.json`` when it ends; a stopped one (SIGINT/SIGTERM: checkpoint) resumes
from its checkpoints, a recorded one is not run again.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import read_json, write_json

from .classifier_report import classifier_report
from .out_folder import check_same_student, fingerprint, publish_over
from .plan import (
    EXPORT_SENTENCES,
    TEACHER_RUNGS,
    TIMED_SENTENCES,
    BudgetTooSmall,
    TimeBudget,
    student_overrides,
    student_vocabulary,
)
from .run import CompressRun, Student

PHASES = "phases.json"
TASK_WEIGHTS = dict(kl=1.0, hard=1.0, hidden=0.0, attention=0.0, embedding=0.0)  # logits alone: the teacher runs once
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
        teacher's export: what the export and :meth:`end` leave, :data:`TASK_SHARE` of it to the task phase; the
        steps both phases train in it once their teacher passes are done."""
        both = max(seconds - self.export - self.end(), 0.0)
        task = TASK_SHARE * both
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


class _PhaseBudget(TimeBudget):
    """The general phase's share of the whole budget, for ``distill_embedding``: the whole budget's start and
    seconds, ending ``later`` seconds before its end (the task phase and the end's costs): its teacher pass and
    training are sized in what is left before that (``TimeBudget.plan``), never refused (the plan refused first)."""

    def __init__(self, whole: TimeBudget, later: float):
        super().__init__(whole.seconds, say=whole.say, start=whole.start)
        self.later = later

    def reserve(self) -> float:
        return self.later


def _task_clock(budget: TimeBudget, end: float):
    """The task phase's ``WallClockLimit``, its seconds set when training begins (after the teacher's logits): what
    the whole budget has left less the ``end``'s costs, plus the training seconds a resumed checkpoint used. A
    ``WallClockLimit`` itself (checkpoints keep its state under that class's name), its ``on_train_begin`` wrapped."""
    from ..training.callbacks import WallClockLimit

    clock = WallClockLimit(budget.left())
    begin = clock.on_train_begin

    def on_train_begin(args, state, control, **kwargs):
        begin(args, state, control, **kwargs)
        clock.seconds = clock.used() + max(1.0, budget.left() - end)

    clock.on_train_begin = on_train_begin
    return clock


def _evaluate_at_stop(stopper):
    """A ``TrainerCallback`` that scores the dev set at the step where training stops (``--max-time``, ``--max-steps``),
    so the best-checkpoint choice sees the last steps too; not after SIGINT/SIGTERM (stop at once)."""
    from transformers import TrainerCallback

    class EvaluateAtStop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if control.should_training_stop and (stopper is None or stopper.received is None):
                control.should_evaluate = control.should_save = True
            return control

    return EvaluateAtStop()


def _resumable(phase: Path) -> bool:
    """Whether a stopped phase left a checkpoint to continue from. Without one the phase starts afresh over its
    folder (``overwrite``), which the distillation takes only if it is a distillation's: a folder of the user's
    that happens to be named like a phase is refused, never cleared."""
    from ..training.callbacks import latest_checkpoint

    return latest_checkpoint(phase / "checkpoints") is not None


def _recorded_task(teacher: Path):
    """The task in the teacher's ``metrics.json`` (a ``sharebert finetune`` output) or None, and what the file
    said when it names none (for the error that follows)."""
    from ..training.glue import recorded_task

    return recorded_task(teacher)


def classifier_task(teacher, config: dict, task: str | None):
    """The ``GlueTask`` a classifier teacher was fine-tuned on (module docstring, step 0); ``ValueError`` when it
    cannot be told or ``task`` contradicts the teacher's record."""
    from ..training.glue import TASKS, get_task

    teacher = Path(teacher)
    recorded, why = _recorded_task(teacher)
    if task is not None:
        chosen = get_task(task)
        if recorded is not None and recorded.name != chosen.name:
            raise ValueError(
                f"--task {task}, but {teacher} was fine-tuned on {recorded.name} (its metrics.json); "
                f"drop --task or give a teacher fine-tuned on {chosen.name}"
            )
        return chosen
    if recorded is not None:
        return recorded
    id2label = config.get("id2label") or {}
    if not isinstance(id2label, dict):
        raise ValueError(f"{teacher}/config.json: id2label must map label ids to names, got {type(id2label).__name__}")
    names = tuple(str(id2label.get(str(i), id2label.get(i, ""))) for i in range(len(id2label)))
    if config.get("problem_type") == "regression" or len(names) == 1:
        matches = [t for t in TASKS.values() if t.is_regression]
    else:
        matches = [t for t in TASKS.values() if t.label_names == names]
    if len(matches) == 1:
        return matches[0]
    fits = f"fit {', '.join(t.name for t in matches)}" if matches else "name no task"
    raise ValueError(
        f"{teacher} is a classifier whose GLUE task is unknown ({why}; its labels {list(names)} "
        f"{fits}); name it with --task, e.g. --task sst2"
    )


def _budget(b: dict) -> str:
    return " and ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in b.items() if v) or "no budget"


def _phases(out: Path) -> dict:
    """The phases a run recorded (``{}`` for none); ``ValueError`` naming the file when it is not theirs."""
    path = out / PHASES
    if not path.is_file():
        return {}
    try:
        phases = read_json(path)
    except (OSError, ValueError) as e:  # read_json: bad syntax and nesting too deep alike
        raise ValueError(f"{first_line(e)}: start again with --overwrite") from None
    if not (isinstance(phases, dict) and all(isinstance(v, dict) for v in phases.values())):
        raise ValueError(f"{path} is not a record of compress phases: start again with --overwrite")
    return phases


def compress_classifier(run: CompressRun) -> dict:
    """The steps of the module docstring; returns the report (``out/report.json``), or ``{"stopped": True,
    "phase", "steps"}`` after SIGINT/SIGTERM. ``run``: from ``plan.precheck`` (the teacher read once); of its options,
    ``args``: ``EmbeddingArgs`` (phase 1; its ``max_time`` bounds each phase); ``task_args``: ``DistillArgs``
    (phase 2; ``max_eval_samples`` also bounds the report's dev rows); ``vocab_size``: cut the teacher's vocabulary to
    this many tokens (``training.vocab``, over the --train text and the task's training text; without it, cut only
    when the teacher's does not fit the limits): both phases then train the student on its own tokens; ``web``: also
    ``out/web``, the student as transformers.js loads it."""
    from sharebert_runtime.outdir import check_same_run

    from ..training.callbacks import resume_from

    o, teacher, out, say = run.options, run.teacher, run.out, run.say
    task_ = classifier_task(teacher.folder, teacher.raw, o.task)
    data_dir = _task_files(run, task_)
    student = _classifier_student(run, task_, data_dir)
    vocab = student.vocab
    cut = "" if vocab is None else f"; vocabulary cut to {len(vocab.kept)} tokens, table {vocab.table_rows} rows"
    fp = fingerprint(run, student.overrides, f"classifier: general, then task distillation on {task_.name}{cut}")
    if o.resume:
        check_same_run(out, fp)
    check_same_student(out, student.overrides, ("general", "student"))
    phases, general = _phases(out), out / "general"
    if o.resume and not phases and not (general.is_dir() and any(general.iterdir())):  # said in terms of --out,
        resume_from(general / "checkpoints", True, say=say, out=out)  # before any work (a used general/: its own check)
    budget, done = _phase_budget(o), phases.get("task", {}).get("budget")
    if (
        o.resume
        and "general" in phases
        and done is not None
        and any(  # an unset option and 0 are alike
            (done.get(k) or None) != (budget.get(k) or None) for k in {*done, *budget}
        )
    ):
        raise ValueError(
            f"{out} holds a finished compress trained with {_budget(done)}; a finished phase keeps no "
            f"checkpoint to train on from, so {_budget(budget)} cannot continue it: start again with "
            "--overwrite (or resume with the run's own budget to make its report again)"
        )
    cand, head = student.cand, student.head
    say(
        f"task {task_.name}; student: {cand.describe()}, {cand.params + head:,} learned parameters "
        f"(classifier {head:,})"
    )
    plan, threads = _plan(run, task_, data_dir, student)  # before any export or pass: a budget too small refused
    return publish_over(
        out, fp, o.overwrite, o.resume, lambda: _phases_then_report(run, task_, data_dir, student, (plan, threads))
    )


def _plan(run: CompressRun, task_, data_dir: Path, student: Student):
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
        carry(budget, _phases(run.out))
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
    return plan, fit


RUN_SECONDS = "run_seconds"  # in a phase's record: the seconds of --max-time the run had spent when the phase ended


def carry(budget: TimeBudget, phases: dict) -> None:
    """A ``--resume`` under ``budget``: the seconds the run it continues had spent when its general phase ended
    (recorded there, :data:`RUN_SECONDS`) count against this run's ``--max-time`` (the time between the two runs
    does not), said in one line. A stopped general phase recorded nothing: its run's seconds are not carried."""
    seconds = (phases.get("general") or {}).get(RUN_SECONDS)
    if "task" in phases or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        return
    budget.start -= seconds
    budget.say(
        f"--resume: {seconds:.0f} s of --max-time {budget.seconds:.0f} s were spent by the run it continues (to the "
        f"end of its general phase); {budget.left():.0f} s are left"
    )


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


def _task_files(run: CompressRun, task_) -> Path:
    """The task's GLUE folder, its files found and its labels the teacher's, before any work."""
    from ..formats.paths import data_path
    from ..training.distill_teacher import check_teacher_labels
    from ..training.glue import task_file

    check_teacher_labels(run.teacher.folder, run.teacher.config, task_)
    data_dir = data_path("glue", task_.folder)
    for split in ("train", *task_.dev_splits):
        if not (data_dir / task_.file(split)).is_file():  # compress has no --data-dir: the data folder is the way
            raise FileNotFoundError(
                f"{task_.name}: a classifier's task distillation trains on the task's GLUE files, "
                f"and {data_dir / task_.file(split)} is not there: set SHAREBERT_DATA to a folder "
                f"holding glue/{task_.folder}/ (train.tsv and its dev files)"
            )
        task_file(task_, data_dir, split)
    return data_dir


def _classifier_student(run: CompressRun, task_, data_dir: Path) -> Student:
    """The student the limits pick, its classifier counted, and its vocabulary (cut over the --train text and the
    task's training text), checked before any work against what a cut student cannot learn from."""
    from ..accounting.budget import student_for
    from ..training.distill import check_cut_task
    from ..training.teacher import student_fields

    o, teacher = run.options, run.teacher
    task_args = o.task_args
    more = lambda: task_text(task_, data_dir, task_args.max_train_samples)  # noqa: E731
    vocab = student_vocabulary(run, task_.num_labels, more)
    if vocab is not None:  # before any work: what a cut student cannot learn from
        check_cut_task(
            replace(task_args, weights=replace(task_args.weights, **TASK_WEIGHTS)), run.out / "teacher_logits"
        )
    shape = {**teacher.shape, **({"vocab_size": vocab.table_rows} if vocab is not None else {})}
    cand, head = student_for(shape, o.limits, num_labels=task_.num_labels)
    return Student(cand, head, {**student_overrides(cand), **student_fields(teacher.tokenizer)}, vocab, o.args)


def _phase_budget(o) -> dict:
    """What bounds each phase, and the task data: recorded with the task phase, compared on ``--resume``."""
    return {"max_time": o.args.max_time, "max_steps": o.args.max_steps, "augment": o.task_args.augment}


def task_text(task_, data_dir: Path, limit: int | None = None) -> list[str]:
    """The texts of a task's training examples (both sides of a pair), the first ``limit`` examples."""
    from ..training.glue import read_split

    split = read_split(task_, data_dir, "train").head(limit)
    return [*split.text_a, *(t for t in (split.text_b or ()) if t)]


def _phases_then_report(run: CompressRun, task_, data_dir: Path, student: Student, planned) -> dict:
    """The teacher's export, the two phases and the report; ``planned``: ``(ClassifierPlan or None, threads
    callback or None)`` from :func:`_plan`."""
    from ..training.callbacks import WallClockLimit
    from ..training.distill import distill_glue
    from ..training.distill_embedding import distill_embedding
    from .teacher_pass import export_teacher

    o, out, say, args, vocab = run.options, run.out, run.say, run.options.args, student.vocab
    phases, general, student_dir = _phases(out), out / "general", out / "student"
    plan, threads = planned
    # The teacher's artifact does not depend on the student: made first, its real cost is spent before the phases'
    # shares are set, not guessed (the report finds it made).
    say("exporting the teacher (the first quantization that keeps it), task text-classification ...")
    export_teacher(run.teacher, out / "teacher_artifact", "text-classification", o.progress, say)
    callbacks = tuple(c for c in (*run.callbacks(), threads) if c is not None)
    if "general" not in phases:
        say(f"phase 1/2, general distillation (the teacher's pooled states on unlabelled text) -> {general}")
        again = _resumable(general)
        m = distill_embedding(
            run.teacher.folder,
            "sharebert-tiny",
            general,
            o.train,
            args,
            overrides=student.overrides,
            overwrite=True,
            resume=again,
            progress=o.progress,
            callbacks=callbacks,
            score_sts=False,
            vocab=vocab,
            budget=_general_budget(run, plan),
            run_teacher=run.teacher,  # its config, tokenizer, recipe and fingerprint: not read again
        )
        if run.stopped():
            return {"stopped": True, "phase": "general", "steps": m["steps"]}
        phases["general"] = {
            k: m[k]
            for k in (
                "steps",
                "train_seconds",
                "train_sentences",
                "train_loss",
                "stopped_by_time",
                "pooling",
                "loss",
                "init",
                "seq_len",
            )
        }
        if run.budget is not None:
            phases["general"][RUN_SECONDS] = run.budget.seconds - run.budget.left()
        write_json(out / PHASES, phases)  # then the checkpoints go: a stop between the two leaves a resumable run
        shutil.rmtree(general / "checkpoints", ignore_errors=True)
    if "task" not in phases:
        say(f"phase 2/2, task distillation on {task_.name} (soft targets and gold labels) -> {student_dir}")
        if plan is not None:
            clock = _task_clock(run.budget, plan.end())
        else:
            clock = WallClockLimit(args.max_time) if args.max_time else None
        t_args = replace(o.task_args, weights=replace(o.task_args.weights, **TASK_WEIGHTS))
        again = _resumable(student_dir)
        m = distill_glue(
            run.teacher.folder,
            str(general),
            task_.name,
            student_dir,
            data_dir,
            t_args,
            overwrite=True,
            resume=again,
            keep_checkpoints=True,
            progress=o.progress,
            cache_teacher=out / "teacher_logits",
            clock=clock,
            # not the threads callback: it times a backbone's step (last_hidden_state), and this student is a
            # classifier; the count it chose holds
            callbacks=[c for c in (*run.callbacks(), _evaluate_at_stop(run.stopper)) if c is not None],
            vocab=vocab,
            agreed_labels=True,
            run_teacher=run.teacher,
        )
        if run.stopped():
            return {"stopped": True, "phase": "task", "steps": m["steps"]}
        phases["task"] = {**m, "stopped_by_time": bool(clock and clock.reached), "budget": _phase_budget(o)}
        write_json(out / PHASES, phases)
        shutil.rmtree(student_dir / "checkpoints", ignore_errors=True)
    return classifier_report(run, task_, data_dir, student, phases)


def _general_budget(run: CompressRun, plan: ClassifierPlan | None) -> TimeBudget | None:
    """The general phase's share of ``--max-time`` (:class:`_PhaseBudget`), split again from what is left now that
    the teacher is exported; None without a plan (no --max-time: ``args.max_time`` bounds its training)."""
    if plan is None:
        return None
    _, task, _ = replace(plan, export=0.0).split(run.budget.left())
    return _PhaseBudget(run.budget, task + plan.end())
