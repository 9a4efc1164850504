"""``sharebert compress``: a pre-trained sentence-embedding encoder into a small ShareBERT, in one command.

A classifier teacher (``...ForSequenceClassification``) takes the two-phase path of ``compress_classifier``.
This module holds the embedding path's flow; its parts, shared with the classifier path, are in the modules beside
it: ``plan`` (checks, the student, ``--max-time``), ``out_folder`` (``--out``, resume, overwrite), ``teacher_pass``
(the teacher's artifact and vectors), ``quality`` (the measures and the verdict), ``report`` and ``picture``.

Steps, each in its own subfolder of ``out`` so a stopped run resumes where it was:

0. every check that needs no model, torch-free (:func:`precheck`); ``out`` is a compress result only by its
   marker (``outdir.MARK``), a ``--resume`` checks the run's fingerprint, ``--overwrite`` keeps the earlier result
   in ``out/.replaced`` until the new report is written (:func:`start_out`);
1. pick the student under the limits (``budget.student_for``: learned parameters incl. its output projection);
   export the teacher (any encoder architecture) at the first quantization that keeps it within cosine 0.99
   (``export_teacher``: int8-dynamic, else int8 weight-only, fp16, fp32) -> ``out/teacher_artifact``, for
   the speed and memory comparison: first, so its cost is measured before the time budget's plan;
2. distil it (``distill_embedding``) in ``out/work/student`` within the :class:`TimeBudget` (``--max-time`` for
   the whole command) or ``max_steps`` steps, then publish the model alone, portable, in ``out/student``
   (:func:`publish_student`: a sentence-transformers folder);
3. export it int8 (``export.export_model``) -> ``out/artifact`` (pooling, projection and Normalize in the artifact);
   with ``web``, also ``--format web`` -> ``out/web`` (``out_folder.publish_web``: what transformers.js loads);
4. measure teacher and student side by side -> ``report.json``, ``report.md``, ``report.png``: learned
   parameters, file bytes, peak RSS at load and p50 of one sentence at 16 and 128 tokens (1 thread, in a
   fresh torch-free process each), then :func:`embedding_quality`: agreement with the teacher on held-out
   text, ``--eval-pairs``, STS-B dev where present, the cosine calibration.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from sharebert_runtime.outdir import OutLock, check_same_run

from .out_folder import (
    WORK,
    check_same_student,
    fingerprint,
    publish_over,
    publish_student,
    publish_web,
    remove_parts,
)
from .plan import (
    BUDGET_RECORD,
    BudgetTooSmall,
    available_sentences,
    embedding_shape,
    measure_before_export,
    planned_steps,
    student_overrides,
    student_vocabulary,
)
from .quality import (
    UNTRAINED_SHARE,
    MeasureCount,
    Spread,
    cached_quality_sentences,
    embedding_quality,
    quality_sentences,
    search_verdict,
)
from .report import (
    PROBE_FEWEST,
    PROBE_RUNS,
    probe,
    quality_source,
    safetensor_params,
    web_sentence,
    weight_bytes,
    write_report,
)
from .run import CompressRun, Student
from .teacher_pass import export_once, export_teacher, teacher_name


def compress(run: CompressRun) -> dict:
    """Run the steps of the module docstring for a sentence-embedding teacher (a classifier teacher:
    ``compress_classifier``; ``--task`` is refused here); returns the report (also written to ``out/report.json``).

    ``run``: from ``plan.precheck`` (every check that needs no model done, the teacher read once), with its
    ``stopper`` (on SIGTERM/SIGINT the distillation saves a checkpoint and the report says ``"stopped"``; run again
    with ``resume``) and ``budget`` (``--max-time`` for the whole command; without, ``args.max_time`` is the
    training's alone). The distillation runs in ``out/work`` (checkpoints, the teacher's vectors; removed when the
    run finishes unless ``keep_work``); ``out/student`` receives the model alone (:func:`publish_student`), portable
    unless told otherwise; ``web``: also ``out/web``, the student as transformers.js loads it."""
    from ..training.callbacks import latest_checkpoint

    o, out, say, budget = run.options, run.out, run.say, run.budget
    student = _embedding_student(run)
    fp = fingerprint(run, student.overrides, f"embedding ({student.args.loss} loss)")
    check_same_student(out, student.overrides, ("student", f"{WORK}/student"))  # first: it names each differing field
    if o.resume:
        check_same_run(out, fp)
    student_dir = out / WORK / "student"
    if o.resume and latest_checkpoint(student_dir / "checkpoints") is None:  # said in terms of --out, before any work
        from ..training.callbacks import resume_from

        resume_from(student_dir / "checkpoints", True, say=say, out=out)
    cand, head = student.cand, student.head
    say(
        f"student: {cand.describe()}, {cand.params + head:,} learned parameters (output projection {head:,}); it "
        f"reads at most {student.args.seq_len} tokens, as the teacher does"
    )
    if budget is not None:
        budget.after_sentences = quality_sentences(o.eval_pairs, o.max_eval_samples)
        budget.cached_sentences = cached_quality_sentences(run.teacher, o.eval_pairs, o.max_eval_samples)
        if o.max_eval_samples is None:  # the tests' first N is never sized again
            budget.measures = MeasureCount(run.teacher, o.eval_pairs)
        budget.record = out / WORK / BUDGET_RECORD
        if o.resume and (checkpoint := latest_checkpoint(student_dir / "checkpoints")) is not None:
            budget.carry(budget.record, checkpoint)  # the run it continues spent part of --max-time
    threads = _measure_before_export(run, student)
    fresh = not out.is_dir() or all(p.name == OutLock.NAME for p in out.iterdir())
    report = _refused_leaves_nothing(
        out, fresh, lambda: publish_over(out, fp, o.overwrite, o.resume, lambda: _compress(run, student, threads))
    )
    if not report.get("stopped") and not o.keep_work:
        shutil.rmtree(out / WORK, ignore_errors=True)
    return report


def _embedding_student(run: CompressRun) -> Student:
    """The checks an encoder teacher needs before any work (not a classifier, no ``--task``, a ``--data`` folder of
    its tokens), then the student the limits pick, reading what its teacher reads."""
    from ..accounting.budget import student_for
    from ..training.teacher import student_fields

    o, teacher = run.options, run.teacher
    raw = teacher.check_encoder()
    if teacher.is_classifier:  # the command sends a classifier to compress_classifier (which imports this module)
        raise ValueError(f"{o.teacher} is a classifier: compress it with compress_classifier.compress_classifier")
    if o.task is not None:
        raise ValueError(
            f"--task is for a classifier teacher; {o.teacher} is an encoder "
            f"({', '.join(raw.get('architectures') or ['no architectures'])}): compress distils its "
            "sentence embeddings"
        )
    if o.data is not None:  # refused before anything is written
        from ..training.distill_embedding_setup import check_data

        check_data(o.data, o.train, teacher.tokenizer, teacher.folder)
    vocab = student_vocabulary(run)
    shape = {**embedding_shape(teacher), **({"vocab_size": vocab.table_rows} if vocab is not None else {})}
    cand, head = student_for(shape, o.limits)
    overrides = {**student_overrides(cand), **student_fields(teacher.tokenizer)}
    args = replace(o.args, seq_len=overrides.get("max_position_embeddings", o.args.seq_len))  # its teacher's length
    return Student(cand, head, overrides, vocab, args)


def _measure_before_export(run: CompressRun, student: Student):
    """``plan.measure_before_export`` for this run: the training's threads callback (None: nothing fitted)."""
    from .teacher_pass import CACHE_CHOICE, teacher_cache

    o, teacher, out = run.options, run.teacher, run.out
    exported = (o.resume and (out / "teacher_artifact" / "manifest.json").is_file()) or (
        teacher_cache(teacher, "feature-extraction") / CACHE_CHOICE
    ).is_file()
    rows = embedding_shape(teacher)["vocab_size"] if student.vocab is None else student.vocab.table_rows
    return measure_before_export(run, student, rows, exported)  # a budget too small is refused there


