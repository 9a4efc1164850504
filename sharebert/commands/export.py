"""``sharebert export``: a model folder -> an ONNX artifact folder with parity and footprint reports."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sharebert.export.quantize import HELP as QUANTIZE_HELP
    from sharebert_runtime import options as opt
    from sharebert_runtime.artifact import TASKS

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = "quantization modes:\n" + "\n".join(f"  {k:13s} {v}" for k, v in QUANTIZE_HELP.items())
    p.add_argument(
        "--model", type=opt.path, required=True, help="model folder (sharebert or transformers BERT, with tokenizer)"
    )
    p.add_argument(
        "--out",
        type=opt.path,
        required=True,
        help="artifact folder to write (refused if it exists, unless --overwrite)",
    )
    p.add_argument("--task", choices=TASKS, help="default: from the model's saved architecture")
    p.add_argument(
        "--weights",
        choices=("compact", "materialized"),
        default="compact",
        help="compact (default): the file stores only learned tensors, generated weights are graph nodes "
        "ONNX Runtime folds at load; materialized: generated weights stored (bigger file)",
    )
    p.add_argument("--quantize", choices=tuple(QUANTIZE_HELP), default="none", help="see 'quantization modes' below")
    p.add_argument(
        "--calibration",
        type=opt.path,
        help="sentence file for int8-static (.tsv with a 'sentence' column, or one per line)",
    )
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, 14..20 (default 17)")
    p.add_argument(
        "--format",
        default="onnx",
        metavar="onnx|ort|web",
        help="onnx (default): model.onnx; ort: ORT-format graphs for ONNX Runtime mobile / minimal builds "
        "(weight generation kept in the graph) and their required_operators.config (docs/DEVICE.md); "
        "web: a folder transformers.js loads as a Hub model (onnx/model_quantized.onnx for int8; docs/DEVICE.md)",
    )
    p.add_argument(
        "--optimize",
        action="store_true",
        help="apply ONNX Runtime's transformer fusions (LayerNorm, SkipLayerNorm, Gelu, Attention where the "
        "pattern matches); weight generation and the depth input stay; fp32 (--quantize none), "
        "encoder tasks, --format onnx; no RAM-int8 graphs",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.add_argument(
        "--check-file",
        type=opt.path,
        help="parity sentences (default: the data folder's glue/SST-2/dev.tsv, else the "
        "held-out sentences shipped in the package)",
    )
    p.add_argument("--check-limit", type=opt.positive_int, help="use only the first N parity sentences")
    p.add_argument(
        "--shapes", nargs="+", default=["1x128"], metavar="BxT", help="latency shapes, batch x sequence (default 1x128)"
    )
    p.add_argument(
        "--allow-low-parity",
        action="store_true",
        help="publish a quantized export even when its parity falls below the mode's thresholds "
        "(docs/EXPORT.md 'Parity thresholds'; recorded in the manifest)",
    )
    p.add_argument(
        "--threads", type=opt.positive_int, default=1, help="ONNX Runtime threads for the latency figures (default 1)"
    )


def run(args) -> int:
    from sharebert.export.exporter import export_model, format_report

    manifest = export_model(
        args.model,
        args.out,
        task=args.task,
        weights=args.weights,
        quantize=args.quantize,
        calibration=args.calibration,
        opset=args.opset,
        overwrite=args.overwrite,
        check_file=args.check_file,
        check_limit=args.check_limit,
        shapes=tuple(args.shapes),
        threads=args.threads,
        progress=True,
        format=args.format,
        optimize=args.optimize,
        allow_low_parity=args.allow_low_parity,
    )
    print(f"wrote {args.out}")
    print(format_report(manifest))
    return 0
