"""GLUE fine-tuning with the transformers ``Trainer``: ``finetune(model_dir, task, data_dir, out) -> metrics``.

A pre-trained model folder (a ``ShareBertForMaskedLM`` checkpoint, or any ShareBERT checkpoint) is
loaded into ``ShareBertForSequenceClassification`` (one output, MSE, for STS-B). Defaults are the
reference fine-tuning recipe (SPEC section 6): lr 5e-5, batch 64, 5 epochs, polynomial decay,
50 warm-up steps, sequence length 128. The dev set is scored after every epoch (or every
``eval_steps``) and the best checkpoint by the task's metric is kept; ``out`` receives that model,
its tokenizer, ``metrics.json`` (written last) and ``log_history.json``.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from pathlib import Path

import torch
from transformers import Trainer

from sharebert_runtime.outdir import OutLock, rank

from ..formats.model_folder import is_bert_folder, load_config, load_model, load_tokenizer, save_as_bert
from ..formats.paths import data_path
from .arguments import FinetuneArgs
from .callbacks import FitsCheckpoint, MarkCheckpoints, StopsAtMaxSteps, StopsOnNonFiniteLoss, WarmupMayFillTheRun
from .depth_table import check_depth_sampling
from .encoded import encoded_task, evaluate_dev
from .fingerprint import run_fingerprint
from .glue import GlueTask, get_task, task_file
from .log_lines import no_bars, show_progress
from .metrics import predictions_from_logits, task_metrics
from .run_skeleton import RunKind, TrainingRun, best_step, open_run


class FinetuneTrainer(FitsCheckpoint, StopsOnNonFiniteLoss, WarmupMayFillTheRun, StopsAtMaxSteps, Trainer):
    """transformers' ``Trainer``; a run resumed at its ``--max-steps`` takes no step, a checkpoint of another
    model is refused in one line, a NaN loss stops the run and a run that is all warmup ends."""


def load_classifier(model_dir: str | Path, task: GlueTask):
    """``ShareBertForSequenceClassification`` from ``model_dir`` with the task's labels (head freshly initialised)."""
    from ..model.modeling_sharebert import ShareBertForSequenceClassification

    config = load_config(model_dir)
    labels = {"num_labels": task.num_labels}
    if not task.is_regression:
        labels["id2label"] = dict(enumerate(task.label_names))
        labels["label2id"] = {n: i for i, n in enumerate(task.label_names)}
    config.update(labels)
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    return load_model(ShareBertForSequenceClassification, model_dir, config, ignore_mismatched_sizes=True)[0]


COMMAND = "finetune"  # the marker's command (``outdir.MARK``): a folder is a fine-tuning result only when it says so


def _legacy(path: Path) -> bool:
    """A folder that looks like a fine-tuning result (its metrics or checkpoints) without this command's marker:
    written by hand, by another tool, or copied. ``check_out_dir``'s ``legacy``: refused naming the marker, never
    replaced. No older format is served: sharebert 0.1.0, the first release, writes the marker."""
    return (path / "metrics.json").is_file() or (path / "checkpoints").is_dir()


def _unfinished(path: Path) -> bool:
    """A fine-tuning ``--out`` holding no result (a stopped or failed run's leftovers): a re-run may replace it."""
    return path.is_dir() and FINETUNE.is_ours(path) and not (path / "metrics.json").is_file()


FINETUNE = RunKind("fine-tuning result", COMMAND, _legacy)


def task_training_args(
    args: FinetuneArgs,
    out: Path,
    task: GlueTask,
    progress: bool,
    save_only_model: bool = True,
    keep_columns: bool = False,
):
    """The Trainer's arguments for a run over a GLUE task: checkpoints under ``out/checkpoints``, the dev set
    scored every epoch (or ``eval_steps``), the best checkpoint by the task's metric kept and reloaded (the
    rotation is :class:`~.callbacks.MarkCheckpoints`' with ``keep=1``, after the marker),
    bf16 (or fp16) on a GPU. ``save_only_model=False`` keeps optimizer states for ``--resume``; ``keep_columns``
    hands the loss every field of a batch (the Trainer drops those the model's ``forward`` does not take)."""
    from transformers import TrainingArguments

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    strategy = "steps" if args.eval_steps else "epoch"
    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=max(args.batch_size, 64),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        lr_scheduler_type="polynomial",
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        eval_strategy=strategy,
        save_strategy=strategy,
        eval_steps=args.eval_steps,
        save_steps=args.eval_steps,
        load_best_model_at_end=True,
        metric_for_best_model=task.main_metric,
        greater_is_better=True,
        save_total_limit=None,
        save_only_model=save_only_model,
        logging_steps=max(1, min(50, args.eval_steps or 50)),
        seed=args.seed,
        bf16=bf16,
        fp16=cuda and not bf16,
        report_to="none",
        disable_tqdm=no_bars(progress),
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda,
        remove_unused_columns=not keep_columns,
    )