def _refused_leaves_nothing(out: Path, fresh: bool, run) -> dict:
    """``run()``; a budget refused at the plan (:class:`BudgetTooSmall`) leaves a folder that held nothing before as
    empty as it was (the teacher's artifact stays in the cache), so the command run again needs no --overwrite."""
    try:
        return run()
    except BudgetTooSmall:
        if fresh:
            remove_parts(out)
        raise


def _distil(run: CompressRun, student: Student, threads) -> dict:
    """The distillation in ``out/work/student`` (``distill_embedding``), resumed from its checkpoints where there are
    some; its metrics. ``threads``: ``training.threads.FitThreads`` (None: none)."""
    from ..training.distill_embedding import distill_embedding

    o, folder = run.options, run.out / WORK / "student"
    return distill_embedding(
        run.teacher.folder,
        "sharebert-tiny",
        folder,
        o.train,
        student.args,
        overrides=student.overrides,
        overwrite=True,
        resume=o.resume or (folder / "checkpoints").is_dir(),
        progress=o.progress,
        data=o.data,
        score_sts=False,  # measured once, below, from the artifact
        budget=run.budget if o.data is None else None,
        callbacks=tuple(c for c in (*run.callbacks(), threads) if c is not None),
        vocab=student.vocab,
        teacher_artifact=run.out / "teacher_artifact",  # the teacher's pass runs there where it keeps the teacher
        run_teacher=run.teacher,  # its config, tokenizer, recipe and fingerprint: not read again
    )


