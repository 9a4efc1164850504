"""Would micro-batching help ``sharebert serve`` on a CPU? ``--requests`` one-sentence requests run one by one
versus joined into batches of 2..``--requests`` texts (what a server batching requests that wait together would
run), in this process on ONNX Runtime, best of ``--repeats``.

    python benchmarks/serve_batching.py --artifact artifacts/serve_bench/sharebert-tiny-none --threads 1
    python benchmarks/serve_batching.py --artifact runs/minilm-embed --threads 1     # a feature-extraction export

The texts are SST-2 dev sentences (with one ``[MASK]`` for fill-mask artifacts). A batch is padded to its
longest text; a fill-mask call computes the vocabulary logits of every position, padding included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import masked_sentences  # noqa: E402


def best_ms(run, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main(argv=None) -> int:
    from sharebert_runtime import Runtime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--artifact", required=True, help="an exported fill-mask, feature-extraction or classification artifact"
    )
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads (default: 1)")
    ap.add_argument("--requests", type=int, default=32, help="one-sentence requests (default: 32)")
    ap.add_argument("--repeats", type=int, default=3, help="best of (default: 3)")
    args = ap.parse_args(argv)
    runtime = Runtime(args.artifact, threads=args.threads)
    texts = masked_sentences(args.requests)
    if runtime.task != "fill-mask":
        texts = [t.replace("[MASK]", "thing") for t in texts]
    runtime.predict(texts[:4])  # first-run allocations
    alone = best_ms(lambda: [runtime.predict([t]) for t in texts], args.repeats)
    print(f"{runtime.task}, {len(texts)} one-sentence requests, threads {args.threads}")
    print(f"  one by one          {alone:8.1f} ms")
    size = 2
    while size <= len(texts):
        ms = best_ms(
            lambda size=size: [runtime.predict(texts[i : i + size]) for i in range(0, len(texts), size)], args.repeats
        )
        print(f"  in batches of {size:<4}  {ms:8.1f} ms  ({ms / alone:.2f}x one by one)")
        size *= 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
