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

``--hostile`` adds the hostile inputs, each with its peak RSS and seconds from launch to its result or
refusal: ``prepare`` of a 60 MB file without one newline (side by side with the same text in lines: both bounded
by sharebert_runtime.textlines); ``/dev/zero`` given to every reader of user text (``prepare --train``, ``pretrain
--train``, ``distill --objective embedding --train``, ``predict --input``, ``predict --input -`` on stdin, ``export
--calibration`` and ``--check-file``) and the one-line file to those that take one text per line (predict, from a file
and on stdin, and export's sentence files): each a one-line refusal, exit 2, in bounded memory, naming the input (and
the line). Only those run with ``--hostile-only``.

    .venv/bin/python benchmarks/data_scale.py [--sizes-mb 100 1000] [--steps 40] [--out runs/data_scale]
    .venv/bin/python benchmarks/data_scale.py --hostile-only
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
from sharebert.formats.paths import data_path  # noqa: E402
from sharebert.training.corpus import iter_lines  # noqa: E402

SHARED = [
    data_path("wikitext-2-raw", "wiki.test.raw"),
    data_path("wikitext-2-raw", "wiki.valid.raw"),
    data_path("enwiki-sample"),
]
CLI = [sys.executable, "-m", "sharebert"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
BATCH, SEQ = 32, 128


def build_corpus(path: Path, mb: int) -> Path:
    """``mb`` MB of shared text, lines shuffled (seed 0) and repeated; reused when already built."""
    if path.is_file() and path.stat().st_size >= mb * 1_000_000:
        return path
    lines = [
        ln
        for src in sorted(SHARED)
        for f in ([src] if src.is_file() else sorted(src.iterdir()))
        for ln in iter_lines(f)
        if ln.strip()
    ]
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


def timed(cmd: list[str], log: Path | None = None, stdin=None, refused: bool = False) -> dict:
    """Run ``cmd``; wall seconds, peak RSS (MB, process tree, polled at 20 Hz), and when ``log`` is given
    the seconds from launch to the first logged optimizer step. ``refused``: it must exit 2 with one line."""
    start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=stdin
    )
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.05)
    output = proc.stdout.read()
    if refused:
        if proc.returncode != 2 or len(output.strip().splitlines()) != 1:
            raise SystemExit(f"{' '.join(cmd)} was not refused in one line (exit {proc.returncode}):\n{output[-3000:]}")
        return {"seconds": time.time() - start, "peak_rss_mb": peak / 2**20, "message": output.strip()}
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{output[-3000:]}")
    res = {"seconds": time.time() - start, "peak_rss_mb": peak / 2**20}
    if log is not None:
        steps = [json.loads(x) for x in log.read_text().splitlines()]
        steps = [r for r in steps if "loss" in r]
        res["first_step_s"] = steps[0]["time"] - start
        k = min(5, len(steps) - 2)  # skip warm-up steps
        res["tokens_per_s"] = (
            (steps[-1]["step"] - steps[k]["step"]) * BATCH * SEQ / (steps[-1]["time"] - steps[k]["time"])
        )
    return res


