"""Length-aware batching: SST-2 dev sentences/s of the torch-free runtime's ``classify`` in three modes.

* ``pad-128``: every input padded to the artifact's maximum length (128), calls in input order (what a
  fixed-shape export costs);
* ``per-call``: calls in input order, each padded to its own longest input (``group_by_length=False``);
* ``grouped``: the runtime's default, texts ordered by token length into calls of similar lengths.

The three run side by side in one process (one ONNX Runtime thread each, ``--batch-size`` texts per
call), alternating repeats; the medians are reported, with the padded tokens each mode runs and the
largest difference of its scores from ``grouped``'s. Without ``--artifact`` a random-weight
``--preset`` model is built and exported once under ``runs/grouping/`` as a two-label classifier
(torch needed for that only; time does not depend on the weights).

    python benchmarks/length_grouping.py [--preset sharebert-tiny|sharebert-small] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from sharebert.formats.paths import data_path
from sharebert_runtime import Runtime

BENCH_DIR = Path("runs/grouping")
MODES = ("pad-128", "per-call", "grouped")


class PaddedRuntime(Runtime):
    """Every call padded to ``max_length``; calls in input order."""

    group_by_length = False

    def _pad(self, rows):
        ids, mask = super()._pad(rows)
        width = ((0, 0), (0, self.max_length - ids.shape[1]))
        return np.pad(ids, width, constant_values=self.pad_id), np.pad(mask, width)


def sst2_dev() -> list[str]:
    """The 872 SST-2 dev sentences, in file order."""
    lines = data_path("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def ensure_artifact(preset: str, quantize: str = "none") -> Path:
    """A two-label classifier artifact of a random-weight ``preset`` model, built and exported once."""
    import shutil

    from sharebert import ShareBertForSequenceClassification
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model

    model, cls, art = BENCH_DIR / f"{preset}-model", BENCH_DIR / f"{preset}-cls", BENCH_DIR / f"{preset}-cls-{quantize}"
    if not (art / "manifest.json").is_file():
        if not (cls / "config.json").is_file():
            build_model(preset, model, seed=0)
            ShareBertForSequenceClassification.from_pretrained(model, num_labels=2).save_pretrained(cls)
            for f in model.iterdir():
                if not (cls / f.name).exists():
                    shutil.copy(f, cls)
        print(f"exporting {preset} text-classification, compact, quantize {quantize} -> {art}", flush=True)
        export_model(
            cls,
            art,
            task="text-classification",
            weights="compact",
            quantize=quantize,
            overwrite=True,
            check_limit=32,
            runs=5,
            progress=False,
        )
    return art


def measure(artifact: Path, sentences: list[str], repeats: int = 7, batch_size: int = 32, threads: int = 1) -> dict:
    """Per mode ``{"sentences_per_s", "padded_tokens", "calls", "max_abs_diff"}`` (medians of ``repeats``)."""
    runtimes = {
        "pad-128": PaddedRuntime(artifact, threads=threads, batch_size=batch_size),
        "per-call": Runtime(artifact, threads=threads, batch_size=batch_size),
        "grouped": Runtime(artifact, threads=threads, batch_size=batch_size),
    }
    runtimes["per-call"].group_by_length = False
    stats, scores = {}, {}
    for mode, rt in runtimes.items():  # warm-up, counting what each ONNX Runtime call pads to
        calls, run = [], rt._run
        rt._run = lambda ids, mask, past=None, calls=calls, run=run: calls.append(ids.size) or run(ids, mask, past)
        scores[mode] = np.array([list(p["scores"].values()) for p in rt.classify(sentences)])
        del rt._run
        stats[mode] = {"padded_tokens": sum(calls), "calls": len(calls)}
    times = {mode: [] for mode in MODES}
    for r in range(repeats):
        for mode in MODES[r % 3 :] + MODES[: r % 3]:  # each mode takes each place in turn
            start = time.perf_counter()
            runtimes[mode].classify(sentences)
            times[mode].append(time.perf_counter() - start)
    for mode in MODES:
        stats[mode]["sentences_per_s"] = len(sentences) / statistics.median(times[mode])
        stats[mode]["max_abs_diff"] = float(np.abs(scores[mode] - scores["grouped"]).max())
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="sharebert-tiny", help="model built without --artifact (default: %(default)s)")
    p.add_argument("--artifact", type=Path, help="a text-classification artifact to measure instead")
    p.add_argument("--quantize", choices=("none", "int8"), default="none", help="export of the built model")
    p.add_argument("--repeats", type=int, default=7, help="runs over SST-2 dev per mode (default: 7)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per ONNX Runtime call (default: 32)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default: 1)")
    args = p.parse_args()
    artifact = args.artifact or ensure_artifact(args.preset, args.quantize)
    sentences = sst2_dev()
    stats = measure(artifact, sentences, args.repeats, args.batch_size, args.threads)
    print(
        f"{artifact}: {len(sentences)} SST-2 dev sentences, batch {args.batch_size}, {args.threads} thread(s), "
        f"median of {args.repeats}"
    )
    print(f"{'mode':<10}{'sentences/s':>13}{'vs pad-128':>12}{'padded tokens':>15}{'calls':>7}{'max |diff|':>12}")
    for mode in MODES:
        s, speedup = stats[mode], stats[mode]["sentences_per_s"] / stats["pad-128"]["sentences_per_s"]
        print(
            f"{mode:<10}{s['sentences_per_s']:>13.1f}{speedup:>11.2f}x{s['padded_tokens']:>15}{s['calls']:>7}"
            f"{s['max_abs_diff']:>12.1e}"
        )


if __name__ == "__main__":
    main()
