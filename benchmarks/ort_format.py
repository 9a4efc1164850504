"""ORT-format artifact vs ONNX artifact of the same model: files, load time, p50 latency (1 thread).

    OMP_NUM_THREADS=1 python benchmarks/ort_format.py --onnx runs/ort/tiny-onnx --ort runs/ort/tiny-ort

Both are opened with ``sharebert_runtime.Runtime`` (threads=1) and timed on the same random token ids, the
two sessions alternating run by run so that a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sharebert_runtime import Runtime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--onnx", required=True)
    p.add_argument("--ort", required=True)
    p.add_argument("--shapes", nargs="+", default=["1x128", "1x16"])
    p.add_argument("--runs", type=int, default=200)
    args = p.parse_args()
    runtimes, report = {}, {}
    for kind in ("onnx", "ort"):
        t0 = time.perf_counter()
        runtimes[kind] = Runtime(getattr(args, kind), threads=1)
        manifest = runtimes[kind].manifest
        files = manifest["files"]
        model = [n for n in files if n.endswith((".onnx", ".ort", ".part")) and not n.startswith("ram_int8")]
        report[kind] = {
            "load_s": round(time.perf_counter() - t0, 3),
            "model_files": model,
            "model_bytes": sum(files[n]["bytes"] for n in model),
            "learned_bytes": 4 * manifest["learned_params"],
        }
        report[kind]["x_learned"] = round(report[kind]["model_bytes"] / report[kind]["learned_bytes"], 4)
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        B, T = (int(x) for x in shape.split("x"))
        ids = rng.integers(1000, 30000, (B, T)).astype(np.int64)
        mask = np.ones_like(ids)
        times = {k: [] for k in runtimes}
        for _ in range(5):
            for rt in runtimes.values():
                rt._run(ids, mask)
        for _ in range(args.runs):
            for kind, rt in runtimes.items():
                t0 = time.perf_counter()
                rt._run(ids, mask)
                times[kind].append((time.perf_counter() - t0) * 1e3)
        for kind in runtimes:
            report[kind][f"p50_ms_{shape}"] = round(float(np.percentile(times[kind], 50)), 3)
    a, b = (runtimes[k]._run(ids, mask)[runtimes[k].output_names[0]] for k in ("onnx", "ort"))
    report["max_abs_diff"] = float(np.max(np.abs(a - b)))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
