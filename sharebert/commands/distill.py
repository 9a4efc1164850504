"""``sharebert distill``: knowledge distillation from a fine-tuned BERT-family teacher into a ShareBERT student."""

from __future__ import annotations

from sharebert_runtime import options as opt
from sharebert_runtime.outdir import rank

from ..training.arguments import EMBEDDING_LOSS, EMBEDDING_LOSSES


def add_arguments(p):
    from ..training.arguments import DistillWeights, FinetuneArgs
    from ..training.glue import TASKS
    from .finetune import add_training_arguments

    d, w = FinetuneArgs(), DistillWeights()
    p.add_argument(
        "--teacher",
        type=opt.path,
        required=True,
        help="teacher folder: a transformers BertForSequenceClassification or a `sharebert finetune` output for --task",
    )
    p.add_argument(
        "--student", type=opt.path, required=True, help="student: a preset (e.g. sharebert-tiny) or a model folder"
    )
    p.add_argument(
        "--objective",
        choices=["glue", "mlm", "embedding"],
        default="glue",
        help="glue: task distillation (--task); mlm: general distillation on --train text; embedding: "
        "the teacher's sentence embeddings on --train text (default: the data folder's sentences) or --data",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="--objective embedding: shape the preset student, e.g. --set embedding_size=128 (repeatable)",
    )
    p.add_argument(
        "--loss",
        choices=EMBEDDING_LOSSES,
        default=EMBEDDING_LOSS,
        help=f"--objective embedding: loss on the sentence vectors (default {EMBEDDING_LOSS})",
    )
    p.add_argument(
        "--word-strings",
        type=opt.non_negative_float,
        default=0.0,
        metavar="R",
        help="--objective embedding: R strings of 1-4 whole words of the student's vocabulary per training "
        "sentence, each taught with the teacher's vector (default 0; compress uses 1)",
    )
    p.add_argument(
        "--init",
        choices=["teacher", "random"],
        default="teacher",
        help="--objective embedding: start the student's embeddings from the teacher's (PCA) or at random",
    )
    p.add_argument(
        "--max-time",
        type=opt.seconds,
        metavar="SECONDS",
        help="--objective embedding or glue: stop training after SECONDS (checkpoint, then the student "
        "is saved); without --max-steps the learning rate falls to 0 as the time is spent, and the run "
        "goes on until then unless --epochs is given",
    )
    p.add_argument("--task", choices=list(TASKS), help="GLUE task (--objective glue)")
    p.add_argument(
        "--train",
        type=opt.path,
        nargs="+",
        metavar="FILE",
        help="--objective mlm: text files, MediaWiki XML or folders",
    )
    p.add_argument(
        "--data",
        type=opt.path,
        metavar="DIR",
        help="--objective mlm / embedding: a folder from `sharebert prepare` "
        "(the teacher's tokenizer), instead of --train",
    )
    p.add_argument("--data-dir", type=opt.path, help="the task's folder (default ../shared/data/glue/<Task>)")
    p.add_argument("--out", type=opt.path, required=True, help="output folder: best student, tokenizer, metrics.json")
    p.add_argument(
        "--temperature",
        type=opt.positive_float,
        default=w.temperature,
        help=f"softmax temperature (default {w.temperature:g})",
    )
    for name, what in (
        ("kl", "soft-target KL (x T^2)"),
        ("hard", "gold-label loss"),
        ("hidden", "hidden-state MSE"),
        ("attention", "attention-map MSE"),
        ("embedding", "embedding-output MSE"),
    ):
        p.add_argument(
            f"--{name}-weight",
            type=opt.non_negative_float,
            help=f"{what} (default {getattr(w, name):g}; 0 with --objective embedding)",
        )
    p.add_argument("--layer-map", help="STUDENT:TEACHER layer pairs, 1-based, e.g. 1:3,2:6 (default: uniform)")
    add_training_arguments(p, d)
    p.set_defaults(epochs=None)  # None: --epochs' default, or until --max-time when it bounds the run alone
    p.add_argument(
        "--augment",
        type=opt.positive_int,
        metavar="N",
        help="--objective glue: add N perturbed copies of each training example (10%% of word tokens "
        "masked, 10%% swapped for a near word in the teacher's embedding table), taught by the "
        "teacher's logits alone (docs/DISTILLATION.md)",
    )
    p.add_argument(
        "--cache-teacher",
        type=opt.path,
        metavar="DIR",
        help="keep the teacher's training-set logits in DIR (reused by "
        "later runs; with --hidden/--attention/--embedding-weight 0 "
        "the teacher does not run during training)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep out/checkpoints after training")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier distillation result in --out")


# Options only some objectives read (their other option checks are below): given to another, they are refused.
OBJECTIVE_OPTIONS = {
    "loss": ("embedding",),
    "data_dir": ("glue",),
    "cache_teacher": ("glue",),
    "data": ("mlm", "embedding"),
}
OPTION_DEFAULTS = {"loss": EMBEDDING_LOSS}


def run(args) -> int:
    from sharebert_runtime.outdir import run_lock

    from .finetune import stopped_on_nan

    with run_lock(args.out, "distill"), stopped_on_nan("distill"):  # one run at a time per --out
        return _run(args)
    return 3  # stopped_on_nan said why


def _run(args) -> int:
    dargs = _distill_args(args)
    _check_objective_options(args, dargs.weights)
    return {"embedding": _run_embedding, "mlm": _run_mlm, "glue": _run_glue}[args.objective](args, dargs)


