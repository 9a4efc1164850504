"""What an artifact adds to its process's memory, and its cold start, side by side in one run.

For each artifact (e.g. a ``sharebert compress`` folder's ``artifact/`` (the student) and
``teacher_artifact/``) and each memory setting, a fresh process (torch-free: ``sharebert_runtime``, numpy,
onnxruntime, tokenizers; one thread) reports:

* ``file_mb``: the ONNX files (``model.onnx`` and ``ram_int8/``) + ``tokenizer.json``, and ``bound_mb``,
  the goal: 2x those files + 8 MB (``first_x_bound``, ``load_peak_x_bound``: the figures over it);
* ``imports_mb``: RSS after the imports (the process without the artifact);
* ``load_mb``: RSS added by ``Runtime(...)``; ``first_mb``: added after load and one request (the figure the bound is
  about), ``first_anon_mb`` its anonymous part (RssAnon: memory of the process's own, that no page cache holds; the rest
  is pages of files: libraries' code, ``model.onnx`` mapped); ``load_peak_mb``: peak RSS (VmHWM) above the imports
  during the load; ``peak_mb``: the same at the end (the 128-token requests included); ``after100_mb``: added after 100
  one-sentence requests (no growth: it equals ``first_mb`` within a page or two);
* ``first_answer_s``: process start to the first answer (interpreter start, imports, load, one request), and
  ``p50_16_ms`` / ``p50_128_ms``: one sentence of 16 and 128 tokens.

The floor: ONNX Runtime's plain ``InferenceSession`` on the same ``model.onnx`` (default options, the manifest's
session entries), with the same requests fed as token ids (no tokenizer). Last, ``sharebert predict ARTIFACT
"text"`` as a user runs it: wall time to its answer, its CPU time and peak RSS. On a shared machine run the
whole benchmark under ``nice -n -20`` (the children inherit it) and compare CPU times, not wall times.

    python benchmarks/device_memory.py ART_DIR[=PYTHON] [...] [--teacher DIR] [--settings fp32 int8] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
start = time.perf_counter()
def rss():
    d = {l.split(":")[0]: int(l.split()[1]) / 1024
         for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM", "RssAnon"))}
    return d["VmRSS"], d["VmHWM"], d["RssAnon"]
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
from sharebert_runtime import Runtime
from sharebert_runtime.artifact import model_feeds
imports, _, imports_anon = rss()
art, setting, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = ("the quick brown fox jumps over the lazy dog " * 40).split()
texts = {n: " ".join(words[: n - 2]) for n in (16, 128)}
if setting == "plain-ort":
    manifest = json.load(open(art + "/manifest.json"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for k, v in (manifest.get("session_config") or {}).items():
        so.add_session_config_entry(k, v)
    session = ort.InferenceSession(art + "/model.onnx", so, providers=["CPUExecutionProvider"])
    def run(n):
        ids = np.full((1, n), 1996, np.int64)
        session.run(None, model_feeds(session.get_inputs(), ids, np.ones_like(ids)))
else:
    rt = Runtime(art, threads=1, ram=setting)
    answer = rt.embed if rt.task == "feature-extraction" else rt.fill_mask if rt.task == "fill-mask" else rt.predict
    if rt.task == "fill-mask":
        texts = {n: t.rsplit(" ", 1)[0] + " [MASK]" for n, t in texts.items()}
    def run(n):
        answer([texts[n]])
load, load_peak = rss()[0] - imports, rss()[1] - imports
run(16)
first_answer = time.perf_counter() - start
first, first_anon = rss()[0] - imports, rss()[2] - imports_anon
for _ in range(100):
    run(16)
after100 = rss()[0] - imports
p50 = {}
for n in (16, 128):
    times = []
    for _ in range(runs):
        t = time.perf_counter(); run(n); times.append(time.perf_counter() - t)
    p50[n] = float(np.median(times) * 1000)
print(json.dumps({"imports_mb": imports, "load_mb": load, "first_mb": first, "first_anon_mb": first_anon,
                  "load_peak_mb": load_peak,
                  "peak_mb": rss()[1] - imports,
                  "after100_mb": after100, "first_answer_s": first_answer, "p50_16_ms": p50[16],
                  "p50_128_ms": p50[128]}))
"""
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def file_mb(art: Path) -> float:
    onnx = list(art.glob("*.onnx")) + list((art / "ram_int8").glob("*.onnx")) + list(art.glob("*.ort"))
    return sum(f.stat().st_size for f in [*onnx, art / "tokenizer.json"] if f.is_file()) / 2**20


