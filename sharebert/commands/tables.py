"""Plain-text tables for the commands' output."""

from __future__ import annotations


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain-text table; floats print with 4 decimals, None as ``-``."""

    def cell(v):
        return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)

    body = [[cell(v) for v in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in body]
    return "\n".join(lines)
