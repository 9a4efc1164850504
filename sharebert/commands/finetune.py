"""``sharebert finetune``: fine-tune a pre-trained model folder on one GLUE task."""

from __future__ import annotations

import contextlib
import sys

from sharebert_runtime import options as opt
from sharebert_runtime.outdir import rank


def add_arguments(p):
    from ..training.arguments import FinetuneArgs
    from ..training.glue import TASKS

    d = FinetuneArgs()
    p.add_argument(
        "--model", type=opt.path, required=True, help="pre-trained model folder (e.g. a `sharebert pretrain` output)"
    )
    p.add_argument("--task", required=True, choices=list(TASKS), help="GLUE task")
    p.add_argument(
        "--data-dir",
        type=opt.path,
        help="the task's folder holding train.tsv and dev.tsv (MNLI: dev_matched.tsv, "
        "dev_mismatched.tsv); default ../shared/data/glue/<Task>",
    )
    p.add_argument("--out", type=opt.path, required=True, help="output folder: best model, tokenizer, metrics.json")
    add_training_arguments(p, d)
    p.add_argument("--keep-checkpoints", action="store_true", help="keep out/checkpoints after training")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier fine-tuning result in --out")
    p.add_argument(
        "--convert-to-sharebert",
        action="store_true",
        help="save a transformers BERT --model as a ShareBERT folder (default: BERT in, BERT out)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in --out/checkpoints (saved every epoch, or "
        "every --eval-steps, and every --save-minutes)",
    )


def add_training_arguments(p, d) -> None:
    """The options of a Trainer run over a GLUE task (``FinetuneArgs`` fields; ``d``: their defaults), shared
    by ``finetune`` and ``distill``."""
    p.add_argument(
        "--epochs", type=opt.positive_float, default=d.epochs, help=f"training epochs (default {d.epochs:g})"
    )
    p.add_argument("--max-steps", type=opt.positive_int, help="stop after N optimizer steps (overrides --epochs)")
    p.add_argument("--batch-size", type=opt.positive_int, default=d.batch_size, help=f"default {d.batch_size}")
    p.add_argument(
        "--lr", type=opt.positive_float, default=d.lr, help=f"peak learning rate (default {d.lr:g}), polynomial decay"
    )
    p.add_argument(
        "--warmup-steps", type=opt.non_negative_int, default=d.warmup_steps, help=f"default {d.warmup_steps}"
    )
    p.add_argument(
        "--weight-decay", type=opt.non_negative_float, default=d.weight_decay, help=f"default {d.weight_decay:g}"
    )
    p.add_argument(
        "--seq-len", type=opt.seq_len, default=d.seq_len, help=f"truncate inputs to N tokens (default {d.seq_len})"
    )
    p.add_argument("--max-train-samples", type=opt.positive_int, help="use the first N training examples")
    p.add_argument("--max-eval-samples", type=opt.positive_int, help="score the first N dev examples")
    p.add_argument("--eval-steps", type=opt.positive_int, help="score the dev set every N steps (default: every epoch)")
    add_save_minutes_argument(p, d.save_minutes)
    p.add_argument("--seed", type=int, default=d.seed)
    add_depth_sampling_argument(p)


def add_save_minutes_argument(p, default: float) -> None:
    """``--save-minutes M`` of ``pretrain``, ``finetune``, ``distill`` and ``compress``."""
    p.add_argument(
        "--save-minutes",
        type=opt.non_negative_float,
        default=default,
        metavar="M",
        help=f"also save a checkpoint after every M minutes of training, so a run killed at any time "
        f"(kill -9 included) can --resume from at most M minutes back (default {default:g}; 0: only "
        "the checkpoints that steps or epochs call for)",
    )


def add_depth_sampling_argument(p) -> None:
    """``--depth-sampling [MIN]`` of ``pretrain``, ``finetune`` and ``distill``."""
    p.add_argument(
        "--depth-sampling",
        nargs="?",
        const=1,
        type=opt.positive_int,
        metavar="MIN",
        help="stochastic depth over the shared layers: each training step runs the first k layers, k drawn "
        "uniformly from MIN..N (MIN 1 when bare), with the loss at that depth, so shallow depths work "
        "at inference (`evaluate glue --depths`); saved as train_min_depth in config.json",
    )


@contextlib.contextmanager
def stopped_on_nan(command: str):
    """A run of ``finetune``, ``distill`` or ``compress`` stopped by a NaN or infinite loss (``NonFiniteLoss``): one
    ``stopped:`` line naming the step and the last good checkpoint, and the body left (the caller exits 3, as
    ``pretrain`` does); its ``--out`` keeps the run's checkpoints, never a model of NaN weights. Torch-free until a
    loss was raised: the commands check their options before torch loads (a device install refuses them by name)."""
    try:
        yield
    except Exception as e:
        callbacks = sys.modules.get(f"{__package__.rpartition('.')[0]}.training.callbacks")  # raised there or not
        if callbacks is None or not isinstance(e, callbacks.NonFiniteLoss):
            raise
        print(f"sharebert {command}: stopped: {e}", file=sys.stderr)


def run(args) -> int:
    from ..formats.model_folder import check_convert

    check_convert(args.model, args.out, args.convert_to_sharebert, args.resume)  # never ignored; before torch
    from ..training.arguments import FinetuneArgs, from_options
    from ..training.finetune import finetune  # torch: only once the options are known to be good (argparse types)
    from .tables import format_table

    fargs = from_options(FinetuneArgs, args)
    metrics = None
    with stopped_on_nan("finetune"):
        metrics = finetune(
            args.model,
            args.task,
            args.out,
            args.data_dir,
            fargs,
            overwrite=args.overwrite,
            keep_checkpoints=args.keep_checkpoints,
            resume=args.resume,
        )
    if metrics is None:
        return 3  # stopped_on_nan said why
    if rank() == 0:  # one table under torchrun
        print(format_table(["metric", "value"], [[k, v] for k, v in metrics.items()]))
        print(f"best model and metrics.json -> {args.out}")
    return 0