def prepare(corpus: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    r = timed([*CLI, "prepare", "--train", str(corpus), "--out", str(out), "--workers", str(workers), "--no-progress"])
    m = json.loads((out / "manifest.json").read_text())
    tokens = m["splits"]["train"]["tokens"]
    disk = sum((out / s["file"]).stat().st_size for s in m["splits"]["train"]["shards"])
    mb = corpus.stat().st_size / 1e6
    return {
        **r,
        "mb_s": mb / r["seconds"],
        "tokens": tokens,
        "text_bytes_per_token": mb * 1e6 / tokens,
        "disk_bytes_per_token": disk / tokens,
    }


def pretrain(source: list[str], out: Path, steps: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    return timed(
        [
            *CLI,
            "pretrain",
            "--preset",
            "sharebert-tiny",
            *source,
            "--out",
            str(out),
            "--max-steps",
            str(steps),
            "--batch-size",
            str(BATCH),
            "--seq-len",
            str(SEQ),
            "--logging-steps",
            "1",
            "--save-steps",
            "100000",
            "--eval-steps",
            "100000",
            "--eval-samples",
            "64",
            "--no-progress",
        ],
        out / "log.jsonl",
    )


def hostile(out: Path) -> None:
    """The hostile inputs: a 60 MB line and /dev/zero, each refused in bounded memory."""
    lines = build_corpus(out / "corpus-60mb.txt", 60)
    one = out / "corpus-60mb-one-line.txt"
    if not one.is_file():
        with open(lines, encoding="utf-8") as src, open(one, "w", encoding="utf-8") as dst:
            for ln in src:
                dst.write(ln.rstrip("\n") + " ")
    for corpus in (lines, one):
        p = prepare(corpus, out / f"data-{corpus.stem}", 1)
        print(
            f"prepare {corpus.name} ({corpus.stat().st_size / 1e6:.0f} MB): peak RSS {p['peak_rss_mb']:.0f} MB, "
            f"{p['seconds']:.1f} s, {p['tokens']:,} tokens",
            flush=True,
        )
    artifact, model = out / "tiny-artifact", out / "tiny"
    if not (artifact / "manifest.json").is_file():
        subprocess.run(
            [*CLI, "build", "--preset", "sharebert-tiny", "--out", str(model), "--overwrite"],
            cwd=REPO,
            env=ENV,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*CLI, "export", "--model", str(model), "--out", str(artifact), "--overwrite", "--check-limit", "8"],
            cwd=REPO,
            env=ENV,
            check=True,
            capture_output=True,
        )
    refusals = [  # (what, command with {src} for the hostile input)
        ("prepare --train {src}", ["prepare", "--train", "{src}", "--out", str(out / "data-refused"), "--no-progress"]),
        (
            "pretrain --train {src}",
            [
                "pretrain",
                "--model",
                str(model),
                "--train",
                "{src}",
                "--out",
                str(out / "pt-refused"),
                "--max-steps",
                "1",
                "--no-progress",
            ],
        ),
        (
            "distill --objective embedding --train {src}",
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                str(model),
                "--student",
                "sharebert-tiny",
                "--init",
                "random",
                "--train",
                "{src}",
                "--out",
                str(out / "de-refused"),
                "--max-steps",
                "1",
            ],
        ),
        ("predict --input {src}", ["predict", str(artifact), "--input", "{src}"]),
        (
            "export --calibration {src}",
            [
                "export",
                "--model",
                str(model),
                "--out",
                str(out / "ex-refused"),
                "--quantize",
                "int8-static",
                "--calibration",
                "{src}",
            ],
        ),
        (
            "export --check-file {src}",
            ["export", "--model", str(model), "--out", str(out / "ex-refused"), "--check-file", "{src}"],
        ),
    ]
    for src in ("/dev/zero", str(one)):
        for what, argv in refusals:
            if what.startswith(("prepare", "pretrain", "distill")) and src == str(one):
                continue  # a corpus line is read in pieces: prepare trains on it (above); pretrain would too
            r = timed([*CLI, *(a.replace("{src}", src) for a in argv)], refused=True)
            print(
                f"{what.format(src=Path(src).name)}: refused in {r['seconds']:.1f} s, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB: {r['message']}",
                flush=True,
            )
    for src in ("/dev/zero", str(one)):
        with open(src, "rb") as stream:
            r = timed([*CLI, "predict", str(artifact), "--input", "-"], stdin=stream, refused=True)
        print(
            f"predict --input - < {Path(src).name}: refused in {r['seconds']:.1f} s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB: {r['message']}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="prepare workers for the larger sizes")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "data_scale")
    ap.add_argument("--skip-in-memory", action="store_true")
    ap.add_argument("--hostile", action="store_true", help="also the hostile inputs: a 60 MB line, /dev/zero")
    ap.add_argument("--hostile-only", action="store_true", help="only the hostile inputs")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.hostile or a.hostile_only:
        hostile(a.out)
    if a.hostile_only:
        return
    sizes = sorted(a.sizes_mb)
    rows = {}
    for mb in sizes:
        corpus = build_corpus(a.out / f"corpus-{mb}mb.txt", mb)
        for w in [1, 2] if mb == sizes[0] else [a.workers]:
            p = prepare(corpus, a.out / f"data-{mb}mb", w)
            print(
                f"prepare {mb} MB, {w} worker(s): {p['seconds']:.1f} s = {p['mb_s']:.2f} MB/s "
                f"({p['mb_s'] / w:.2f} MB/s per worker); {p['tokens']:,} tokens, "
                f"{p['text_bytes_per_token']:.2f} text bytes/token, "
                f"{p['disk_bytes_per_token']:.1f} bytes/token on disk",
                flush=True,
            )
        r = pretrain(["--data", str(a.out / f"data-{mb}mb")], a.out / f"train-{mb}mb", a.steps)
        rows[mb] = r
        print(
            f"pretrain --data {mb} MB: first step {r['first_step_s']:.1f} s after launch, peak RSS "
            f"{r['peak_rss_mb']:.0f} MB, {r['tokens_per_s']:,.0f} tokens/s",
            flush=True,
        )
    if len(sizes) > 1:
        ratio = rows[sizes[-1]]["peak_rss_mb"] / rows[sizes[0]]["peak_rss_mb"]
        print(f"RSS({sizes[-1]} MB) / RSS({sizes[0]} MB) = {ratio:.3f}")
    if not a.skip_in_memory:
        mb = sizes[0]
        r = pretrain(
            ["--train", str(a.out / f"corpus-{mb}mb.txt"), "--valid-fraction", "0.01"],
            a.out / f"train-{mb}mb-inmemory",
            a.steps,
        )
        print(
            f"pretrain --train {mb} MB (in memory): first step {r['first_step_s']:.1f} s after launch, peak RSS "
            f"{r['peak_rss_mb']:.0f} MB, {r['tokens_per_s']:,.0f} tokens/s"
        )
        print(f"tokens/s --data / --train = {rows[mb]['tokens_per_s'] / r['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
