"""Training curves: train and validation loss and the learning rate by step, drawn from a run's log.

A run folder holds the Trainer's log events: ``log.jsonl`` (``sharebert pretrain``, one JSON object a
line) or ``log_history.json`` (``sharebert finetune``, one list). Each event has ``step`` and some of
``loss``, ``eval_loss``, ``learning_rate``. ``sharebert plot RUN_DIR`` redraws ``curves.png``.
"""

from __future__ import annotations

import math
from pathlib import Path

from sharebert_runtime.outdir import read_json
from sharebert_runtime.untrusted import RESULT_JSON_BYTES, parse_json, read_bytes

from .picture import SECOND, THIRD, figure, headline, save, wrap

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
        events = [
            parse_json(line, f"{path} line {n}", allow_nan=True)  # a diverged run logs NaN losses
            for n, line in enumerate(read_bytes(path, "the run's log", RESULT_JSON_BYTES).splitlines(), 1)
            if line.strip()
        ]
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{path}: expected log events (JSON objects with a step)")
    return [e for e in events if isinstance(e.get("step"), (int, float))]


def _series(events: list[dict], key: str) -> tuple[list, list]:
    pts = [(e["step"], e[key]) for e in events if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _line(ax, xy, label, **kw):
    """A line with markers when it has few points (a 20-step run logs a handful: a bare line would not show)."""
    if xy[0]:
        ax.plot(*xy, marker="o" if len(xy[0]) <= 50 else None, ms=5, lw=1.8, label=label, **kw)


def measured_on(metrics: dict | None) -> str:
    """What a run's losses were measured on, from its metrics (``metrics.json``): the task, the training examples
    (or sequences) and the validation ones; ``""`` when the metrics do not say."""
    m = metrics if isinstance(metrics, dict) else {}
    tokens = f" of {m['seq_len']} tokens" if _count(m, "seq_len") else ""
    parts = [
        f"{n:,} {what}"
        for n, what in (
            (_count(m, "train_samples"), "training examples"),
            (_count(m, "train_sequences"), f"training sequences{tokens}"),
        )
        if n
    ] + [
        f"validation on {n:,} {what}"
        for n, what in (
            (_count(m, "eval_samples"), "dev examples"),
            (_count(m, "valid_sequences"), "held-out sequences"),
        )
        if n
    ]
    task = m.get("task") if isinstance(m.get("task"), str) else ""
    said = ", ".join(parts)
    return f"{task}: {said}" if task and said else task or said


def _count(m: dict, key: str) -> int | None:
    value = m.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_metrics(run_dir: str | Path) -> dict:
    """A run folder's ``metrics.json`` ({} where it is missing or unreadable: only a picture's title needs it)."""
    try:
        metrics = read_json(Path(run_dir) / "metrics.json")
    except (OSError, ValueError):
        return {}
    return metrics if isinstance(metrics, dict) else {}


def plot_curves(events: list[dict], path: str | Path, title: str = "", on: str = "") -> Path:
    """Loss (train, validation) and learning rate by step into ``path`` (PNG); ``ValueError`` if nothing to draw.

    One panel compares train and validation values of the SAME loss. A distillation run (its events hold the
    terms, ``loss_hard``, ``loss_kl``, ...) logs as ``loss`` the weighted sum of its terms, which is not the
    validation loss: there the first panel shows the gold-label term (``loss_hard``, last batch of each
    logging step) against the validation loss, and the summed objective gets a panel of its own. ``on``: what the
    losses were measured on (:func:`measured_on`), in the loss panel's title.
    """
    distill = any(k.startswith("loss_") for e in events for k in e)
    train = _series(events, "loss_hard" if distill else "loss")
    valid, lr, objective = _series(events, "eval_loss"), _series(events, "learning_rate"), _series(events, "loss")
    if not (train[0] or valid[0] or objective[0]):
        raise ValueError("the log holds no loss yet: nothing to draw")
    rows = [("loss", 3)] + ([("objective", 2)] if distill else []) + [("lr", 1.4)]
    heights = [h for _, h in rows]
    with figure(1.6 + 1.3 * sum(heights), nrows=len(rows), sharex=True, height_ratios=heights) as (fig, axes):
        panels = dict(zip((name for name, _ in rows), axes[:, 0]))
        _loss_panel(panels["loss"], train, valid, distill, on)
        if distill:
            _line(panels["objective"], objective, None, color="tab:purple")
            panels["objective"].set_title("Train: distillation objective (weighted sum of its terms)")
            panels["objective"].set_ylabel("objective")
        _line(panels["lr"], lr, None, color=THIRD)
        if not lr[0]:
            _note(panels["lr"], "not logged (the run was shorter than its logging interval)", 0.5)
        panels["lr"].set_title("Learning rate (per optimizer step)")
        panels["lr"].set_ylabel("learning rate")
        panels["lr"].set_xlabel("optimizer step")
        from matplotlib.ticker import MaxNLocator  # matplotlib is there: figure imported it

        panels["lr"].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        headline(fig, f"Training curves: {title}" if title else "Training curves")
        return save(fig, path)


def _loss_panel(ax, train, valid, distill: bool, on: str) -> None:
    """Train and validation values of the same loss, the legend outside the lines' way."""
    _line(ax, train, "train: gold-label term (last batch of each logging step)" if distill else "train loss")
    _line(ax, valid, "validation loss (the run's held-out set)", color=SECOND)
    ax.set_title(wrap("Loss by optimizer step (lower is better)" + (f", on {on}" if on else ""), 110))  # 12-pt
    ax.set_ylabel("loss")
    if not (train[0] or valid[0]):
        _note(ax, "no train or validation loss logged", 0.5)
        return
    if not train[0]:
        _note(ax, "train loss not logged (the run was shorter than its logging interval)", 0.9)
    ax.legend(loc="best", frameon=False)  # where it covers the fewest points


def _note(ax, text: str, y: float) -> None:
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", color="0.35")


def write_curves(run_dir: str | Path, metrics: dict | None = None) -> Path | None:
    """``run_dir/curves.png`` from its log at the end of a run (``metrics``: the run's, saying what it was measured
    on); None (with nothing written) when matplotlib is missing or the log has no loss, since a run must not fail
    over its picture."""
    try:
        path = Path(run_dir) / "curves.png"
        return plot_curves(read_log(run_dir), path, title=str(run_dir), on=measured_on(metrics))
    except (OSError, ValueError):
        return None
