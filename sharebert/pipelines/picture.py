"""A compress report's picture, ``report.png`` (:func:`plot_report`), read at 1,200 pixels wide: what the student
costs as a fraction of its teacher (size, memory, speed: one bar each, the two values beside it), then the quality
measures with teacher and student side by side on one score axis, then the cosine calibration; each panel titled
with its unit and what it was measured on, the verdict under the title."""

from __future__ import annotations

from pathlib import Path

from ..accounting.picture import HEADLINE_WIDTH, STUDENT, STYLE, TEACHER, figure, pyplot, save, wrap
from .report_rows import ROWS, rows, sides

LABEL_WIDTH = 44  # characters a row's label wraps at: the labels take the left third of the picture
VERDICT_WIDTH, TITLE_WIDTH = 130, 85  # characters that fit: 11-pt text the full width, 12-pt right of the labels


def plot_report(r: dict, path: Path) -> Path | None:
    """``report.png``: the cost panel (student / teacher), the quality panel and, where the report has it, the
    cosine calibration panel, stacked, so each row's label reads at full width beside its bars. None, with nothing
    written, without matplotlib (the ``plot`` extra) or a figure measured on both sides: a run that trained for
    minutes must not fail over its picture (``report.md`` holds the same figures)."""
    try:
        pyplot()
    except ValueError:
        return None
    t, s = sides(r)
    cost = [row for row in ROWS if _known(t, row[1]) and _known(s, row[1]) and t[row[1]] > 0]
    quality = [row for row in rows(r)[len(ROWS) :] if _known(t, row[1]) and _known(s, row[1])]
    calibration = r.get("calibration") or {}
    panels = [
        (n, h)
        for n, h in (("cost", len(cost)), ("quality", 2 * len(quality)), ("calibration", 2 * len(calibration)))
        if h
    ]
    if not panels:
        return None
    heights = [1.1 + 0.3 * h for _, h in panels]
    with figure(1.3 + sum(heights), nrows=len(panels), height_ratios=heights) as (fig, axes):
        draw = {
            "cost": lambda ax: _cost(ax, t, s, cost, r.get("cpu")),
            "quality": lambda ax: _quality(ax, t, s, quality),
            "calibration": lambda ax: _calibration(ax, calibration),
        }
        for (name, _), ax in zip(panels, axes[:, 0]):
            draw[name](ax)
        _header(fig, r, t, s)
        return save(fig, path)


def _header(fig, r: dict, t: dict, s: dict) -> None:
    """The teacher's name and the student's shape in bold, the verdict's first sentence under them; the panels
    are laid out below the room they take."""
    shape = s["shape"] if str(s["shape"]).startswith("ShareBERT") else f"ShareBERT {s['shape']}"
    title = wrap(f"{t.get('name') or Path(t['folder']).name} -> {shape}", HEADLINE_WIDTH)
    verdict = wrap(((r.get("verdict") or {}).get("lines") or [""])[0], VERDICT_WIDTH)
    height = fig.get_figheight()
    below = 0.45 + 0.3 * title.count("\n")  # inches from the top to the verdict
    room = (below + 0.22 * (verdict.count("\n") + 1 if verdict else 0)) / height  # the header, as a fraction
    fig.get_layout_engine().set(rect=(0, 0, 1, 1 - room))
    fig.text(
        0.01,
        1 - 0.12 / height,
        title,
        va="top",
        fontsize=STYLE["figure.titlesize"],  # as every picture's headline (picture.headline)
        fontweight=STYLE["figure.titleweight"],
    )
    if verdict:
        fig.text(0.01, 1 - below / height, verdict, va="top")


def _known(side: dict, key: str) -> bool:
    return isinstance(side.get(key), (int, float)) and not isinstance(side.get(key), bool)


def _value(v: float, unit: str) -> str:
    if unit == "count":
        return f"{v / 1e6:.2f} M"
    if unit == "MB":
        return f"{v / 1e6:.1f} MB"
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms"