def _compress(run: CompressRun, student: Student, threads) -> dict:
    o, teacher, out, say, budget = run.options, run.teacher, run.out, run.say, run.budget
    started = budget.start if budget is not None else time.monotonic()
    # The teacher's artifact does not depend on the student: made first, its real cost (a refused quantization
    # is a whole export: ~50 s for MiniLM on a loaded 2-core machine) is spent before the plan, not guessed.
    say("exporting the teacher (the first quantization that keeps it) ...")
    t_art, t_quant, t_refused = export_teacher(teacher, out / "teacher_artifact", "feature-extraction", o.progress, say)
    if budget is not None:
        budget.exports = 1 + o.web  # the student's artifact, and its web folder
    m = _distil(run, student, threads)
    if run.stopped():
        return {"stopped": True, "steps": m["steps"]}
    planned = planned_steps(budget, student.args)
    if planned is not None and m["steps"] < UNTRAINED_SHARE * planned:
        say(
            f"training took {m['steps']:,} of the {planned:,} planned steps (they ran slower than the plan measured): "
            "the student may be untrained; the report's verdict says whether it is usable, and what budget would be"
        )
    student_dir = publish_student(out / WORK / "student", out / "student", o.portable)
    say("exporting the student (int8) ...")
    art = export_once(student_dir, out / "artifact", "int8", o.progress)
    if o.web:
        say("exporting the student for the web (--format web, int8) ...")
        web_entry = publish_web(student_dir, out, art, o.progress, "feature-extraction", allow_low_parity=False)
    runs = PROBE_FEWEST if budget is not None and budget.cut_probes() else PROBE_RUNS
    cut = f" ({runs} timed runs, not {PROBE_RUNS}: the budget)" if runs != PROBE_RUNS else ""
    say(f"measuring memory and speed{cut} ...")
    s_probe, t_probe = probe(art, runs), probe(t_art, runs)
    from sharebert_runtime import Runtime

    from ..training.teacher_vectors import TeacherPass

    t_pass = TeacherPass.of(teacher, teacher.max_length, t_art)  # the training's path: its artifact where it keeps it
    rows = budget.measure_rows_now() if budget is not None else None  # the last work: sized to what is left
    limit = Spread(rows) if rows is not None else o.max_eval_samples
    q = embedding_quality(teacher, Runtime(art).embed, o.eval_pairs, say, limit, t_pass)
    t_pass.close()
    s_manifest = json.loads((art / "manifest.json").read_text())
    vocab = student.vocab
    report = {
        "teacher": {
            "folder": str(o.teacher),
            "name": teacher_name(teacher.folder),
            "learned_params": safetensor_params(teacher.folder),
            "file_bytes": weight_bytes(teacher.folder),
            "artifact_bytes": weight_bytes(t_art),
            "quantization": t_quant,
            "quantization_refused": t_refused,
            "teacher_pass": q["teacher_pass"],
            **{k: v["teacher"] for k, v in q["measures"].items()},
            **t_probe,
        },
        "student": {
            "folder": str(student_dir),
            "shape": student.cand.describe(),
            "config": student.overrides,
            "learned_params": safetensor_params(student_dir),
            "file_bytes": weight_bytes(art),
            **{k: v["student"] for k, v in q["measures"].items()},
            "quantization": s_manifest.get("quantization"),
            **s_probe,
            **({"vocabulary": vocab.as_dict()} if vocab is not None else {}),
        },
        "training": {
            **{
                k: m[k]
                for k in ("steps", "train_seconds", "train_sentences", "loss", "init", "stopped_by_time", "seq_len")
            },
            "train_word_strings": m.get("train_word_strings", 0),
        },
        "limits": {k: v for k, v in o.limits.items() if v is not None},
        "quality": [{"label": v["label"], "key": k} for k, v in q["measures"].items()],
        "calibration": q["calibration"],
    }
    report["student"].update(portable=o.portable, max_seq_length=m["seq_len"])
    if o.web:
        report["student"]["web"] = web_entry
    report["teacher"]["max_seq_length"] = teacher.max_length
    tr = report["training"]
    summary = (
        f"{_length_sentence(m['seq_len'], report['teacher']['max_seq_length'])} Distilled {tr['steps']} "
        f"steps ({tr['train_seconds']:.0f} s, {_texts(tr)} of at "
        f"most {tr['seq_len']} tokens, {tr['loss']} loss, initialised from the teacher). Teacher figures: "
        f"{quality_source(report['teacher'])}; student figures: its int8 artifact through the torch-free runtime. "
        + calibration_sentence(q["calibration"])
        + (f" Speed: the median of {runs} timed runs, not {PROBE_RUNS}: --max-time." if runs != PROBE_RUNS else "")
        + (f" The student's {vocab.describe()}." if vocab is not None else "")
        + (web_sentence(web_entry) if o.web else "")
    )
    from ..formats.paths import packaged_search

    report["verdict"] = search_verdict(
        report,
        student.args.batch_size,
        planned,
        available_sentences(o.train, student.args) if o.data is None else None,
        time.monotonic() - started,
        len(packaged_search()[1]),
    )
    return write_report(out, report, summary)


def _texts(training: dict) -> str:
    """What a run trained on, in words: its sentences, and the strings of vocabulary words among them."""
    words = training.get("train_word_strings", 0)
    sentences = f"{training['train_sentences'] - words:,} sentences"
    return f"{sentences} and {words:,} strings of vocabulary words" if words else sentences


def _length_sentence(student: int, teacher: int) -> str:
    """The report's words on the tokens each model reads (its config, tokenizer and recipe agree on the student's)."""
    said = f"The student reads at most {student} tokens (its config, tokenizer and recipe say so)"
    if student == teacher:
        return f"{said}, as its teacher does."
    return f"{said}; the teacher reads {teacher}: texts longer than {student} tokens are cut earlier."


def calibration_sentence(c: dict) -> str:
    """The cosine calibration in words: where a threshold tuned on the teacher's cosines lands for the student."""
    parts = [
        f"{kind} pairs {v['teacher']:.2f} (teacher) vs {v['student']:.2f} (student), on {v['measured_on']}"
        for kind, v in c.items()
    ]
    return (
        (
            "Cosine calibration, mean cosine of " + "; ".join(parts) + ": a similarity threshold tuned on the "
            "teacher's cosines moves with these means."
        )
        if parts
        else ""
    )
