"""A compress report's figures and files: an artifact's cost in a fresh process (:func:`probe`), sizes and
parameters, ``report.md`` and :func:`write_report` (``report.json``, ``report.md``, ``report.png``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sharebert_runtime.outdir import atomic_output, finite, write_json

from .out_folder import REPORT
from .picture import plot_report
from .report_rows import rows, sides

# Timed runs a length of each probe; PROBE_FEWEST where --max-time cannot pay for the end (plan.TimeBudget.cut_probes):
# the timed runs are most of a probe's time (the teacher's 128-token ones above all: its 16-token p50 was 88-94 ms at
# load 10-17), and a median of 10 still stands on 10 timings.
PROBE_RUNS, PROBE_FEWEST = 30, 10


def probe(artifact: Path, runs: int = PROBE_RUNS) -> dict:
    """Peak RSS at load, the time from the process's start to its first answer, and p50 of one sentence at 16 and
    128 tokens (1 thread, ``runs`` timed runs each), in a fresh torch-free process (:mod:`sharebert_runtime.probe`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sharebert_runtime.probe", str(artifact), str(runs), repr(time.time())],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if proc.returncode:
        raise RuntimeError(f"measuring {artifact} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def weight_bytes(folder: Path, suffixes=(".onnx", ".data", ".ort", ".safetensors", ".bin")) -> int:
    """Bytes of a model folder's or artifact's weight and graph files (checkpoints included if present)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and f.suffix in suffixes)


def safetensor_params(folder: Path) -> int:
    """Learned parameters stored in a folder's safetensors files (the model and any Dense module; float tensors)."""
    from math import prod

    from safetensors import safe_open

    n = 0
    for f in sorted(folder.rglob("*.safetensors")):
        if "checkpoint" in str(f.relative_to(folder)):
            continue
        with safe_open(str(f), "np") as st:
            n += sum(
                prod(st.get_slice(k).get_shape())
                for k in st.keys()
                if st.get_slice(k).get_dtype() in ("F32", "F16", "BF16")
            )  # not integer buffers (position ids)
    return n


def _fmt(value, fmt) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.1f} MB" if fmt is None else fmt.format(value)


def report_markdown(r: dict) -> str:
    """The report as a Markdown table, teacher beside student, with the ratio; then the cosine calibration."""
    from sharebert_runtime.cpu import describe

    t, s = sides(r)
    name = t.get("name") or Path(t["folder"]).name
    verdict = (r.get("verdict") or {}).get("lines") or []
    lines = [
        "# Compression report",
        "",
        *[line for v in verdict for line in (v, "")],
        f"teacher {name} (`{t['folder']}`) -> student {s['shape']} (`{s['folder']}`)",
        "",
        *([f"measured on {describe(r['cpu'])}", ""] if r.get("cpu") else []),
        f"| | teacher ({t.get('quantization', 'int8-dynamic')} artifact; quality rows from {quality_source(t)}) "
        "| student (int8 artifact) "
        "| student / teacher |",
        "|---|---|---|---|",
    ]
    for label, key, fmt, _ in rows(r):
        tv, sv = t.get(key), s.get(key)
        ratio = f"{sv / tv:.3f}" if tv and sv is not None else "-"
        lines.append(f"| {label} | {_fmt(tv, fmt)} | {_fmt(sv, fmt)} | {ratio} |")
    calibration = r.get("calibration") or {}
    if calibration:
        lines += ["", "| cosine calibration (mean cosine) | teacher | student | measured on |", "|---|---|---|---|"]
        lines += [
            f"| {kind} pairs | {v['teacher']:.3f} | {v['student']:.3f} | {v['measured_on']} |"
            for kind, v in calibration.items()
        ]
    return "\n".join(lines + ["", r["summary"], ""])


def quality_source(teacher: dict) -> str:
    """Where a report's teacher figures of its quality rows come from (``teacher_pass``: the pass's path; a report
    written before the pass measured them has none: PyTorch fp32)."""
    from ..training.teacher_vectors import PATH_WORDS

    return PATH_WORDS.get(teacher.get("teacher_pass"), PATH_WORDS["torch"])


def web_sentence(entry: dict) -> str:
    """The summary's words on ``--web``'s folder (``out_folder.publish_web``'s entry): where, its size beside the int8
    artifact's."""
    return (
        f" The student's web folder ({entry['folder']}/, {entry['model']} for transformers.js): "
        f"{entry['bytes'] / 1e6:.2f} MB, {entry['bytes'] / entry['artifact_bytes']:.3f}x its int8 artifact."
    )


def write_report(out: Path, report: dict, summary: str) -> dict:
    """``report.json`` (``report`` with ``summary`` and the ``cpu`` its figures came from), ``report.md`` (the table,
    then ``summary``), ``report.png``."""
    from sharebert_runtime.cpu import cpu_info

    report = finite({**report, "cpu": cpu_info(), "summary": summary})
    write_json(out / REPORT, report)
    with atomic_output(out / "report.md") as f:
        f.write(report_markdown(report))
    plot_report(report, out / "report.png")
    return report
