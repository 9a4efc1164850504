"""Training curves: train and validation loss and the learning rate by step, drawn from a run's log.

A run folder holds the Trainer's log events: ``log.jsonl`` (``sharebert pretrain``, one JSON object a
line) or ``log_history.json`` (``sharebert finetune``, one list). Each event has ``step`` and some of
``loss``, ``eval_loss``, ``learning_rate``. ``sharebert plot RUN_DIR`` redraws ``curves.png``.
"""
from __future__ import annotations

import math
from pathlib import Path

from .outdir import parse_json, read_json

LOGS = ("log.jsonl", "log_history.json")


def read_log(run_dir: str | Path) -> list[dict]:
    """The log events of ``run_dir`` in order; ``FileNotFoundError`` / ``ValueError`` naming the file."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder not found: {run_dir}")
    path = next((run_dir / name for name in LOGS if (run_dir / name).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"{run_dir} holds no {' or '.join(LOGS)}: not a pretrain or finetune output folder")
    if path.suffix == ".json":
        events = read_json(path)
    else:
        events = [parse_json(line, f"{path} line {n}") for n, line in enumerate(path.read_bytes().splitlines(), 1)
                  if line.strip()]
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{path}: expected log events (JSON objects with a step)")
    return [e for e in events if isinstance(e.get("step"), (int, float))]


def _series(events: list[dict], key: str) -> tuple[list, list]:
    pts = [(e["step"], e[key]) for e in events if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(events: list[dict], path: str | Path, title: str = "") -> Path:
    """Loss (train, validation) and learning rate by step into ``path`` (PNG); ``ValueError`` if nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("drawing curves needs matplotlib: pip install 'sharebert[plot]'") from None
    train, valid, lr = _series(events, "loss"), _series(events, "eval_loss"), _series(events, "learning_rate")
    if not (train[0] or valid[0]):
        raise ValueError("the log holds no loss yet: nothing to draw")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1))
    top.plot(*train, lw=1.2, label="train loss")
    if valid[0]:
        top.plot(*valid, "o-", ms=4, lw=1.2, label="validation loss")
    top.set_ylabel("loss")
    top.grid(alpha=0.3)
    top.legend()
    top.set_title(title, fontsize=9)
    bottom.plot(*lr, color="tab:green", lw=1.2)
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("optimizer step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_curves(run_dir: str | Path) -> Path | None:
    """``run_dir/curves.png`` from its log at the end of a run; None (with nothing written) when matplotlib
    is missing or the log has no loss, since a run must not fail over its picture."""
    try:
        return plot_curves(read_log(run_dir), Path(run_dir) / "curves.png", title=str(run_dir))
    except (OSError, ValueError):
        return None
