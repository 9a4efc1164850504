"""Knowledge distillation of a GLUE task into a ShareBERT student (``distill_glue``): the teacher classifier's logits
(cached) and, by weight, its hidden states and attention maps (``distill_losses``), on the task's training split,
perhaps with ``--augment``'s perturbed copies; the best dev checkpoint kept. General distillation is
``distill_mlm``, sentence embeddings ``distill_embedding``; docs/DISTILLATION.md."""

from __future__ import annotations

from pathlib import Path

import torch

from ..formats.model_folder import load_config, load_tokenizer
from ..formats.paths import data_path
from .arguments import DistillArgs
from .augment import augment, check_augment
from .callbacks import MarkCheckpoints
from .depth_table import check_depth_sampling
from .distill_losses import student_teacher_maps
from .distill_run import DISTILL, check_same_data, student_name
from .distill_teacher import (
    WithTeacherLogits,
    check_teacher_labels,
    check_tokenizers,
    load_teacher,
    logits_cache,
    teacher_logits,
)
from .distill_trainer import DistillTrainer
from .encoded import encoded_task, evaluate_dev
from .finetune import load_classifier, metrics_for, task_training_args
from .fingerprint import run_fingerprint, teacher_fingerprint
from .glue import GlueTask, get_task, task_file
from .run_skeleton import best_step, open_run


def load_student(student: str, task: GlueTask, teacher_tok, teacher_config, seed: int):
    """``(model, tokenizer)``: a preset built on the teacher's tokenizer, or a model folder (checked against it)."""
    from ..model.shape import PRESETS

    if not Path(student).exists() and student in PRESETS:
        from ..formats.build import config_for_vocab
        from ..model.modeling_sharebert import ShareBertForSequenceClassification

        config = config_for_vocab(student, {}, len(teacher_tok))
        labels = {
            "num_labels": 1 if task.is_regression else task.num_labels,
            "problem_type": "regression" if task.is_regression else "single_label_classification",
        }
        if not task.is_regression:
            labels.update(
                id2label=dict(enumerate(task.label_names)), label2id={n: i for i, n in enumerate(task.label_names)}
            )
        config.update(labels)
        torch.manual_seed(seed)
        return ShareBertForSequenceClassification(config), teacher_tok
    if not Path(student).exists():
        raise ValueError(f"--student {student} is neither a model folder nor a preset ({', '.join(PRESETS)})")
    config = load_config(student)
    tokenizer = load_tokenizer(student, config.vocab_size, needs=("pad",))
    torch.manual_seed(seed)
    return load_classifier(student, task), tokenizer


