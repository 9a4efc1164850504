"""``sharebert verify ARTIFACT``: does the artifact, on this CPU, answer as it did at export? (torch-free)

The manifest's ``reference`` (``reference.py``) holds a few inputs as token ids and what PyTorch answered to them at
export; this replays them through the artifact with :class:`~sharebert_runtime.runtime.Runtime` (the ``--ram`` mode
asked, at full depth) and compares, per output: ``max_abs_diff``, ``cosine_min`` / ``cosine_mean`` and
``top1_agreement``, against the artifact's own parity thresholds for that mode (``reference.thresholds``: the
export's, and for RAM int8 the int8 ones, which the export wrote since the runtime never reads ``export/``). It prints
them with the CPU they came from, beside the figures and the CPU of the export. Exit 0 when every output is within its
thresholds, 1 when one is not (the line names it), 2 for an artifact it cannot check (one line: missing, damaged, or
exported before artifacts carried a reference).
"""

from __future__ import annotations

import json

from .reference import finite, report


def add_arguments(p):
    from .runtime import RAM_MODES

    p.add_argument("artifact", help="artifact folder written by `sharebert export`")
    p.add_argument(
        "--ram",
        choices=RAM_MODES,
        default="auto",
        help="the mode to check, as predict and serve load it (default: auto, the mode they use by default)",
    )
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: ORT's choice)")
    p.add_argument(
        "--pin",
        metavar="SHA256",
        help="refuse the artifact unless manifest.json has this sha256 (the manifest, whose checksums vouch for every "
        "other file, holds the reference too)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args) -> int:
    from .runtime import Runtime

    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}")
    result = Runtime(args.artifact, threads=args.threads, ram=args.ram, manifest_sha256=args.pin).verify()
    print(json.dumps(finite(result), allow_nan=False) if args.json else report(result))
    return 0 if result["passed"] else 1
