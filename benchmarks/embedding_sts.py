"""STS-B dev Spearman, size and speed of sentence-embedding models side by side (docs/RESULTS.md).

Rows: the teacher (PyTorch, fp32), a distilled ShareBERT student (PyTorch, its sentence-transformers
folder) and its exported artifacts (torch-free runtime), and model2vec distilled from the same teacher
(``--model2vec DIR`` reuses one, else it is distilled here and timed). Cosine of the two sentences'
vectors against the gold scores, all 1,500 dev pairs.

    OMP_NUM_THREADS=1 python benchmarks/embedding_sts.py --teacher DIR --student DIR --artifact ART [ART ...]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--student", action="append", default=[], help="a student folder (repeatable)")
    ap.add_argument("--artifact", action="append", default=[], help="an exported artifact folder (repeatable)")
    ap.add_argument("--model2vec", help="a model2vec folder; 'distill' distils one from --teacher into runs/model2vec")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--depths", default="", help="also score each depth-gated artifact at these depths, e.g. 2,3")
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from sharebert.formats.paths import data_path
    from sharebert.formats.recipe import read_recipe
    from sharebert.pipelines.report import safetensor_params
    from sharebert.training.distill_embedding_model import load_encoder, recipe_head
    from sharebert.training.glue import read_split
    from sharebert.training.metrics import cosine_spearman
    from sharebert.training.sentence_vectors import encode
    from sharebert_runtime import Runtime

    split = read_split("stsb", data_path("glue", "STS-B"), "dev").head(a.limit)
    rows = []

    def torch_row(name, folder):
        r = read_recipe(folder)
        model, tok, head = load_encoder(folder), AutoTokenizer.from_pretrained(folder), recipe_head(folder, r)
        seq = r.max_seq_length or 128
        va = encode(model, tok, split.text_a, r.pooling, head, seq)
        vb = encode(model, tok, split.text_b, r.pooling, head, seq)
        size = sum(f.stat().st_size for f in Path(folder).rglob("*.safetensors") if "checkpoint" not in str(f))
        rows.append((name, cosine_spearman(va, vb, split.labels), safetensor_params(Path(folder)), size))

    torch_row("teacher (PyTorch fp32)", a.teacher)
    for s in a.student:
        torch_row(f"student {s} (PyTorch fp32)", s)
    for art in a.artifact:
        full = Runtime(art, threads=1)
        size = sum(
            f.stat().st_size for f in Path(art).rglob("*") if f.is_file() and f.suffix in (".onnx", ".data", ".ort")
        )
        depths = [None] + [int(d) for d in a.depths.split(",") if d and int(d) < (full.max_depth or 0)]
        for depth in depths:  # a shallower depth: the same artifact running its first layers only
            rt = full.at_depth(depth)
            va, vb = np.stack(rt.embed(split.text_a)), np.stack(rt.embed(split.text_b))
            at = f", depth {depth}" if depth else ""
            rows.append(
                (
                    f"artifact {art} ({rt.manifest.get('quantization')}{at})",
                    cosine_spearman(va, vb, split.labels),
                    rt.manifest.get("learned_params"),
                    size,
                )
            )
    if a.model2vec:
        from model2vec import StaticModel

        folder = a.model2vec
        if folder == "distill":
            from model2vec.distill import distill

            t0 = time.time()
            m = distill(model_name=a.teacher, pca_dims=256)
            folder = "runs/model2vec"
            m.save_pretrained(folder)
            print(f"model2vec.distill(model_name=teacher, pca_dims=256): {time.time() - t0:.0f} s -> {folder}")
        m = StaticModel.from_pretrained(folder)
        va, vb = m.encode(split.text_a), m.encode(split.text_b)
        size = sum(f.stat().st_size for f in Path(folder).rglob("*.safetensors"))
        rows.append((f"model2vec {folder}", cosine_spearman(va, vb, split.labels), int(m.embedding.size), size))
    print(f"STS-B dev, {len(split)} pairs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print("| model | Spearman | learned params | file bytes |\n|---|---|---|---|")
    for name, rho, n, size in rows:
        print(
            f"| {name} | {rho:.4f} | {n:,} | {size / 1e6:.1f} MB |"
            if n
            else f"| {name} | {rho:.4f} | - | {size / 1e6:.1f} MB |"
        )


if __name__ == "__main__":
    main()
