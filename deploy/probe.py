"""What an artifact costs a fresh process: ``python -m sharebert_runtime.probe ARTIFACT RUNS STARTED`` loads it
(torch never imported, 1 thread), answers one request, then times one sentence of 16 and of 128 tokens ``RUNS``
times, and prints one JSON line: ``peak_rss_bytes`` (VmHWM after the load: ``ru_maxrss`` would count the parent's
peak, kept across exec), ``added_rss_bytes`` (RSS after the load and the request, less RSS after the imports),
``first_answer_ms`` (since ``STARTED``, the parent's ``time.time()`` when it started this process: interpreter,
imports, load, one request), ``p50_ms_16`` and ``p50_ms_128``. ``compress``'s report reads it for both models."""

from __future__ import annotations

import json
import math
import sys
import time

TEXT = "the quick brown fox jumps over the lazy dog "


def p50_ms(run, tokens: int, runs: int) -> float:
    """Median milliseconds of ``run`` on one sentence of ``tokens`` tokens (special tokens included), after 3
    warm-ups."""
    import numpy as np

    text = " ".join((TEXT * 40).split()[: tokens - 2])
    for _ in range(3):
        run([text])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run([text])
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)


def measure(artifact: str, runs: int, started: float) -> dict:
    """The figures above, in this process (which must not have loaded anything else)."""
    from . import Runtime
    from .memory import status

    imports = status("VmRSS")
    rt = Runtime(artifact, threads=1)
    peak = status("VmHWM")
    run = rt.embed if rt.task == "feature-extraction" else rt.classify
    run(["one request"])
    out = {
        "peak_rss_bytes": peak,
        "added_rss_bytes": status("VmRSS") - imports,
        "first_answer_ms": (time.time() - started) * 1000,
    }
    return out | {f"p50_ms_{n}": p50_ms(run, n, runs) for n in (16, 128)}


MAX_RUNS = 1000  # timed runs per length: compress asks 30; a billion would never end
USAGE = (
    f"usage: python -m sharebert_runtime.probe ARTIFACT RUNS STARTED (1 <= RUNS <= {MAX_RUNS}; "
    "STARTED: the time.time() it started, not in the future)"
)


def _arguments(argv: list[str]) -> tuple[str, int, float]:
    try:
        artifact, runs, started = argv[0], int(argv[1]), float(argv[2])
    except (IndexError, ValueError):
        runs, started = 0, math.nan
    # a STARTED before the epoch or after now would make first_answer_ms absurd, negative or inf (not JSON)
    if len(argv) != 3 or not 1 <= runs <= MAX_RUNS or not 0 < started <= time.time():
        raise ValueError(USAGE)
    return artifact, runs, started


def main(argv: list[str]) -> int:
    """The command line above: one JSON line and 0, or one line on stderr and 2."""
    from .errors import first_line

    try:
        figures = measure(*_arguments(argv))
    except (OSError, ValueError, RuntimeError) as e:  # the usage, or the runtime's one line for a bad artifact
        print(f"error: {first_line(e)}", file=sys.stderr)
        return 2
    print(json.dumps(figures, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
