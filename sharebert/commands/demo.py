"""``sharebert demo``: the main job end to end on an embedded default.

Report for ShareBERT Small, then build ``sharebert-tiny``, pre-train it briefly on WikiText-2,
export it as an int8 ONNX artifact and answer fill-mask queries with the torch-free runtime.
Each step prints its report; under 5 minutes on 2 CPU cores.
"""
from __future__ import annotations

import time
from pathlib import Path

HELP = "run the whole path (report, build, pre-train, export int8, predict) on a tiny default"

SENTENCES = ["the capital of france is [MASK].", "he went to the [MASK] to buy some bread."]
DEMO_PARTS = ("model", "pretrained", "onnx-int8")  # what the demo writes into --out, and nothing else


def _is_demo_folder(path: Path) -> bool:
    """Whether ``path`` holds only what an earlier demo wrote (the demo replaces such a folder, never another)."""
    return all(p.name in DEMO_PARTS and p.is_dir() for p in path.iterdir())


def add_arguments(p):
    p.add_argument("--out", default="runs/demo", help="working folder (default: runs/demo)")
    p.add_argument("--steps", type=int, default=300, help="pre-training steps (default: 300)")


def _step(title: str):
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def run(args) -> int:
    import shutil

    from ..cli import main
    from ..outdir import check_out_dir
    from ..paths import data_path

    out = check_out_dir(args.out, "demo folder", _is_demo_folder, overwrite=True)
    if out.exists():  # an earlier demo's folder: start clean every time
        shutil.rmtree(out)
    wiki = data_path("wikitext-2-raw")
    t0 = time.time()
    _step("1. Parameter and FLOP report: ShareBERT Small (analytic, from the config)")
    main(["report", "--preset", "sharebert-small"])

    _step("2. Build sharebert-tiny")
    rc = main(["build", "--preset", "sharebert-tiny", "--out", str(out / "model")])
    if rc:
        return rc

    _step(f"3. Pre-train {args.steps} masked-LM steps on WikiText-2 (valid split; test split held out)")
    rc = main(["pretrain", "--model", str(out / "model"), "--train", str(wiki / "wiki.valid.raw"),
               "--valid", str(wiki / "wiki.test.raw"), "--out", str(out / "pretrained"), "--max-steps", str(args.steps),
               "--batch-size", "32", "--seq-len", "64", "--lr", "2e-3", "--eval-steps", str(args.steps),
               "--save-steps", str(args.steps), "--max-eval-sequences", "64", "--logging-steps", "25"])
    if rc:
        return rc

    _step("4. Export int8 (learned tensors stored as int8, weights generated at load)")
    rc = main(["export", "--model", str(out / "pretrained"), "--out", str(out / "onnx-int8"), "--quantize", "int8",
               "--overwrite"])
    if rc:
        return rc

    _step("5. Fill-mask with the torch-free runtime")
    rc = main(["predict", str(out / "onnx-int8"), *SENTENCES])
    print(f"\n{args.steps} steps on 2 cores teach a model word frequencies, not language: expect frequent words above;\n"
          f"pre-train longer for real answers (docs/TRAINING.md, docs/RESULTS.md).")
    print(f"demo finished in {time.time() - t0:.0f} s; artifacts under {out}/")
    return rc
