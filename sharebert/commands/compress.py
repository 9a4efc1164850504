"""``sharebert compress``: distil a pre-trained sentence-embedding encoder (or a GLUE classifier: general, then task
distillation) into a small ShareBERT, export it int8 and report teacher vs student (size, memory, speed, STS-B dev
Spearman or the task's dev metric)."""

from __future__ import annotations

import sys
from pathlib import Path

from sharebert_runtime import options as opt

from ..training.arguments import EMBEDDING_LOSS, EMBEDDING_LOSSES, WORD_STRINGS

# Defaults, torch-free (the --help of every command answers before torch is imported).
# LR: STS-B dev 0.8211 at 1e-3 vs 0.8183 at 5e-4 (1,500 steps, runs/abA4 vs abA1); TASK_LR: SST-2 dev 0.8406 at
# 3e-4 vs 0.8268 at 1e-4 (15 minutes from runs/long2's student): the lab notes, docs/lab/rounds.md.
MAX_PARAMS, MAX_TIME, LR, BATCH, SENTENCES, TASK_LR = "5M", 600.0, 1e-3, 32, 15000, 3e-4


def add_arguments(p):
    from ..training.arguments import FinetuneArgs
    from ..training.glue import TASKS
    from .finetune import add_save_minutes_argument

    p.add_argument(
        "teacher",
        type=opt.path,
        metavar="TEACHER",
        help="the teacher: a sentence-transformers or transformers folder of "
        "any encoder architecture (bert, distilbert, roberta, "
        "xlm-roberta, mpnet, electra, deberta-v2, albert, "
        "modernbert, ...), or such a classifier fine-tuned on "
        "a GLUE task",
    )
    p.add_argument(
        "--out",
        type=opt.path,
        required=True,
        help="output folder: student/ (the model alone, to ship), artifact/, report.md, report.json, report.png",
    )
    p.add_argument(
        "--max-params",
        default=None,
        help=f"learned parameters of the student, e.g. 3M (default {MAX_PARAMS} unless --max-bytes is given)",
    )
    p.add_argument("--max-bytes", help="bytes of the student's int8 file, e.g. 4MB")
    p.add_argument(
        "--max-time",
        type=opt.seconds,
        default=MAX_TIME,
        metavar="SECONDS",
        help=f"seconds for the whole command (default {MAX_TIME:g}): the teacher's pass, training, export "
        "and measures (a classifier teacher: both phases too), planned in one line before the first step",
    )
    p.add_argument(
        "--max-steps", type=opt.positive_int, help="stop after N optimizer steps (default: --max-time decides)"
    )
    p.add_argument(
        "--allow-untrained",
        action="store_true",
        help="run even when the plan leaves --max-time too few steps for a trained student (refused otherwise, "
        "naming the smallest --max-time that would do)",
    )
    p.add_argument(
        "--train",
        type=opt.path,
        nargs="+",
        metavar="FILE",
        help="unlabelled text (one paragraph or sentence per line, or "
        "GLUE .tsv); default: WikiText-2 valid, STS-B and SST-2 "
        "training sentences from the data folder, else the text "
        "shipped in the package (sharebert/data/text)",
    )
    p.add_argument(
        "--data",
        type=opt.path,
        metavar="DIR",
        help="a folder from `sharebert prepare --tokenizer TEACHER` instead of "
        "--train: its packed sequences, memory-mapped, the teacher run per batch",
    )
    p.add_argument(
        "--max-train-samples",
        type=opt.positive_int,
        default=SENTENCES,
        help=f"sentences to train on (default {SENTENCES}; a classifier: also its task's training examples)",
    )
    p.add_argument(
        "--loss",
        choices=EMBEDDING_LOSSES,
        default=EMBEDDING_LOSS,
        help=f"loss on the sentence vectors (default {EMBEDDING_LOSS})",
    )
    p.add_argument(
        "--word-strings",
        type=opt.non_negative_float,
        metavar="R",
        help=f"R strings of 1-4 whole words of the student's vocabulary per training sentence, each taught "
        f"with the teacher's vector: words the text lacks (default {WORD_STRINGS:g} for an encoder "
        "teacher, 0 for a classifier's general distillation; 0: off)",
    )
    p.add_argument("--lr", type=opt.positive_float, default=LR, help=f"peak learning rate (default {LR:g})")
    p.add_argument("--batch-size", type=opt.positive_int, default=BATCH, help=f"default {BATCH}")
    p.add_argument(
        "--eval-limit",
        type=opt.positive_int,
        help="a classifier teacher: score the first N GLUE dev examples (default all)",
    )
    p.add_argument(
        "--eval-pairs",
        type=opt.path,
        metavar="FILE",
        help="an encoder teacher: your sentence pairs, tab-separated sentence1, sentence2 and a gold score "
        "or same/different; the report gives teacher and student Spearman on them (beside the "
        "agreement with the teacher on held-out text, and STS-B dev where the data folder has it)",
    )
    p.add_argument(
        "--task",
        choices=list(TASKS),
        help="a classifier teacher's GLUE task (default: the one its "
        "`sharebert finetune` metrics.json records, or its label names tell)",
    )
    p.add_argument(
        "--task-lr",
        type=opt.positive_float,
        default=None,
        help=f"a classifier's task distillation: peak learning rate (default {TASK_LR:g})",
    )
    p.add_argument(
        "--augment",
        type=opt.positive_int,
        metavar="N",
        help="a classifier's task distillation: add N perturbed copies of each training example, taught "
        "by the teacher's logits (`distill --augment`; the teacher's pass grows N + 1 times)",
    )
    p.add_argument(
        "--vocab-size",
        type=opt.positive_int,
        metavar="N",
        help="keep the N tokens of the teacher's vocabulary the --train text (a classifier: and its task's "
        "training text) uses most, with its special and fallback tokens (default: the whole vocabulary, "
        "cut to the text's tokens only when it does not fit the limits)",
    )
    p.add_argument("--seed", type=int, default=0)
    add_save_minutes_argument(p, FinetuneArgs.save_minutes)
    p.add_argument(
        "--no-portable",
        dest="portable",
        action="store_false",
        help="an encoder teacher: --out/student without the modeling code that lets AutoModel / "
        "SentenceTransformer load it with trust_remote_code=True where sharebert is not installed",
    )
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="an encoder teacher: keep --out/work (the distillation's checkpoints and the teacher's "
        "vectors), which a finished run removes",
    )
    p.add_argument(
        "--web",
        action="store_true",
        help="also write --out/web: the student as a folder transformers.js loads in a web page or Node, as "
        "`sharebert export --format web --quantize int8` writes it (docs/DEVICE.md)",
    )
    p.add_argument("--resume", action="store_true", help="continue a stopped run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier compress result in --out")


