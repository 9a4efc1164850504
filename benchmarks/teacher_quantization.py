"""Which quantization keeps a teacher: each ``--quantize`` mode of ``sharebert export`` on model folders of any
encoder architecture, its parity with PyTorch on the export's check sentences (SST-2 dev, first 128).

Per folder and mode, one JSON line: the mean cosine of the hidden states (``hidden_cos_mean``) and of the sentence
embeddings (``emb_cos_mean``, a sentence-transformers folder) or the class agreement (a classifier), and the
graph's bytes. ``compress`` keeps the first of ``compress.TEACHER_QUANTIZATIONS`` whose figure holds 0.99.

    OMP_NUM_THREADS=1 python benchmarks/teacher_quantization.py FOLDER [FOLDER ...] --out runs/teacher_quant
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("none", "int8-dynamic", "int8-static", "int8", "fp16")


def main() -> None:
    from sharebert.export import export_model
    from sharebert.formats.paths import data_path
    from sharebert.pipelines.teacher_pass import kept_cosine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    for folder in a.folders:
        for mode in MODES:
            extra = {"calibration": data_path("glue", "SST-2", "train.tsv")} if mode == "int8-static" else {}
            m = export_model(
                folder,
                a.out / f"{folder.name}-{mode}",
                quantize=mode,
                overwrite=True,
                progress=False,
                check_limit=128,
                runs=3,
                allow_low_parity=True,
                **extra,
            )
            parity = m["parity"]
            print(
                json.dumps(
                    {
                        "model": folder.name,
                        "mode": mode,
                        "hidden_cos_mean": round(parity["cosine_mean"], 5),
                        "emb_cos_mean": parity.get("sentence_embedding", {}).get("cosine_mean"),
                        "agreement": parity.get("agreement"),
                        "kept": round(kept_cosine(m), 5),
                        "file_MB": round(m["footprint"]["file_bytes"] / 1e6, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
