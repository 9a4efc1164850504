"""Where a large teacher's first-run export goes: one rung of compress's ladder (``teacher_pass.export_rung``, the
first rung ``teacher_ladder`` gives: int8 for a teacher over 40 MB) of ``benchmarks/teacher_pass.py``'s 109M
MPNet-class teacher (built there once, under ``--work``), under cProfile, once per parity-sentence count of
``--checks`` (``teacher_pass.LARGE_TEACHER_CHECK`` set to each, in turn, in one process); prints each run's wall
seconds, the seconds of its parity passes (``exporter._parity``) and the functions of the export package and the
runtime that took the most cumulative time, to say what an export for the pass alone could skip.

    python benchmarks/teacher_export_profile.py [--checks 64,32] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

WORK = Path("runs/teacher_pass")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--top", type=int, default=25, help="functions listed (default: %(default)s)")
    p.add_argument("--work", type=Path, default=WORK, help="the teacher (default: %(default)s)")
    p.add_argument("--checks", default="64,32", help="parity sentences, in turn (default: %(default)s)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from teacher_pass import mpnet_teacher

    import sharebert.pipelines.teacher_pass as ladder
    from sharebert.pipelines.teacher_pass import export_rung, teacher_ladder

    folder = mpnet_teacher(args.work)
    mode = teacher_ladder(folder)[0]
    for check in (int(n) for n in args.checks.split(",")):
        ladder.LARGE_TEACHER_CHECK = check
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.runcall(export_rung, folder, Path(tmp) / "artifact", "feature-extraction", mode)
            seconds = time.perf_counter() - start
        stats = pstats.Stats(profile)
        parity = next(v[3] for k, v in stats.stats.items() if k[0].endswith("exporter.py") and k[2] == "_parity")
        print(
            f"export_rung({folder.name}, {mode}), parity on {check} sentences: {seconds:.0f} s wall, the parity "
            f"passes {parity:.0f} s; load {load:.1f} -> {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        stats.sort_stats("cumulative").print_stats(r"(export|deploy|sharebert|onnx|torch/onnx|quantiz)", args.top)


if __name__ == "__main__":
    main()
