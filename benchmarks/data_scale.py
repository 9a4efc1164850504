"""Pre-training data at scale: `sharebert prepare` throughput and `pretrain --data` start-up, memory and speed.

Builds plain-text corpora of the given sizes from the shared data (WikiText-2 and the enwiki sample,
lines shuffled with a fixed seed and repeated) under ``--out`` (git-ignored ``runs/``), then prints:

* ``prepare`` MB/s with 1 and 2 workers (smallest size) and with ``--workers`` for the others;
* bytes per token: of the text, and on disk (the shards);
* for each size, from launch: seconds to the first optimizer step and peak RSS of
  ``pretrain --data`` (sharebert-tiny, batch 32 x 128), and training tokens/s after the first steps;
* the same for today's in-memory path (``pretrain --train`` on the smallest corpus).

Goals: prepare >= 5 MB/s per core; first step <= 10 s; RSS(largest) / RSS(smallest) <= 1.1;
tokens/s of --data within 5% of --train.

    .venv/bin/python benchmarks/data_scale.py [--sizes-mb 100 1000] [--steps 40] [--out runs/data_scale]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from sharebert.paths import data_path  # noqa: E402
from sharebert.training.corpus import iter_lines  # noqa: E402

SHARED = [data_path("wikitext-2-raw", "wiki.test.raw"), data_path("wikitext-2-raw", "wiki.valid.raw"),
          data_path("enwiki-sample")]
CLI = [sys.executable, "-m", "sharebert"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
BATCH, SEQ = 32, 128


def build_corpus(path: Path, mb: int) -> Path:
    """``mb`` MB of shared text, lines shuffled (seed 0) and repeated; reused when already built."""
    if path.is_file() and path.stat().st_size >= mb * 1_000_000:
        return path
    lines = [ln for src in sorted(SHARED) for f in ([src] if src.is_file() else sorted(src.iterdir()))
             for ln in iter_lines(f) if ln.strip()]
    rng, size = random.Random(0), 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1_000_000:
            rng.shuffle(lines)
            for ln in lines:
                f.write(ln)
                size += len(ln.encode())
                if size >= mb * 1_000_000:
                    break
    return path


def timed(cmd: list[str], log: Path | None = None) -> dict:
    """Run ``cmd``; wall seconds, peak RSS (MB, process tree, polled at 20 Hz), and when ``log`` is given
    the seconds from launch to the first logged optimizer step."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.05)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{output[-3000:]}")
    res = {"seconds": time.time() - start, "peak_rss_mb": peak / 2**20}
    if log is not None:
        steps = [json.loads(x) for x in log.read_text().splitlines()]
        steps = [r for r in steps if "loss" in r]
        res["first_step_s"] = steps[0]["time"] - start
        k = min(5, len(steps) - 2)  # skip warm-up steps
        res["tokens_per_s"] = (steps[-1]["step"] - steps[k]["step"]) * BATCH * SEQ / (steps[-1]["time"] - steps[k]["time"])
    return res


def prepare(corpus: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    r = timed([*CLI, "prepare", "--train", str(corpus), "--out", str(out), "--workers", str(workers), "--no-progress"])
    m = json.loads((out / "manifest.json").read_text())
    tokens = m["splits"]["train"]["tokens"]
    disk = sum((out / s["file"]).stat().st_size for s in m["splits"]["train"]["shards"])
    mb = corpus.stat().st_size / 1e6
    return {**r, "mb_s": mb / r["seconds"], "tokens": tokens, "text_bytes_per_token": mb * 1e6 / tokens,
            "disk_bytes_per_token": disk / tokens}


def pretrain(source: list[str], out: Path, steps: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    return timed([*CLI, "pretrain", "--preset", "sharebert-tiny", *source, "--out", str(out), "--max-steps", str(steps),
                  "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--logging-steps", "1", "--save-steps", "100000",
                  "--eval-steps", "100000", "--eval-samples", "64", "--no-progress"], out / "log.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="prepare workers for the larger sizes")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "data_scale")
    ap.add_argument("--skip-in-memory", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sizes = sorted(a.sizes_mb)
    rows = {}
    for mb in sizes:
        corpus = build_corpus(a.out / f"corpus-{mb}mb.txt", mb)
        for w in ([1, 2] if mb == sizes[0] else [a.workers]):
            p = prepare(corpus, a.out / f"data-{mb}mb", w)
            print(f"prepare {mb} MB, {w} worker(s): {p['seconds']:.1f} s = {p['mb_s']:.2f} MB/s "
                  f"({p['mb_s'] / w:.2f} MB/s per worker); {p['tokens']:,} tokens, "
                  f"{p['text_bytes_per_token']:.2f} text bytes/token, {p['disk_bytes_per_token']:.1f} bytes/token on disk",
                  flush=True)
        r = pretrain(["--data", str(a.out / f"data-{mb}mb")], a.out / f"train-{mb}mb", a.steps)
        rows[mb] = r
        print(f"pretrain --data {mb} MB: first step {r['first_step_s']:.1f} s after launch, peak RSS "
              f"{r['peak_rss_mb']:.0f} MB, {r['tokens_per_s']:,.0f} tokens/s", flush=True)
    if len(sizes) > 1:
        print(f"RSS({sizes[-1]} MB) / RSS({sizes[0]} MB) = {rows[sizes[-1]]['peak_rss_mb'] / rows[sizes[0]]['peak_rss_mb']:.3f}")
    if not a.skip_in_memory:
        mb = sizes[0]
        r = pretrain(["--train", str(a.out / f"corpus-{mb}mb.txt"), "--valid-fraction", "0.01"],
                     a.out / f"train-{mb}mb-inmemory", a.steps)
        print(f"pretrain --train {mb} MB (in memory): first step {r['first_step_s']:.1f} s after launch, peak RSS "
              f"{r['peak_rss_mb']:.0f} MB, {r['tokens_per_s']:,.0f} tokens/s")
        print(f"tokens/s --data / --train = {rows[mb]['tokens_per_s'] / r['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
