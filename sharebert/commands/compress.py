"""``sharebert compress``: distil a pre-trained sentence-embedding encoder into a small ShareBERT, export it int8
and report teacher vs student (size, memory, speed, STS-B dev Spearman)."""
from __future__ import annotations

from .. import options as opt
from ..training.options import EMBEDDING_LOSS, EMBEDDING_LOSSES

HELP = "compress a pre-trained encoder (e.g. all-MiniLM-L6-v2) into a small ShareBERT: pick, distil, export, report"

# Defaults, torch-free (the --help of every command answers before torch is imported).
MAX_PARAMS, MAX_TIME, LR, BATCH, SENTENCES = "5M", 600.0, 5e-4, 32, 15000


def add_arguments(p):
    p.add_argument("teacher", metavar="TEACHER", help="the teacher: a sentence-transformers or BERT-family model folder")
    p.add_argument("--out", required=True, help="output folder: student/, artifact/, report.md, report.json, report.png")
    p.add_argument("--max-params", default=None, help=f"learned parameters of the student, e.g. 3M (default {MAX_PARAMS} "
                                                      "unless --max-bytes is given)")
    p.add_argument("--max-bytes", help="bytes of the student's int8 file, e.g. 4MB")
    p.add_argument("--max-time", type=opt.positive_float, default=MAX_TIME, metavar="SECONDS",
                   help=f"training time (default {MAX_TIME:g} s; a checkpoint, then export)")
    p.add_argument("--max-steps", type=opt.positive_int, help="stop after N optimizer steps (default: --max-time decides)")
    p.add_argument("--train", nargs="+", metavar="FILE", help="unlabelled text (one paragraph or sentence per line, or "
                                                               "GLUE .tsv); default: WikiText-2 valid, STS-B and SST-2 "
                                                               "training sentences from the data folder")
    p.add_argument("--data", metavar="DIR", help="a folder from `sharebert prepare --tokenizer TEACHER` instead of "
                                                 "--train: its packed sequences, memory-mapped, the teacher run per batch")
    p.add_argument("--max-train-samples", type=opt.positive_int, default=SENTENCES, help=f"sentences to train on (default {SENTENCES})")
    p.add_argument("--loss", choices=EMBEDDING_LOSSES, default=EMBEDDING_LOSS,
                   help=f"loss on the sentence vectors (default {EMBEDDING_LOSS})")
    p.add_argument("--lr", type=opt.positive_float, default=LR, help=f"peak learning rate (default {LR:g})")
    p.add_argument("--batch-size", type=opt.positive_int, default=BATCH, help=f"default {BATCH}")
    p.add_argument("--eval-limit", type=opt.positive_int, help="score the first N STS-B dev pairs (default all 1,500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue a stopped run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier compress result in --out")


def run(args) -> int:
    from ..budget import parse_size

    limits = {"max_params": parse_size(args.max_params) if args.max_params else None,
              "max_bytes": parse_size(args.max_bytes) if args.max_bytes else None}
    if limits["max_params"] is None and limits["max_bytes"] is None:
        limits["max_params"] = parse_size(MAX_PARAMS)
    for name in ("max_time", "max_steps", "max_train_samples", "lr", "batch_size", "eval_limit"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")

    from ..training.callbacks import SignalCheckpoint
    from ..training.compress import compress
    from ..training.distill import DistillWeights
    from ..training.distill_embedding import EmbeddingArgs

    eargs = EmbeddingArgs(lr=args.lr, batch_size=args.batch_size, warmup_steps=min(100, (args.max_steps or 500) // 5), epochs=1000.0,
                          max_steps=args.max_steps or (None if args.max_time else 1000), seed=args.seed,
                          max_train_samples=args.max_train_samples, eval_steps=200, loss=args.loss,
                          max_time=args.max_time, weights=DistillWeights(hidden=0, attention=0, embedding=0))
    with SignalCheckpoint() as stopper:
        r = compress(args.teacher, args.out, limits, eargs, train=args.train, data=args.data, overwrite=args.overwrite,
                     resume=args.resume, eval_limit=args.eval_limit, stopper=stopper)
    if r.get("stopped"):
        print(f"stopped at step {r['steps']} (checkpoint saved); continue with: sharebert compress {args.teacher} "
              f"--out {args.out} --resume")
        return 130
    t, s = r["teacher"], r["student"]
    print(f"teacher {t['learned_params']:,} params, {t['artifact_bytes'] / 1e6:.1f} MB int8-dynamic, STS-B "
          f"{t['sts_spearman']:.4f}, p50 16 tok {t['p50_ms_16']:.1f} ms")
    print(f"student {s['learned_params']:,} params, {s['file_bytes'] / 1e6:.1f} MB int8, STS-B {s['sts_spearman']:.4f} "
          f"(fp32 {s['sts_spearman_fp32']:.4f}, start {s['sts_spearman_start']:.4f}), p50 16 tok {s['p50_ms_16']:.1f} ms")
    print(f"report.md, report.json, report.png -> {args.out}")
    return 0
