"""Does ``sharebert compress --max-time T`` hold its budget, on a first run and a cached one? The whole command's wall
time against T + 10% (the budget a user gives is the one they wait), in a fresh process each (its own imports
counted): ``first`` with an empty ``SHAREBERT_CACHE`` (the teacher's export inside T, or the budget refused before it),
then ``cached`` with the cache the first run filled. Each line of the command is printed with the second it came at;
then per run the plan lines (with the end's measures and probes where --max-time cut them), the report's quality labels
(what each measure ran on), the exit, the wall time and its ratio to T, the steps, and the machine's load. Exits 1
when a run that was not refused went over T * 1.1. A benchmark, not a test: timings depend on the machine and its load.

    python benchmarks/compress_budget.py --teacher DIR --max-time 300 [--runs first cached] [--out runs/budget] \
        [-- more compress options]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT = 1.1
SAID = (
    "plan for",
    "the teacher's artifact is not cached",
    "--resume:",
    "threads",
    "the teacher's ",
    "measuring memory",
)
SIZED = "s of --max-time are left: "  # the end's measures cut to what is left (plan.TimeBudget.measure_rows_now)


def one_run(teacher: str, out: Path, max_time: float, cache: Path, rest: list[str]) -> dict:
    """One ``compress`` in a fresh process with ``SHAREBERT_CACHE=cache``: its exit, wall seconds, lines and report."""
    if (out / "sharebert_run.json").is_file():  # our own earlier run: start afresh
        shutil.rmtree(out)
    load = os.getloadavg()[0]
    start = time.monotonic()
    err = tempfile.TemporaryFile("w+")  # a file, not a pipe: its progress bars never fill a pipe nobody reads
    argv = [sys.executable, "-m", "sharebert", "compress", teacher, "--out", str(out), "--max-time", f"{max_time:g}"]
    proc = subprocess.Popen(
        [*argv, *rest], stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, "SHAREBERT_CACHE": str(cache)}
    )
    lines = []
    for line in proc.stdout:  # each line of the command with the second it came at: where the time went
        lines.append(line.rstrip("\n"))
        if not line.startswith(("  ", "|")):
            print(f"{time.monotonic() - start:6.0f} s  {line.rstrip()}", flush=True)
    proc.wait()
    wall = time.monotonic() - start
    err.seek(0)
    report = out / "report.json"
    r = json.loads(report.read_text()) if proc.returncode == 0 and report.is_file() else None
    return {
        "exit": proc.returncode,
        "wall": wall,
        "ratio": wall / max_time,
        "steps": r["training"]["steps"] if r else None,
        "measured": [q["label"] for q in r["quality"]] if r else [],  # each says what it was measured on
        "said": [line for line in lines if line.startswith(SAID) or SIZED in line],
        "error": (err.read().strip().splitlines() or [""])[-1],
        "load": f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--max-time", type=float, default=300.0)
    ap.add_argument("--runs", nargs="+", choices=("first", "cached"), default=["first", "cached"])
    ap.add_argument("--out", default="runs/compress-budget", help="replaced at each run (a compress result only)")
    ap.add_argument("rest", nargs="*", help="more `sharebert compress` options, after --")
    a = ap.parse_args()
    over = False
    with tempfile.TemporaryDirectory() as cache:
        for kind in a.runs:
            print(f"=== {kind} run (SHAREBERT_CACHE {'empty' if kind == 'first' else 'as the first run left it'})")
            r = one_run(a.teacher, Path(a.out), a.max_time, Path(cache), a.rest)
            for line in r["said"]:
                print(f"  {line}")
            for label in r["measured"]:
                print(f"  measured: {label}")
            refused = r["exit"] == 2
            print(
                f"{kind}: exit {r['exit']}{' (refused)' if refused else ''}; wall {r['wall']:.0f} s for --max-time "
                f"{a.max_time:g} s: {r['ratio']:.2f}x (limit {LIMIT:.2f}x); steps {r['steps']}; load {r['load']}"
            )
            if r["exit"]:
                print(f"  {r['error']}")
            over |= not refused and (r["exit"] != 0 or r["ratio"] > LIMIT)
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