def metrics_for(task: GlueTask):
    """The Trainer's ``compute_metrics`` for ``task``; NaN scores as -1, so NaN never wins "best"."""

    def compute_metrics(pred):
        scores = task_metrics(
            task.metrics, predictions_from_logits(pred.predictions, task.is_regression), pred.label_ids
        )
        return {k: (-1.0 if math.isnan(v) else v) for k, v in scores.items()}

    return compute_metrics


def finetune(  # its keywords are `sharebert finetune`'s flags
    model_dir: str | Path,
    task: str,
    out: str | Path,
    data_dir: str | Path | None = None,
    args: FinetuneArgs = FinetuneArgs(),
    overwrite: bool = False,
    keep_checkpoints: bool = False,
    progress: bool = True,
    resume: bool = False,
) -> dict:
    """Fine-tune ``model_dir`` on ``task`` (data from ``data_dir``, default ``glue/<Task>``); returns the metrics.

    The returned dict (also ``out/metrics.json``) holds the task's dev metrics of the best checkpoint
    (``accuracy``/``f1``/``matthews_correlation``/``pearson``/``spearman``; MNLI adds
    ``accuracy_mismatched``), plus ``task``, ``train_samples``, ``eval_samples``, ``steps``,
    ``best_step`` and ``train_seconds``. ``resume``: continue from the newest complete checkpoint in
    ``out/checkpoints`` (``ValueError`` when there is none).
    """
    task_ = get_task(task)
    data_dir = Path(data_dir) if data_dir is not None else data_path("glue", task_.folder)
    replace = overwrite or resume or _unfinished(Path(out))
    run = open_run(FINETUNE, out, (model_dir, data_dir), replace, keep_checkpoints)
    out = run.out
    for split in ("train", *task_.dev_splits):  # a wrong --data-dir fails before the model loads
        task_file(task_, data_dir, split)
    rank0 = rank() == 0
    created = not out.exists()
    if rank0:
        out.mkdir(parents=True, exist_ok=True)
    try:
        with OutLock(out, COMMAND) if rank0 else contextlib.nullcontext():
            # under the lock: a run still saving there is never taken for an interrupted one (its checkpoint set aside)
            run.resume(resume)
            return _finetune(run, model_dir, task_, data_dir, args, progress)
    except (ValueError, FileNotFoundError):
        if created and rank0 and not (out / "checkpoints").exists():
            shutil.rmtree(out, ignore_errors=True)  # bad input found before training: leave no --out behind
        raise


def _finetune(run: TrainingRun, model_dir, task_: GlueTask, data_dir: Path, args: FinetuneArgs, progress: bool) -> dict:
    from transformers import DataCollatorWithPadding, set_seed

    config = load_config(model_dir)
    check_depth_sampling(args.depth_sampling, config.num_hidden_layers)
    tokenizer = load_tokenizer(model_dir, config.vocab_size, needs=("pad",))
    seq_len = min(args.seq_len, config.max_position_embeddings)
    # Read and validate every file before the model loads: a bad row is one line, not under transformers' load report
    _, train_ds, dev_ds = encoded_task(
        task_, data_dir, tokenizer, seq_len, args.max_train_samples, args.max_eval_samples, progress
    )
    set_seed(args.seed)
    model = load_classifier(model_dir, task_)
    model.config.train_min_depth = args.depth_sampling  # the option decides, whatever the folder held
    main_dev = dev_ds[task_.dev_splits[0]]
    fp = run_fingerprint(model_dir, None, [task_file(task_, data_dir, "train")], f"fine-tuning on {task_.name}")
    fp = {"model": fp.pop("teacher"), **{k: v for k, v in fp.items() if k != "student"}}
    run.start(fp)  # a --resume: the same model, data and task

    targs = task_training_args(args, run.out, task_, progress, save_only_model=False)  # optimizer state: --resume

    trainer = FinetuneTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        eval_dataset=main_dev,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=metrics_for(task_),
    )
    show_progress(trainer, progress)
    trainer.add_callback(MarkCheckpoints(args.save_minutes, keep=1))
    if (kept := run.kept(trainer, expect=(task_.main_metric, "steps", "best_step", "train_seconds"))) is not None:
        return kept
    result = run.train(trainer)

    metrics = {
        "task": task_.name,
        **evaluate_dev(trainer.model, dev_ds, task_, targs.per_device_eval_batch_size, progress),
    }
    metrics.update(
        train_samples=len(train_ds),
        eval_samples=len(main_dev),
        steps=trainer.state.global_step,
        best_step=best_step(trainer),
        train_seconds=round(result.metrics.get("train_runtime", 0.0), 1),
        seed=args.seed,
    )
    trainer.save_model(str(run.out))  # the main process writes; the others wait
    if trainer.is_world_process_zero() and is_bert_folder(model_dir) and not args.convert_to_sharebert:
        save_as_bert(trainer.model, run.out)  # BERT stays BERT: transformers loads it as BertForSequenceClassification
    return run.publish(trainer, metrics)
