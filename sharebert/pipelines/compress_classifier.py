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

``--max-time T`` bounds the whole command (:class:`classifier_plan.ClassifierPlan`), counted from the process's start:
before any export or pass, torch's thread count is fitted on the student's step and the teacher's speed measured; the
teacher's export (estimated where not cached), its pass over the task's rows, the end's export, probes and dev scoring
are planned, and what is left goes to the two phases (``classifier_plan.TASK_SHARE`` to the task's). A plan whose steps
are fewer than a trained student takes is refused there, naming the smallest ``--max-time`` that would do (unless
``--allow-untrained`` or ``--max-steps``). The general phase trains to its share's end (the embedding path's
``TimeBudget``: its own teacher pass sized in it); the task phase's clock, set when it starts training, ends where the
end's costs begin (``classifier_plan.task_clock``), so a slow general phase shortens the task phase, not the budget.

Each phase is recorded in ``out/phases.json`` when it ends; a stopped one (SIGINT/SIGTERM: checkpoint) resumes
from its checkpoints, a recorded one is not run again.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import read_json, write_json

from .classifier_plan import RUN_SECONDS, general_budget, plan_classifier, task_clock
from .classifier_report import classifier_report
from .out_folder import check_same_student, fingerprint, publish_over
from .plan import student_overrides, student_vocabulary
from .run import CompressRun, Student

PHASES = "phases.json"
TASK_WEIGHTS = dict(kl=1.0, hard=1.0, hidden=0.0, attention=0.0, embedding=0.0)  # logits alone: the teacher runs once


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
    # before any export or pass: a budget too small is refused there
    plan, threads = plan_classifier(run, task_, data_dir, student, _phases(out))
    return publish_over(
        out, fp, o.overwrite, o.resume, lambda: _phases_then_report(run, task_, data_dir, student, (plan, threads))
    )


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
    callback or None)`` from :func:`classifier_plan.plan_classifier`."""
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
            budget=general_budget(run, plan),
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
            clock = task_clock(run.budget, plan.end(), out)
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
            # the threads callback too: the load moves while this phase trains (it times the classifier's step)
            callbacks=[c for c in (*run.callbacks(), threads, _evaluate_at_stop(run.stopper)) if c is not None],
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
