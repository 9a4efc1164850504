"""Footprint of an exported graph: disk, RAM and time, measured in a fresh process.

``measure(path, ...)`` runs this file as a script (no torch; of sharebert only the torch-free ``sharebert_runtime``,
which never imports torch), so the resident memory it reports is ONNX Runtime's alone: ``rss_baseline_mb`` (after
importing onnxruntime), ``peak_rss_load_mb`` (peak while creating the session: generated weights folded to dense
tensors; ``rss_after_load_mb`` is the resident size once it is created) and ``peak_rss_run_mb`` (peak after the timed
runs), the session creation time and p50/p95 latency per shape ``BxT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _peak_rss_mb(field: str = "VmHWM") -> float:
    """Peak (``VmHWM``) or current (``VmRSS``) resident set size of this process, in MiB."""
    from sharebert_runtime.memory import status

    return status(field) / 2**20


def _child(path: str, session_config: dict, shapes: list[str], threads: int, runs: int, vocab: int) -> dict:
    import numpy as np
    import onnxruntime as ort

    from sharebert_runtime.artifact import model_feeds, session_options  # as the runtime builds them

    baseline = _peak_rss_mb()
    so = session_options(session_config, threads)
    t0 = time.perf_counter()
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - t0
    load_rss, steady_rss = _peak_rss_mb(), _peak_rss_mb("VmRSS")
    rng = np.random.default_rng(0)
    latency = {}
    for shape in shapes:
        B, T = (int(x) for x in shape.lower().split("x"))
        low = 1000 if vocab > 2000 else 0  # past BERT's special and unused ids; a character vocabulary: all of it
        feeds = model_feeds(
            session.get_inputs(), rng.integers(low, vocab, size=(B, T), dtype=np.int64), np.ones((B, T), np.int64)
        )
        for _ in range(3):
            session.run(None, feeds)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            session.run(None, feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        latency[shape] = {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95))}
    return {
        "session_create_s": created,
        "rss_baseline_mb": baseline,
        "peak_rss_load_mb": load_rss,
        "rss_after_load_mb": steady_rss,
        "peak_rss_run_mb": _peak_rss_mb(),
        "latency": latency,
        "threads": threads,
        "runs": runs,
    }


def measure(
    path, session_config: dict | None = None, shapes=("1x128",), threads: int = 1, runs: int = 30, vocab: int = 30522
) -> dict:
    """Measure ``path`` (an .onnx file) in a subprocess; see the module docstring for the keys."""
    args = json.dumps(
        {
            "path": str(path),
            "session_config": session_config or {},
            "shapes": list(shapes),
            "threads": threads,
            "runs": runs,
            "vocab": vocab,
        }
    )
    proc = subprocess.run(
        [sys.executable, __file__, args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"footprint measurement of {path} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_child(**json.loads(sys.argv[1]))))
