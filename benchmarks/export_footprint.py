"""Export footprint, side by side in one run: compact vs materialized vs int8 vs fp16 (and
int8-dynamic) exports of one ShareBERT model, a dense transformers BERT of the same shape exported
plainly by ``torch.onnx`` (``sharebert.export.torch_onnx.export_folder``: the graph optimum's ``main_export``
writes, no optimum needed), and PyTorch eager. Prints the export's goals as measured ratios.

    python benchmarks/export_footprint.py                          # sharebert-small, random weights
    python benchmarks/export_footprint.py --model runs/pretrain    # a trained MLM (agreement figures mean something)

Random weights make top-1 agreement meaningless; pass a model trained with ``sharebert pretrain``.
``--dense-layers`` shrinks the dense BERT (default: as many layers as the ShareBERT model, which for
sharebert-small is a ~470M-parameter, 1.9 GB file).
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

VARIANTS = (
    ("compact", "none"),
    ("materialized", "none"),
    ("compact", "int8"),
    ("compact", "fp16"),
    ("compact", "int8-dynamic"),
)


def torch_eager_p50(model_dir: Path, runs: int, seq: int = 128) -> float:
    import torch
    from transformers import AutoModelForMaskedLM

    torch.set_num_threads(1)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    ids = torch.randint(1000, model.config.vocab_size, (1, seq))
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    times = []
    with torch.inference_mode():
        for i in range(runs + 3):
            t0 = time.perf_counter()
            model(**feeds)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def dense_bert(model_dir: Path, work: Path, layers: int | None, runs: int) -> dict:
    """A transformers BertForMaskedLM shaped like the ShareBERT model, exported plainly by ``torch.onnx``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from sharebert import ShareBertConfig
    from sharebert.export.footprint import measure
    from sharebert.export.torch_onnx import export_folder

    c = ShareBertConfig.from_pretrained(model_dir)
    config = BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=layers or c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
    )
    torch.manual_seed(0)
    src, out = work / "dense-src", work / "dense-onnx"
    model = BertForMaskedLM(config)
    learned = model.num_parameters()
    model.save_pretrained(src)
    del model
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(src)
    export_folder(src, out, "fill-mask")
    file_bytes = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    return {
        "learned_params": learned,
        "file_bytes": file_bytes,
        "layers": config.num_hidden_layers,
        **measure(out / "model.onnx", {}, ("1x128",), 1, runs, c.vocab_size),
    }


def main() -> None:
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="trained MLM folder (default: a fresh sharebert-small)")
    ap.add_argument("--preset", default="sharebert-small")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per variant (1 thread)")
    ap.add_argument("--check-limit", type=int, help="parity sentences (default: all of SST-2 dev)")
    ap.add_argument("--dense-layers", type=int, help="layers of the dense BERT (default: same as the model)")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--work", help="folder for the artifacts (default: a temporary folder)")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="export-footprint-"))
    model_dir = Path(args.model) if args.model else work / "model"
    if not args.model:
        build_model(args.preset, model_dir)
    results = {}
    for weights, quantize in VARIANTS:
        name = f"{weights}/{quantize}"
        t0 = time.perf_counter()
        results[name] = export_model(
            model_dir,
            work / name.replace("/", "-"),
            weights=weights,
            quantize=quantize,
            overwrite=True,
            check_limit=args.check_limit,
            runs=args.runs,
        )
        print(f"exported {name} in {time.perf_counter() - t0:.0f} s")
    eager = torch_eager_p50(model_dir, args.runs)
    dense = None if args.skip_dense else dense_bert(model_dir, work, args.dense_layers, args.runs)

    print(
        f"\n{'variant':26s} {'file MB':>9s} {'B/param':>8s} {'folded':>6s} {'create s':>8s} {'RSS load':>8s} "
        f"{'RSS run':>8s} {'p50 ms':>8s} {'p95 ms':>8s} {'top-1':>6s} {'max diff':>9s}"
    )
    for name, m in results.items():
        f, p = m["footprint"], m["parity"]
        lat = f["latency"]["1x128"]
        print(
            f"{name:26s} {f['file_bytes'] / 1e6:9.2f} {f['bytes_per_learned_param']:8.3f} {str(f['folded']):>6s} "
            f"{f['session_create_s']:8.2f} {f['peak_rss_load_mb']:8.0f} {f['peak_rss_run_mb']:8.0f} "
            f"{lat['p50_ms']:8.1f} {lat['p95_ms']:8.1f} {p.get('top1_agreement', float('nan')):6.3f} "
            f"{p['max_abs_diff']:9.2e}"
        )
    if dense:
        lat = dense["latency"]["1x128"]
        print(
            f"{'dense BERT (torch.onnx)':26s} {dense['file_bytes'] / 1e6:9.2f} "
            f"{dense['file_bytes'] / dense['learned_params']:8.3f} {'-':>6s} {dense['session_create_s']:8.2f} "
            f"{dense['peak_rss_load_mb']:8.0f} {dense['peak_rss_run_mb']:8.0f} {lat['p50_ms']:8.1f} "
            f"{lat['p95_ms']:8.1f}   ({dense['layers']} layers, {dense['learned_params']:,} params)"
        )
    print(f"{'PyTorch eager':26s} {'':>9s} {'':>8s} {'':>6s} {'':>8s} {'':>8s} {'':>8s} {eager:8.1f}")

    c, mat, i8, f16 = (
        results[k]["footprint"] for k in ("compact/none", "materialized/none", "compact/int8", "compact/fp16")
    )
    p50 = {k: results[k]["footprint"]["latency"]["1x128"]["p50_ms"] for k in results}
    learned = results["compact/none"]["learned_params"]
    goals = [
        ("compact file / (4 x learned params)", c["file_bytes"] / (4 * learned), "<= 1.02"),
        ("compact p50 / materialized p50", p50["compact/none"] / p50["materialized/none"], "<= 1.05"),
        ("PyTorch eager p50 / ORT compact p50", eager / p50["compact/none"], ">= 1.5"),
        ("int8 file / compact fp32 file", i8["file_bytes"] / c["file_bytes"], "<= 0.30"),
        ("int8 p50 / compact fp32 p50", p50["compact/int8"] / p50["compact/none"], "<= 1.05"),
        ("fp16 file / compact fp32 file", f16["file_bytes"] / c["file_bytes"], "(~0.5)"),
        ("materialized file / compact file", mat["file_bytes"] / c["file_bytes"], "(info)"),
        ("int8-dynamic p50 / compact fp32 p50", p50["compact/int8-dynamic"] / p50["compact/none"], "(info)"),
        ("RSS after load: compact / materialized", c["peak_rss_load_mb"] / mat["peak_rss_load_mb"], "(info)"),
    ]
    if dense:
        goals += [
            ("dense BERT file / compact file", dense["file_bytes"] / c["file_bytes"], "(info)"),
            ("dense BERT p50 / compact p50", dense["latency"]["1x128"]["p50_ms"] / p50["compact/none"], "(info)"),
        ]
    for name in ("compact/int8", "compact/fp16", "compact/int8-dynamic"):
        goals.append(
            (f"{name} fill-mask top-1 agreement", results[name]["parity"]["top1_agreement"], ">= 0.95 (trained model)")
        )
    print("\nratio                                        measured   goal")
    for label, value, goal in goals:
        print(f"{label:44s} {value:9.3f}   {goal}")
    print(f"\nartifacts in {work}")


if __name__ == "__main__":
    main()
