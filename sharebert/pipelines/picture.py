"""A compress report's picture, ``report.png`` (:func:`plot_report`): the report's rows as bars, teacher beside
student."""

from __future__ import annotations

from pathlib import Path

from sharebert_runtime.outdir import save_figure

from .report_rows import rows, sides


def plot_report(r: dict, path: Path) -> None:
    """One bar pair per measure (teacher, student), each panel on its own scale with its unit and the values on
    the bars; quality panels zoomed on the two values, so the gap shows; titled with the teacher's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, s = sides(r)
    shown = [row for row in rows(r) if t.get(row[1]) is not None and s.get(row[1]) is not None]
    fig, axes = plt.subplots(1, len(shown), figsize=(2.9 * len(shown), 3.6), squeeze=False)
    for ax, (label, key, _fmt, unit) in zip(axes[0], shown):
        scale = 1e6 if unit in ("MB", "count") and max(t[key], s[key]) >= 1e6 else 1.0
        values = [t[key] / scale, s[key] / scale]
        bars = ax.bar(["teacher", "student"], values, color=["tab:gray", "tab:blue"])
        text = [f"{v:.1f}" if unit == "MB" else f"{v:.2f}" if unit in ("ms", "count") else f"{v:.3f}" for v in values]
        ax.bar_label(bars, labels=text, fontsize=8)
        ax.set_ylabel(
            {"MB": "MB", "ms": "milliseconds", "count": "millions" if scale > 1 else "count"}.get(unit, "score"),
            fontsize=8,
        )
        if not unit:  # a quality measure: the axis spans the two values, so a gap of 0.05 is seen
            low, high = min(values), max(values)
            pad = max(0.02, (high - low) * 0.6)
            ax.set_ylim(max(-1.0, low - pad), min(1.0, high + pad) + pad / 2)
        else:
            ax.set_ylim(0, max(values) * 1.18)
        ax.set_title("\n".join(_wrap(label, 30)), fontsize=8)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{t.get('name') or Path(t['folder']).name} -> ShareBERT {s['shape']}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [text]
