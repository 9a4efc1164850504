"""Distillation study: sharebert-tiny distilled from a small dense BERT teacher vs fine-tuned without one.

    python examples/distill_study.py --teachers runs/distill_study --out runs/distill_study/students

The teachers are ``<teachers>/teacher-sst2`` and ``<teachers>/teacher-cola`` (``sharebert finetune``
outputs of a ``bert-h128`` pre-trained with ``sharebert pretrain``; docs/RESULTS.md has the commands).
For each task and seed, one ``sharebert-tiny`` initialisation is built (``build_model``, seed S) and
trained twice with the same recipe and steps: ``sharebert finetune`` (no teacher) and
``sharebert distill`` (default losses). Prints a Markdown table of dev metrics (mean and spread over the
seeds) with the teacher's own, and writes ``results.json`` next to it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

from sharebert.formats.build import build_model  # noqa: E402
from sharebert.training.arguments import DistillArgs  # noqa: E402
from sharebert.training.distill import distill_glue  # noqa: E402
from sharebert.training.finetune import FinetuneArgs, finetune  # noqa: E402
from sharebert.training.glue import get_task  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", default="runs/distill_study")
    ap.add_argument("--out", default="runs/distill_study/students")
    ap.add_argument("--tasks", nargs="+", default=["sst2", "cola"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--max-steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seq-len", type=int, default=64)
    a = ap.parse_args()
    out = Path(a.out)
    recipe = dict(
        max_steps=a.max_steps,
        batch_size=a.batch_size,
        lr=a.lr,
        seq_len=a.seq_len,
        warmup_steps=10,
        eval_steps=a.max_steps // 3,
    )
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    for task in a.tasks:
        teacher = Path(a.teachers) / f"teacher-{task}"
        for seed in a.seeds:
            init = out / task / f"init-{seed}"
            if not init.is_dir():
                build_model("sharebert-tiny", init, seed=seed)
            for arm in ("finetune", "distill"):
                key = f"{task}/{arm}/{seed}"
                if key in results:
                    continue
                dest = out / task / f"{arm}-{seed}"
                if arm == "finetune":
                    m = finetune(
                        init, task, dest, args=FinetuneArgs(seed=seed, **recipe), overwrite=True, progress=False
                    )
                else:
                    m = distill_glue(
                        teacher,
                        str(init),
                        task,
                        dest,
                        args=DistillArgs(seed=seed, **recipe),
                        overwrite=True,
                        progress=False,
                    )
                    results[f"{task}/teacher"] = m["teacher"]
                results[key] = m
                (out / "results.json").write_text(json.dumps(results, indent=1))
                print(key, {k: m[k] for k in (get_task(task).main_metric, "train_seconds")}, flush=True)
    print(table(results, a.tasks, a.seeds))


def table(results: dict, tasks, seeds) -> str:
    rows = [
        "| task | metric | teacher (bert-h128) | sharebert-tiny fine-tuned | sharebert-tiny distilled |",
        "|---|---|---|---|---|",
    ]
    for task in tasks:
        metric = get_task(task).main_metric
        cells = []
        for arm in ("finetune", "distill"):
            vals = [results[f"{task}/{arm}/{s}"][metric] for s in seeds if f"{task}/{arm}/{s}" in results]
            spread = f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else ""
            cells.append(
                f"{statistics.mean(vals):.3f}{spread} ({', '.join(f'{v:.3f}' for v in vals)})" if vals else "-"
            )
        t = results.get(f"{task}/teacher", {}).get(metric)
        rows.append(f"| {task} | {metric} | {t if t is None else f'{t:.3f}'} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