def distill_glue(  # its keywords are `sharebert distill`'s flags and compress's hooks (cache, clock, vocab)
    teacher_dir,
    student: str,
    task: str,
    out,
    data_dir=None,
    args: DistillArgs = DistillArgs(),
    overwrite: bool = False,
    resume: bool = False,
    keep_checkpoints: bool = False,
    progress: bool = True,
    cache_teacher=None,
    callbacks=(),
    clock=None,
    vocab=None,
    agreed_labels: bool = False,
    run_teacher=None,
) -> dict:
    """Distil ``teacher_dir`` (a classifier fine-tuned on ``task``) into ``student``; returns the metrics.

    ``out`` receives the best student by the task's dev metric (projections dropped), its tokenizer,
    ``log_history.json`` and ``metrics.json``: the student's dev metrics at top level, as ``finetune``
    writes them, and the teacher's under ``"teacher"``. Every input is checked before training.
    ``cache_teacher`` (a folder) keeps the teacher's training-set logits between runs; with the
    hidden, attention and embedding weights at 0 the teacher then never runs during training. ``callbacks``:
    more ``TrainerCallback``s (``sharebert compress``: the signal checkpoint). ``clock``: a ``WallClockLimit``
    that stops training; without ``args.max_steps`` the learning rate and the progress lines follow it.
    ``vocab``: the ``vocab.CutVocabulary`` a student folder speaks (``compress`` of a classifier with a cut
    vocabulary): each example is encoded twice, the teacher's tokens for its logits and the student's for its input.
    ``agreed_labels`` (with ``cache_teacher``, a classification task): the gold-label loss only on the training
    examples the teacher labels right (``WithTeacherLogits``), so the student never learns against its teacher.
    ``run_teacher``: the folder as compress read it (``pipelines.run.Teacher``: its config, tokenizer and
    fingerprint), so it is not read or hashed again.
    """
    args.weights.check_teaches()
    if vocab is not None:
        check_cut_task(args, cache_teacher)
    from transformers import DataCollatorWithPadding

    from .teacher import read_teacher, teacher_config, teacher_tokenizer

    task_ = get_task(task)
    data_dir = Path(data_dir) if data_dir is not None else data_path("glue", task_.folder)
    inputs = (teacher_dir, data_dir) + ((student,) if Path(student).exists() else ())
    run = open_run(DISTILL, out, inputs, overwrite or resume, keep_checkpoints)
    out = run.out
    for split in ("train", *task_.dev_splits):  # a wrong --data-dir fails before any model loads
        task_file(task_, data_dir, split)
    data = {"augment": args.augment, "seed": args.seed}
    if run.resume(resume) is not None:  # its checkpoint trained on these rows (--augment, --seed)
        check_same_data(run.start_from, data)
    if run_teacher is not None:  # compress's pipelines.run.Teacher: its config.json read and checked once
        run_teacher.check_encoder()
        t_config, t_tok = run_teacher.config, run_teacher.tokenizer
    else:
        t_config = teacher_config(teacher_dir, read_teacher(teacher_dir))  # any encoder (training.teacher), read once
        t_tok = teacher_tokenizer(teacher_dir, t_config)
    check_teacher_labels(teacher_dir, t_config, task_)
    if args.augment:  # before any model loads
        check_augment(args.augment, t_tok, teacher_dir)
    speaks = t_tok if vocab is None else vocab.tokenizer  # the tokenizer the student must have
    model, s_tok = load_student(student, task_, speaks, t_config, args.seed)
    model.config.train_min_depth = check_depth_sampling(args.depth_sampling, model.config.num_hidden_layers)
    check_tokenizers(speaks, s_tok, teacher_dir, student)
    s_tok = t_tok if vocab is None else s_tok  # one tokenizer (the teacher's settings), or the student's own
    teacher = _task_teacher(teacher_dir, task_, t_config)
    w = args.weights
    pairs, groups, projections = student_teacher_maps(model, teacher, w, args.seed)

    seq_len = min(args.seq_len, model.config.max_position_embeddings, teacher.config.max_position_embeddings)
    train, train_ds, dev_ds = encoded_task(
        task_, data_dir, s_tok, seq_len, args.max_train_samples, args.max_eval_samples, progress
    )
    t_train_ds, t_dev_ds = (
        (train_ds, dev_ds)
        if vocab is None
        else encoded_task(task_, data_dir, t_tok, seq_len, args.max_train_samples, args.max_eval_samples, progress)[1:]
    )
    main_dev = dev_ds[task_.dev_splits[0]]
    if args.augment:  # the row limit, now the examples are counted: before --out is made
        check_augment(args.augment, t_tok, teacher_dir, len(train_ds))
    # hashed once: the run's fingerprint and the logits' cache key
    t_files = teacher_fingerprint(teacher_dir) if run_teacher is None else run_teacher.fingerprint
    run.start(
        run_fingerprint(
            teacher_dir, student_name(student), [train.path], f"task distillation on {task_.name}", teacher=t_files
        )
    )
    if args.augment:  # one tokenizer (a cut refuses --augment): the teacher reads the same augmented rows
        train_ds = t_train_ds = augment(
            train_ds, args.augment, t_tok, teacher.get_input_embeddings().weight, task_.is_regression, seed=args.seed
        )
    if cache_teacher is not None:
        variant = ",".join(f"{k}={v}" for k, v in data.items()) if args.augment else ""
        cache = logits_cache(cache_teacher, t_files, train.path, seq_len, len(t_train_ds), variant)
        train_ds = WithTeacherLogits(
            train_ds,
            teacher_logits(teacher, t_train_ds, cache, progress),
            agreed=agreed_labels and not task_.is_regression,
        )
    teacher_metrics = evaluate_dev(teacher, t_dev_ds, task_, progress=progress)

    targs = task_training_args(
        args,
        out,
        task_,
        progress,
        save_only_model=False,  # projections resume too
        keep_columns=cache_teacher is not None,
    )  # the cached logits reach the loss

    trainer = DistillTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        eval_dataset=main_dev,
        processing_class=s_tok,
        data_collator=DataCollatorWithPadding(s_tok),
        compute_metrics=metrics_for(task_),
        teacher=teacher,
        projections=projections,
        weights=w,
        pairs=pairs,
        groups=groups,
        regression=task_.is_regression,
        data=data,
        limit=clock,
        max_steps=args.max_steps,
        progress=progress,
    )
    for callback in (MarkCheckpoints(args.save_minutes, keep=1), *callbacks):
        trainer.add_callback(callback)
    expect = (task_.main_metric, "steps", "best_step", "teacher", "train_seconds", "train_samples")
    if (kept := run.kept(trainer, expect)) is not None:
        return kept
    result = run.train(trainer)
    metrics = {
        "task": task_.name,
        **evaluate_dev(trainer.model, dev_ds, task_, targs.per_device_eval_batch_size, progress),
    }
    metrics.update(
        train_samples=len(train_ds),
        augment=args.augment,
        eval_samples=len(main_dev),
        steps=trainer.state.global_step,
        best_step=best_step(trainer),
        **trainer.trained(result),
        seed=args.seed,
        teacher=teacher_metrics,
        student=student,
        teacher_dir=str(teacher_dir),
        losses={k: getattr(w, k) for k in ("kl", "hard", "hidden", "attention", "embedding")},
        temperature=w.temperature,
        layer_map=[list(p) for p in pairs],
    )
    if trainer.is_world_process_zero():  # the student alone: the projections live in the trainer
        trainer.model.save_pretrained(str(out))
        s_tok.save_pretrained(str(out))
    return run.publish(trainer, metrics)


def _task_teacher(teacher_dir, task_, config):
    """The teacher classifier (loaded with its ``config``, made once), its generic LABEL_i names read as the task's
    labels, in order."""
    teacher = load_teacher(teacher_dir, config=config)
    if not task_.is_regression:
        teacher.config.id2label = dict(enumerate(task_.label_names))
        teacher.config.label2id = {n: i for i, n in enumerate(task_.label_names)}
    return teacher


def check_cut_task(args: DistillArgs, cache_teacher) -> None:
    """A cut vocabulary's task distillation: the teacher reads other tokens than the student, so it teaches by its
    logits alone (computed once, on its own tokens), and no --augment (its perturbed copies are the teacher's ids)."""
    w = args.weights
    if cache_teacher is None or w.hidden or w.attention or w.embedding:
        raise ValueError(
            "a cut vocabulary's student learns a task from the teacher's cached logits alone (no hidden, "
            "attention or embedding terms): the teacher reads other tokens than the student"
        )
    if args.augment:
        raise ValueError(
            f"--augment {args.augment} perturbs the teacher's token ids, which a cut vocabulary's student "
            "does not read: drop --augment, or --vocab-size (or give limits the whole vocabulary fits)"
        )