def measure(art: Path, setting: str, runs: int, python: str) -> dict:
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-c", CHILD, str(art), setting, str(runs)], capture_output=True, text=True, env=ENV, timeout=600
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["spawn_s"] = time.perf_counter() - start
    return row


def predict_cold(art: Path, python: str) -> dict | None:
    """``sharebert predict ART "text"`` as a user runs it (the console script beside ``python``): wall seconds to
    its answer, CPU seconds (user + system) and peak RSS of the process (``wait4``'s rusage of that child)."""
    script = shutil.which("sharebert", path=str(Path(python).parent)) or shutil.which("sharebert")
    if script is None:
        return None
    text = "How do I cook pasta? [MASK]"
    start = time.perf_counter()
    child = subprocess.Popen(
        [script, "predict", str(art), text], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        return None
    return {
        "predict_wall_s": wall,
        "predict_cpu_s": usage.ru_utime + usage.ru_stime,
        "predict_peak_mb": usage.ru_maxrss / 1024,
    }


def ratios(rows: list[dict], teacher: str | None) -> None:
    """Each measured row's first_mb and load_peak_mb over its bound (2x files + 8 MB; at most 1.00 meets the goal) and,
    with a teacher, over the teacher's under the same setting (at most 0.50 meets the goal)."""
    theirs = {r["setting"]: r for r in rows if r["artifact"] == teacher and "first_mb" in r}
    for r in rows:
        if "first_mb" not in r:
            continue
        for key in ("first", "load_peak"):
            r[f"{key}_x_bound"] = r[f"{key}_mb"] / r["bound_mb"]
            base = theirs.get(r["setting"]) or theirs.get("auto")
            r[f"{key}_x_teacher"] = r[f"{key}_mb"] / base[f"{key}_mb"] if base and r["artifact"] != teacher else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "artifacts",
        nargs="+",
        help="artifact folders; PATH=PYTHON measures PATH with that interpreter "
        "(e.g. a venv of the code before a change, beside the one after)",
    )
    p.add_argument(
        "--settings",
        nargs="+",
        default=["auto", "fp32", "int8"],
        help="Runtime ram= settings to measure (plain ONNX Runtime is always measured)",
    )
    p.add_argument("--runs", type=int, default=30, help="timed runs per length for the p50")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument(
        "--teacher",
        type=Path,
        help="the artifact the others are compared with (x_teacher: first_mb and "
        "load_peak_mb over the teacher's under the same setting); measured first",
    )
    a = p.parse_args(argv)
    named = [spec.split("=", 1) if "=" in spec else (spec, sys.executable) for spec in a.artifacts]
    arts = ([(str(a.teacher), sys.executable)] if a.teacher else []) + [x for x in named if x[0] != str(a.teacher)]
    rows = []
    for spec, python in arts:
        art, name = Path(spec), spec if python == sys.executable else f"{spec} ({python})"
        for setting in [*a.settings, "plain-ort"]:
            row = {"artifact": name, "setting": setting, "file_mb": file_mb(art)}
            row["bound_mb"] = 2 * row["file_mb"] + 8
            row.update(measure(art, setting, a.runs, python))
            rows.append(row)
        rows.append({"artifact": name, "setting": "sharebert predict", "predict": predict_cold(art, python)})
    ratios(rows, str(a.teacher) if a.teacher else None)
    cols = (
        "file_mb",
        "bound_mb",
        "imports_mb",
        "load_mb",
        "first_mb",
        "first_anon_mb",
        "load_peak_mb",
        "peak_mb",
        "after100_mb",
        "first_answer_s",
        "p50_16_ms",
        "p50_128_ms",
        "first_x_bound",
        "load_peak_x_bound",
        "first_x_teacher",
        "load_peak_x_teacher",
    )
    print("| artifact | setting | " + " | ".join(cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for r in rows:
        if "predict" in r:
            cold = r["predict"]
            print(
                f"| {r['artifact']} | {r['setting']} | "
                + (
                    f"wall {cold['predict_wall_s']:.2f} s, CPU (user + system) "
                    f"{cold['predict_cpu_s']:.2f} s, peak RSS {cold['predict_peak_mb']:.1f} MB"
                    if cold
                    else "failed"
                )
                + " |"
            )
            continue
        cells = (
            [r.get("error", "")]
            if "error" in r
            else [
                ""
                if r.get(c) is None
                else f"{r[c]:.2f}"
                if c.endswith(("_s", "x_bound", "x_teacher"))
                else f"{r[c]:.1f}"
                for c in cols
            ]
        )
        print(f"| {r['artifact']} | {r['setting']} | " + " | ".join(cells) + " |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
