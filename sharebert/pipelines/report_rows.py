"""A compress report's rows, teacher beside student (:func:`rows`): what ``report.md`` (``report``) and ``report.png``
(``picture``) show."""

from __future__ import annotations

ROWS = (
    ("learned parameters", "learned_params", "{:,}", "count"),
    ("file bytes (int8 artifact)", "file_bytes", None, "MB"),
    ("peak RSS at load (1 thread, fresh process)", "peak_rss_bytes", None, "MB"),
    ("RAM the artifact adds (load + 1 request)", "added_rss_bytes", None, "MB"),
    ("p50, 16 tokens, 1 thread", "p50_ms_16", "{:.2f} ms", "ms"),
    ("p50, 128 tokens, 1 thread", "p50_ms_128", "{:.2f} ms", "ms"),
    ("time to first answer (fresh process: start, imports, load, 1 request)", "first_answer_ms", "{:.0f} ms", "ms"),
)  # then the report's quality rows


def rows(r: dict) -> tuple:
    """The report's rows ``(label, key, format, unit)``: size, memory and speed, then its quality measures, each
    label saying what it was measured on. ``quality`` is a list (or, in a report of the first layout, one dict)."""
    quality = r["quality"] if isinstance(r["quality"], list) else [r["quality"]]
    return ROWS + tuple((q["label"], q["key"], "{:.4f}", "") for q in quality)


def sides(r: dict) -> tuple[dict, dict]:
    t, s = dict(r["teacher"]), dict(r["student"])
    t["file_bytes"] = t["artifact_bytes"]  # size, memory and speed: both as int8 artifacts
    return t, s
