"""``sharebert prepare``: tokenize pre-training corpora once into memory-mapped token shards."""

from __future__ import annotations

import os
import signal
import sys

from sharebert_runtime import options as opt


def add_arguments(p):
    p.add_argument(
        "--train",
        type=opt.path,
        nargs="+",
        required=True,
        metavar="SOURCE",
        help="text files (.bz2/.gz too), MediaWiki XML dumps, folders or hf:NAME[:CONFIG][:SPLIT]",
    )
    p.add_argument("--valid", type=opt.path, nargs="+", metavar="SOURCE", help="validation corpora (a separate split)")
    p.add_argument(
        "--tokenizer",
        type=opt.path,
        default="sharebert-tiny",
        help="a model folder (its tokenizer) or a preset name (the default WordPiece vocabulary)",
    )
    p.add_argument(
        "--out",
        type=opt.path,
        required=True,
        help="the data folder to write (resumed when it holds an unfinished prepare)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=max(1, len(os.sched_getaffinity(0))),
        help="tokenizing processes (default: the usable cores)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    import time

    from sharebert_runtime.textlines import resolve_sources

    for sources in (args.train, args.valid):  # a bad source is refused before the training modules load torch
        if sources:
            resolve_sources(sources)
    from ..training.shards import Interrupted, prepare

    received: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    started = time.perf_counter()
    try:
        m = prepare(
            args.train,
            args.out,
            args.tokenizer,
            args.valid,
            args.workers,
            not args.no_progress,
            stop=lambda: received[0] if received else None,
        )
    except Interrupted as e:
        print(f"sharebert prepare: {signal.Signals(e.signum).name}: {e}", file=sys.stderr)
        return 128 + e.signum
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    seconds = time.perf_counter() - started
    size = sum(s["bytes"] or 0 for srcs in m["sources"].values() for s in srcs)
    splits = ", ".join(f"{k} {v['tokens']:,} tokens in {len(v['shards'])} shards" for k, v in m["splits"].items())
    print(
        f"prepared {args.out}: {splits} ({m['dtype']}); {size / 1e6:.1f} MB of sources in {seconds:.1f} s "
        f"({size / 1e6 / max(seconds, 1e-9):.2f} MB/s)"
    )
    return 0
