"""The one look of every picture the toolkit writes (compress's ``report.png``, ``budget --plot``, ``curves.png``,
``evaluate glue --depths --plot``): 1,200 pixels wide, fonts read at that width without zooming, white ground,
light grid, no top or right frame, one colour per role. Torch-free; matplotlib (the ``plot`` extra) is imported
only when a picture is drawn."""

from __future__ import annotations

import io
import textwrap
from contextlib import contextmanager
from pathlib import Path

from sharebert_runtime.outdir import atomic_output, save_figure

WIDTH_IN, DPI = 12.0, 100  # 12 inches at 100 dots each: the 1,200 pixels a picture is read at, drawn 1:1
TEACHER, STUDENT, SECOND, THIRD = "tab:gray", "tab:blue", "tab:orange", "tab:green"  # one colour per role
STYLE = {
    "font.size": 11,  # 11 pt at 100 dpi: 15 pixels, the size of a web page's body text
    "axes.titlesize": 12,
    "axes.titlelocation": "left",
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 14,
    "figure.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
}


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed); ``ValueError`` naming the extra without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("drawing a picture needs matplotlib: pip install 'sharebert[plot]'") from None
    return plt


@contextmanager
def figure(height: float, nrows: int = 1, ncols: int = 1, layout: str | None = "constrained", **subplots):
    """``(fig, axes)`` (``axes`` always 2-D) in the house style, ``WIDTH_IN`` wide and ``height`` inches high;
    the style holds until the block ends (draw and :func:`save` inside it), then the figure is closed. The caller's
    own matplotlib settings are left as they were."""
    plt = pyplot()
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH_IN, height), layout=layout, squeeze=False, **subplots)
        try:
            yield fig, axes
        finally:
            plt.close(fig)


HEADLINE_WIDTH = 95  # characters of 14-pt bold that fit across 1,200 pixels


def headline(fig, text: str, x: float = 0.01) -> None:
    """The picture's bold headline, flush left like the panels' titles (a reader starts at the left edge), wrapped
    where it would run past the right edge."""
    fig.suptitle(wrap(text, HEADLINE_WIDTH), x=x, ha="left")


def save(fig, path: str | Path) -> Path:
    """The figure into ``path`` at ``DPI`` (1,200 pixels wide), written atomically (``outdir``). A PNG is stored
    with a palette of 256 colours: flat fills, lines and text on white lose nothing to the eye, and the file is
    about 0.4x matplotlib's RGBA one (a report of 190 KB takes 74 KB). Other formats (pdf, svg) as matplotlib
    writes them."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        return save_figure(fig, path, dpi=DPI)
    from PIL import Image  # matplotlib's own dependency: there whenever matplotlib is

    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=DPI)
    with Image.open(drawn) as image:
        small = image.convert("RGB").quantize(colors=256, method=0, dither=0)  # median cut, no dithering noise
    with atomic_output(path, "wb") as f:
        small.save(f, format="PNG", optimize=True)
    return path


def wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (a long label never runs into its neighbour)."""
    return "\n".join(textwrap.wrap(text, width) or [text])