def clock_start() -> float:
    """When ``--max-time`` starts (it bounds the whole command, an encoder teacher): the process's start where the
    process is the command (its interpreter's start and imports count); this call where ``main(argv)`` runs inside a
    longer-lived Python process (a notebook, a test worker), whose age is none of the command's."""
    import time

    from sharebert_runtime import main as command

    from ..pipelines.plan import process_start

    return process_start() if command.PROGRAM else time.monotonic()


def run(args) -> int:
    started = clock_start()
    limits = _limits(args)

    from ..pipelines.plan import precheck

    # every check that needs no model comes first, torch not imported yet (a bad --train or --out: < 2 s); the
    # teacher's config.json is read there, once for the whole run (pipelines.run.Teacher)
    compress_run = precheck(_options(args, limits))
    classifier = compress_run.teacher.is_classifier
    _check_teacher_options(args, classifier)

    from dataclasses import replace

    from sharebert_runtime.outdir import run_lock

    from ..pipelines.compress import compress
    from ..pipelines.compress_classifier import compress_classifier
    from ..training.callbacks import SignalCheckpoint, StopRequested
    from .finetune import stopped_on_nan

    eargs, task_args = _recipes(args, classifier)
    compress_run.options = replace(compress_run.options, args=eargs, task_args=task_args)
    resume = "continue with the same command plus --resume"
    r = None
    try:
        with SignalCheckpoint() as stopper, run_lock(args.out, "compress"), stopped_on_nan("compress"):
            compress_run.stopper, compress_run.budget = stopper, _budget(args, started)  # one run per --out at once
            r = (compress_classifier if classifier else compress)(compress_run)
    except StopRequested as e:
        print(f"{e}: stopped while scoring (the last checkpoint is kept); {resume}", file=sys.stderr)
        return 128 + e.signum
    if r is None:
        return 3  # stopped_on_nan said why
    if r.get("stopped"):
        phase = f" of the {r['phase']} phase" if "phase" in r else ""
        print(f"stopped at step {r['steps']}{phase} (checkpoint saved); {resume}")
        return 130
    _print_result(r)
    written = [name for name in ("report.md", "report.json", "report.png") if Path(args.out, name).is_file()]
    print(f"{', '.join(written)} -> {args.out}")  # no report.png where matplotlib is absent
    return 0


def _options(args, limits: dict):
    """What the user asked, as the run carries it (``pipelines.run.CompressOptions``); the distillation's recipes
    (``_recipes``) are added once the checks have told an encoder from a classifier."""
    from ..pipelines.run import CompressOptions

    return CompressOptions(
        teacher=args.teacher,
        out=args.out,
        limits=limits,
        args=None,
        task=args.task,
        train=args.train,
        data=args.data,
        eval_pairs=args.eval_pairs,
        overwrite=args.overwrite,
        resume=args.resume,
        portable=args.portable,
        keep_work=args.keep_work,
        vocab_size=args.vocab_size,
        web=args.web,
    )