def _distill_args(args):
    """The recipe (``DistillArgs``) the options give, each numeric option checked to be positive. The token-level
    terms of ``--objective embedding`` are off unless asked for; ``--max-time`` without ``--max-steps`` lets the
    clock end the run (its schedule anneals to 0)."""
    from ..training.arguments import DistillArgs, DistillWeights, from_options, parse_layer_map

    for name in (
        "epochs",
        "batch_size",
        "lr",
        "seq_len",
        "max_steps",
        "max_train_samples",
        "max_eval_samples",
        "eval_steps",
    ):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    terms = {name: getattr(args, f"{name}_weight") for name in ("kl", "hard", "hidden", "attention", "embedding")}
    off = 0.0 if args.objective == "embedding" else None
    terms = {k: v for k, v in terms.items() if v is not None or off is not None}
    terms = {k: (off if v is None else v) for k, v in terms.items()}
    weights = DistillWeights(temperature=args.temperature, layer_map=parse_layer_map(args.layer_map), **terms)
    if args.epochs is None:
        args.epochs = 1000.0 if args.max_time and not args.max_steps else DistillArgs.epochs
    return from_options(DistillArgs, args, weights=weights, augment=args.augment or 0)


def _check_objective_options(args, weights) -> None:
    """``ValueError`` for an option the chosen objective does not read: refused, never ignored."""
    if args.objective != "embedding" and (args.overrides or args.init != "teacher"):
        raise ValueError("--set and --init are for --objective embedding")
    for option, objectives in OBJECTIVE_OPTIONS.items():
        if getattr(args, option) not in (None, OPTION_DEFAULTS.get(option)) and args.objective not in objectives:
            raise ValueError(
                f"--{option.replace('_', '-')} is for --objective {' and '.join(objectives)}, not {args.objective}"
            )
    if args.objective != "glue" and args.augment:
        raise ValueError("--augment is for --objective glue")
    if args.augment and not weights.kl:
        raise ValueError("--augment's copies learn from the teacher's logits alone: it needs --kl-weight above 0")
    if args.objective == "mlm" and args.max_time:
        raise ValueError("--max-time is for --objective embedding and glue")


def _run_mlm(args, dargs) -> int:
    if args.task:
        raise ValueError("--task is for --objective glue; --objective mlm reads --train text or --data")
    from ..training.distill_mlm import distill_mlm  # torch: once the options are known to be good

    m = distill_mlm(
        args.teacher,
        args.student,
        args.train,
        args.out,
        dargs,
        overwrite=args.overwrite,
        resume=args.resume,
        data=args.data,
    )
    loss = "not logged" if m["train_loss"] is None else f"{m['train_loss']:.4f}"  # a resume that logged none
    print(f"distilled {m['steps']} steps: train loss {loss}; student and metrics.json -> {args.out}")
    return 0


def _run_glue(args, dargs) -> int:
    if not args.task:
        raise ValueError("--task is required (or --objective mlm with --train)")
    if args.train:
        raise ValueError("--train is for --objective mlm; task distillation reads the task's files (--data-dir)")
    from ..training.callbacks import WallClockLimit
    from ..training.distill import distill_glue  # torch: once the options are known to be good
    from .tables import format_table

    metrics = distill_glue(
        args.teacher,
        args.student,
        args.task,
        args.out,
        args.data_dir,
        dargs,
        overwrite=args.overwrite,
        resume=args.resume,
        keep_checkpoints=args.keep_checkpoints,
        cache_teacher=args.cache_teacher,
        clock=WallClockLimit(args.max_time) if args.max_time else None,
    )
    if rank() == 0:
        teacher = metrics.pop("teacher")
        rows = [[k, v] for k, v in metrics.items() if not isinstance(v, (dict, list))]
        rows += [[f"teacher {k}", v] for k, v in teacher.items()]
        print(format_table(["metric", "value"], rows))
        print(f"best student and metrics.json -> {args.out}")
    return 0


def _run_embedding(args, dargs) -> int:
    from dataclasses import asdict

    from ..model.shape import parse_overrides
    from ..training.arguments import EmbeddingArgs
    from ..training.distill_embedding import distill_embedding

    if args.task:
        raise ValueError("--task is for --objective glue; --objective embedding reads --train text or --data")
    if args.max_time is not None and not args.max_time > 0:
        raise ValueError(f"--max-time must be positive, got {args.max_time}")
    eargs = EmbeddingArgs(
        **asdict(dargs) | {"weights": dargs.weights},
        loss=args.loss,
        init=args.init,
        max_time=args.max_time,
        words=args.word_strings,
    )
    m = distill_embedding(
        args.teacher,
        args.student,
        args.out,
        args.train,
        eargs,
        overrides=parse_overrides(args.overrides),
        overwrite=args.overwrite,
        resume=args.resume,
        data=args.data,
        eval_limit=args.max_eval_samples,
    )  # STS-B dev pairs scored
    sts = (
        f"STS-B dev Spearman ({m['sts_dev_pairs']} pairs): teacher {m['teacher_sts_spearman']:.4f}, student at "
        f"start {m['start_sts_spearman']:.4f}, after {m['student_sts_spearman']:.4f}"
        if m.get("student_sts_spearman") is not None
        else "no STS-B dev in the data folder to score on"
    )
    print(f"distilled {m['steps']} steps in {m['train_seconds']:.0f} s; {sts}; student and metrics.json -> {args.out}")
    return 0
