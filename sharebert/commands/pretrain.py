"""``sharebert pretrain``: masked-LM (or causal / character-level LM) pre-training with the ``Trainer``."""

from __future__ import annotations

import signal
import sys

from sharebert_runtime import options as opt
from sharebert_runtime.outdir import rank


def add_arguments(p):
    from ..model.shape import PRESETS
    from ..training.arguments import PretrainArgs
    from .finetune import add_depth_sampling_argument, add_save_minutes_argument

    d = PretrainArgs()
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", type=opt.path, help="model folder to start from (config.json, weights, tokenizer)")
    src.add_argument("--preset", help=f"build a fresh model into --out first; one of: {', '.join(PRESETS)}")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="override a preset config field, e.g. --set qk_share_ratio=0.9 (repeatable; --preset only)",
    )
    p.add_argument("--vocab", type=opt.path, help="WordPiece vocab.txt for --preset (default: bert-base-uncased)")
    p.add_argument(
        "--train",
        type=opt.path,
        nargs="+",
        metavar="FILE",
        help="text files, MediaWiki XML dumps (.xml/.xml.bz2), folders or hf:NAME[:CONFIG][:SPLIT] "
        "(default with --char-level: tinyshakespeare)",
    )
    p.add_argument(
        "--data",
        type=opt.path,
        metavar="DATA_DIR",
        help="a data folder from `sharebert prepare` (memory-mapped token shards) instead of --train",
    )
    p.add_argument(
        "--valid",
        type=opt.path,
        nargs="+",
        metavar="FILE",
        help=f"validation corpora (default: the last {d.valid_fraction:.0%}% of --train)",
    )
    p.add_argument(
        "--valid-fraction",
        type=opt.fraction,
        default=d.valid_fraction,
        help="share of the train stream held out when --valid is not given (0: no validation)",
    )
    p.add_argument(
        "--out", type=opt.path, required=True, help="output folder: checkpoints, logs, final model, metrics.json"
    )
    p.add_argument("--objective", choices=["mlm", "clm"], default=d.objective)
    p.add_argument(
        "--char-level",
        action="store_true",
        help="character tokenizer + causal LM (needs --objective clm; default preset charlm-6l)",
    )
    p.add_argument("--max-steps", type=opt.positive_int, default=d.max_steps)
    p.add_argument(
        "--max-time",
        type=opt.seconds,
        default=None,
        metavar="SECONDS",
        help="stop (with a checkpoint and the final model) so that training and its evaluations, the "
        "final one included, fit in this many seconds of training (those before a --resume count: "
        "raise it to train on); the learning-rate schedule still follows --max-steps",
    )
    p.add_argument(
        "--batch-size", type=opt.positive_int, default=d.batch_size, help="sequences per process and micro-step"
    )
    p.add_argument("--grad-accum", type=opt.positive_int, default=d.grad_accum, help="micro-steps per optimizer step")
    p.add_argument("--lr", type=opt.positive_float, default=d.lr)
    p.add_argument("--weight-decay", type=opt.non_negative_float, default=d.weight_decay)
    p.add_argument("--warmup-ratio", type=opt.fraction, default=d.warmup_ratio)
    p.add_argument("--max-grad-norm", type=opt.non_negative_float, default=d.max_grad_norm)
    p.add_argument(
        "--seq-len",
        type=opt.seq_len,
        default=None,
        help="tokens per sequence (default 128; with --char-level the model's block size)",
    )
    p.add_argument("--save-steps", type=opt.positive_int, default=d.save_steps)
    add_save_minutes_argument(p, d.save_minutes)
    p.add_argument("--eval-steps", type=opt.positive_int, default=d.eval_steps)
    p.add_argument("--logging-steps", type=opt.positive_int, default=d.logging_steps)
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=d.keep_checkpoints,
        help="newest complete checkpoints kept (at least 1; the newest is never deleted)",
    )
    p.add_argument(
        "--eval-samples",
        "--max-eval-sequences",
        dest="max_eval_sequences",
        type=int,
        default=d.max_eval_sequences,
        help="validation sequences scored at each evaluation",
    )
    p.add_argument("--eval-on-start", action="store_true", help="also score the untrained model at step 0")
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        default=d.precision,
        help="auto: bf16 (or fp16) on CUDA, fp32 on CPU",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    add_depth_sampling_argument(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    p.add_argument(
        "--convert-to-sharebert",
        action="store_true",
        help="save a transformers BERT --model as a ShareBERT folder (default: BERT in, BERT out)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from ..model.shape import parse_overrides, preset_fields
    from ..training.arguments import PretrainArgs, from_options

    if args.preset:
        preset_fields(args.preset)  # an unknown preset fails before torch is imported
    from ..formats.model_folder import check_convert

    check_convert(args.model, args.out, args.convert_to_sharebert, args.resume)  # never ignored; before torch
    a = from_options(PretrainArgs, args, progress=not args.no_progress, overrides=parse_overrides(args.overrides))
    from ..training.callbacks import StopRequested
    from ..training.pretrain import NonFiniteLoss, pretrain

    try:
        m = pretrain(
            args.train,
            args.out,
            model_dir=args.model,
            preset=args.preset,
            valid=args.valid,
            args=a,
            vocab=args.vocab,
            data=args.data,
        )
    except NonFiniteLoss as e:
        print(f"sharebert pretrain: stopped: {e}")
        return 3
    except StopRequested as e:
        print(
            f"sharebert pretrain: {e}: stopped before the first training step (nothing to save); rerun with --resume",
            file=sys.stderr,
        )
        return 128 + e.signum
    if rank() != 0:
        return 130 if m["status"] == "interrupted" else 0
    if m["status"] == "interrupted":
        name = signal.Signals(m["signal"]).name
        saved = f"saved {m['checkpoint']}" if m["checkpoint"] else "no step completed, nothing saved"
        print(f"{name}: {saved} at step {m['global_step']}; continue with the same command plus --resume")
        return 128 + m["signal"]
    ev = f", eval loss {m['eval_loss']:.4f} (perplexity {m['eval_perplexity']:.2f})" if "eval_loss" in m else ""
    limit = (
        f" (stopped by --max-time after {m['train_seconds']:.0f} s of training)"
        if m["stopped_by"] == "max_time"
        else ""
    )
    print(
        f"trained {m['global_step']} steps{limit} on {m['train_tokens']:,} tokens: "
        f"train loss {m['train_loss']:.4f}{ev}; model and metrics.json in {args.out}"
    )
    return 0