def _budget(args, started: float):
    """The whole command's ``TimeBudget`` (None without --max-time): its plan refuses fewer steps than a trained
    student takes, unless --allow-untrained or --max-steps (the user's own count) says otherwise."""
    from ..pipelines.plan import TimeBudget, trained_steps

    if not args.max_time:
        return None
    budget = TimeBudget(args.max_time, start=started)
    if not (args.allow_untrained or args.max_steps):
        budget.min_steps = trained_steps(args.batch_size)
    return budget


def _limits(args) -> dict:
    """``max_params`` and ``max_bytes`` (None: not given); neither given: ``MAX_PARAMS``."""
    from ..accounting.budget import parse_size

    limits = {
        "max_params": parse_size(args.max_params) if args.max_params else None,
        "max_bytes": parse_size(args.max_bytes) if args.max_bytes else None,
    }
    if limits["max_params"] is None and limits["max_bytes"] is None:
        limits["max_params"] = parse_size(MAX_PARAMS)
    return limits


def _check_teacher_options(args, classifier: bool) -> None:
    """``ValueError`` for an option of the other kind of teacher (a classifier's or an encoder's)."""
    if classifier and args.eval_pairs:
        raise ValueError(
            "--eval-pairs is for an encoder teacher; a classifier is scored on its GLUE task's dev set "
            "(--eval-limit N: its first N examples)"
        )
    if not classifier and args.eval_limit:
        raise ValueError(
            "--eval-limit is for a classifier teacher's GLUE dev set; an encoder's STS-B row is always "
            "on all 1,500 pairs (--eval-pairs FILE: your own pairs)"
        )
    if classifier and args.data:
        raise ValueError("--data is for an embedding teacher; a classifier's general distillation reads --train text")
    if classifier and (args.keep_work or not args.portable):
        raise ValueError(
            f"--{'keep-work' if args.keep_work else 'no-portable'} is for an encoder teacher; a "
            "classifier's phases keep their own folders (general/, student/)"
        )
    for name in ("task_lr", "augment"):
        if not classifier and getattr(args, name) is not None:
            raise ValueError(
                f"--{name.replace('_', '-')} is for a classifier teacher's task distillation; "
                f"{args.teacher} is an encoder"
            )


def _recipes(args, classifier: bool):
    """The embedding distillation's recipe and a classifier's task distillation's, sharing the step options."""
    from ..training.arguments import DistillArgs, DistillWeights, EmbeddingArgs

    steps = dict(
        epochs=1000.0,
        batch_size=args.batch_size,
        warmup_steps=min(100, (args.max_steps or 500) // 5),
        max_steps=args.max_steps or (None if args.max_time else 1000),
        seed=args.seed,
        max_train_samples=args.max_train_samples,
        eval_steps=200,
        save_minutes=args.save_minutes,
    )
    eargs = EmbeddingArgs(
        lr=args.lr,
        **steps,
        loss=args.loss,
        max_time=args.max_time,
        words=(0.0 if classifier else WORD_STRINGS) if args.word_strings is None else args.word_strings,
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    task_args = DistillArgs(
        lr=args.task_lr or TASK_LR, **steps, max_eval_samples=args.eval_limit, augment=args.augment or 0
    )
    return eargs, task_args


def _print_result(r: dict) -> None:
    """The teacher's and the student's figures, a few lines."""
    t, s = r["teacher"], r["student"]
    if "task" in r:
        q = f"{r['task']} dev {r['metric']}"
        print(
            f"teacher {t['learned_params']:,} params, {t['artifact_bytes'] / 1e6:.1f} MB {t['quantization']}, {q} "
            f"{t['glue_dev']:.4f} ({t['quantization']} {t['glue_dev_artifact']:.4f}), "
            f"p50 16 tok {t['p50_ms_16']:.1f} ms"
        )
        print(
            f"student {s['learned_params']:,} params, {s['file_bytes'] / 1e6:.1f} MB int8, {q} {s['glue_dev']:.4f} "
            f"(fp32 {s['glue_dev_fp32']:.4f}), p50 16 tok {s['p50_ms_16']:.1f} ms"
        )
        _print_verdict(r)
        return
    for who, d in (("teacher", t), ("student", s)):
        size = (
            f"{d['artifact_bytes'] / 1e6:.1f} MB {d['quantization']}"
            if who == "teacher"
            else f"{d['file_bytes'] / 1e6:.1f} MB int8"
        )
        print(
            f"{who} {d['learned_params']:,} params, {size}, p50 16 tok {d['p50_ms_16']:.1f} ms, peak RSS "
            f"{d['peak_rss_bytes'] / 1e6:.0f} MB"
        )
    for q in r["quality"]:
        print(f"  {q['label']}: teacher {t[q['key']]:.4f}, student {s[q['key']]:.4f}")
    _print_verdict(r)


def _print_verdict(r: dict) -> None:
    """The report's verdict lines, last, where the eye lands."""
    for line in (r.get("verdict") or {}).get("lines") or ():
        print(line)
