"""``sharebert plot RUN_DIR``: (re)draw a run's training curves."""

from __future__ import annotations

from sharebert_runtime import options as opt


def add_arguments(p):
    p.add_argument(
        "run", type=opt.path, help="a `sharebert pretrain` or `finetune` output folder (log.jsonl / log_history.json)"
    )
    p.add_argument("--out", type=opt.path, help="image to write (default RUN/curves.png)")


def run(args) -> int:
    from pathlib import Path

    from ..accounting.curves import measured_on, plot_curves, read_log, run_metrics

    out = Path(args.out) if args.out else Path(args.run) / "curves.png"
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give an image file name")
    plot_curves(read_log(args.run), out, title=str(args.run), on=measured_on(run_metrics(args.run)))
    print(f"curves -> {out}")
    return 0