def _cost(ax, t: dict, s: dict, cost: list, cpu: dict | None) -> None:
    """One bar per cost measure: the student's value over the teacher's (1 = the teacher's), both values beside it."""
    ratios = [s[key] / t[key] for _, key, _, _ in cost]
    y = range(len(cost))
    ax.barh(y, ratios, color=STUDENT, height=0.6)
    for i, (_, key, _, unit) in enumerate(cost):
        ax.text(ratios[i], i, f"  {ratios[i]:.3f}x   ({_value(s[key], unit)} vs {_value(t[key], unit)})", va="center")
    ax.axvline(1.0, color=TEACHER, ls="--", lw=1.5)
    ax.text(1.0, -0.9, " teacher = 1", color=TEACHER, va="center")
    ax.set_xlim(0, max(1.0, max(ratios)) * 1.6)
    ax.set_yticks(list(y), [wrap(label, LABEL_WIDTH) for label, *_ in cost])
    ax.set_ylim(len(cost) - 0.5, -1.3)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("student / teacher (lower is cheaper)")
    ax.set_title(wrap(f"Cost: student / teacher, both int8 artifacts in ONNX Runtime, on {_machine(cpu)}", TITLE_WIDTH))


def _machine(cpu: dict | None) -> str:
    """The CPU in a few words: model, architecture, its int8 instruction sets, the ONNX Runtime version."""
    if not isinstance(cpu, dict):
        return "a CPU not recorded"
    int8 = ", ".join(cpu.get("int8_features") or []) or "none"
    head = " ".join(str(cpu[k]) for k in ("model", "machine") if cpu.get(k)) or "a CPU"
    return f"{head} (int8 instructions: {int8}; onnxruntime {cpu.get('onnxruntime', 'unknown')})"


def _pairs(ax, labels: list[str], teacher: list[float], student: list[float], fmt: str) -> None:
    """Teacher and student bars side by side for each label, each bar's value at its end, on one score axis."""
    for i, (tv, sv) in enumerate(zip(teacher, student)):
        for dy, v, color, who in ((-0.2, tv, TEACHER, "teacher"), (0.2, sv, STUDENT, "student")):
            ax.barh(i + dy, v, height=0.38, color=color, label=who if i == 0 else None)
            ax.text(max(v, 0), i + dy, f" {v:{fmt}}", va="center")
    low = min(0.0, *teacher, *student)
    ax.set_xlim(low, max(1.0, *teacher, *student) * 1.45)  # the right quarter: the values' text and the key
    ax.set_xticks([x for x in ax.get_xticks() if low - 1e-9 <= x <= 1 + 1e-9])  # a score ends at 1: no ticks past
    ax.set_yticks(range(len(labels)), [wrap(label, LABEL_WIDTH) for label in labels])
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper right", frameon=False)


def _quality(ax, t: dict, s: dict, quality: list) -> None:
    _pairs(ax, [label for label, *_ in quality], [t[k] for _, k, *_ in quality], [s[k] for _, k, *_ in quality], ".3f")
    agreement = any("agreement" in key for _, key, *_ in quality)
    ax.set_xlabel(
        "score (higher is better" + ("; 1 = the teacher's own answers for the agreement rows)" if agreement else ")")
    )
    ax.set_title("Quality: teacher in PyTorch fp32, student as its int8 artifact; each row names its data")


def _calibration(ax, calibration: dict) -> None:
    labels = [f"{kind} pairs: {v['measured_on']}" for kind, v in calibration.items()]
    _pairs(
        ax, labels, [v["teacher"] for v in calibration.values()], [v["student"] for v in calibration.values()], ".2f"
    )
    ax.set_xlabel("mean cosine between the two sentences of a pair")
    ax.set_title("Cosine calibration: a similarity threshold tuned on the teacher's cosines moves with these means")
