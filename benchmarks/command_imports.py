"""What the arithmetic commands cost in the `sharebert` command's own process, against the same commands after the
library's registration with transformers (what every `import sharebert` on a workstation runs): CPU seconds and peak
resident memory of a fresh process, measured side by side in one run.

    OMP_NUM_THREADS=1 python benchmarks/command_imports.py --rounds 3

"program" runs ``sharebert_runtime.main.main()`` as the console script does (``sharebert_runtime.main.PROGRAM``: the
registration waits for a command that builds a model, so `report`, `budget` and `--help` import no torch);
"registered" runs ``import sharebert`` first, as the command did before. The two alternate, ``--rounds`` times, so a
busy machine slows both alike; the figures are medians over rounds, and the ratio is registered / program.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

COMMANDS = (["report", "--preset", "sharebert-large"], ["budget", "--max-params", "10M"], ["build", "--help"])
MODES = {
    "program": "import sys; from sharebert_runtime.main import main; sys.exit(main())",
    "registered": "import sys, sharebert; from sharebert_runtime.main import main; sys.exit(main())",
}


def cpu_seconds(code: str, argv: list[str]) -> float:
    """CPU seconds (user + system) of one fresh process running ``code`` with ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code, *argv], check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for argv in COMMANDS:
        cpu = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, code in MODES.items():
                cpu[mode].append(cpu_seconds(code, argv))
        med = {mode: statistics.median(v) for mode, v in cpu.items()}
        rss = {mode: _peak_of(code, argv) for mode, code in MODES.items()}
        print(
            f"sharebert {' '.join(argv)}: program {med['program']:.2f} s CPU, {rss['program']:.0f} MB; "
            f"registered {med['registered']:.2f} s, {rss['registered']:.0f} MB; "
            f"ratio {med['registered'] / med['program']:.1f}x CPU, {rss['registered'] / rss['program']:.1f}x memory"
        )


def _peak_of(code: str, argv: list[str]) -> float:
    """Peak resident MB of one process, read by a wrapper process of its own (a clean RUSAGE_CHILDREN)."""
    wrapper = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True
    )
    return float(done.stdout.strip())


if __name__ == "__main__":
    main()
