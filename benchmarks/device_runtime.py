"""Device figures for the torch-free runtime, as ratios against a dense BERT Base measured in the same run.

Artifacts (random weights unless ``--model`` names a trained sharebert-small; time and memory do not
depend on the weights, the ram int8 vs fp32 parity does):

* ``sharebert-small`` fill-mask, exported compact fp32 and int8 (``sharebert.export.exporter``), each run
  with ``ram="fp32"`` (ORT folds the generated weights to fp32) and ``ram="int8"`` (generated weights
  held as int8, dynamic-int8 MatMuls);
* a dense ``transformers`` ``BertForMaskedLM`` (BERT Base shape) exported by optimum ``main_export``.

Each row is a fresh subprocess in which importing torch/transformers/optimum/onnx raises (a device):
cold start (process start to first result), peak RSS, RSS after the runs, p50/p95 latency of
``fill_mask`` on 1 and 8 SST-2 dev sentences with one ``[MASK]`` each, at 1 and 2 threads.

    python benchmarks/device_runtime.py [--model runs/small-pretrained] [--out artifacts/device_bench] [--reps 30]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "optimum", "onnx"}:
            raise ImportError(f"{name} is not on the device")
sys.meta_path.insert(0, _Block())
"""

CHILD = BLOCK + """
import json, time
import numpy as np
from sharebert.deploy import Runtime
path, threads, ram, reps, sentences = json.loads(sys.argv[1])
rt = Runtime(path, threads=threads, ram=ram)
rt.fill_mask(sentences[:1])
print("FIRST", flush=True)
latency = {}
for n in (1, 8):
    batch = sentences[:n]
    for _ in range(3):
        rt.fill_mask(batch)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        rt.fill_mask(batch)
        times.append(time.perf_counter() - t)
    latency[n] = (float(np.percentile(times, 50)) * 1e3, float(np.percentile(times, 95)) * 1e3)
# /proc VmHWM, not getrusage: ru_maxrss survives exec and would report the parent's peak.
status = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith("Vm")}
rss, peak = status["VmRSS"], status["VmHWM"]
print("RESULT " + json.dumps({"latency": latency, "rss_mb": rss, "peak_mb": peak}), flush=True)
"""


def sst2_masked(n: int = 8) -> list[str]:
    """The first ``n`` SST-2 dev sentences with their third word replaced by ``[MASK]``."""
    from sharebert.paths import data_path

    rows = data_path("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    out = []
    for row in rows:
        words = row.split("\t")[0].split()
        if len(words) >= 6:
            words[2] = "[MASK]"
            out.append(" ".join(words))
        if len(out) == n:
            return out
    raise ValueError("SST-2 dev has too few sentences")


def dense_bert_artifact(out: Path) -> Path:
    """BERT Base (random weights) exported by optimum ``main_export``, with a sharebert manifest."""
    import torch
    from optimum.exporters.onnx import main_export
    from transformers import BertConfig, BertForMaskedLM

    from sharebert.paths import default_vocab
    from sharebert.tokenization import hf_tokenizer

    src, art = out / "bert-base-model", out / "bert-base-onnx"
    if not (art / "manifest.json").is_file():
        shutil.rmtree(art, ignore_errors=True)
        torch.manual_seed(0)
        BertForMaskedLM(BertConfig(max_position_embeddings=128)).save_pretrained(src)
        tok = hf_tokenizer(default_vocab())
        tok.save_pretrained(src)
        main_export(str(src), str(art), task="fill-mask", opset=17, do_validation=False)
        vocab = tok.get_vocab()
        files = {p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}
                 for p in sorted(art.iterdir()) if p.is_file()}
        manifest = {"format": "sharebert-onnx", "format_version": 1, "task": "fill-mask",
                    "inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": ["logits"], "labels": None,
                    "problem_type": None, "max_length": 128, "opset": 17, "weights": "materialized", "quantization": "none",
                    "session_config": {}, "learned_params": sum(p.numel() for p in BertForMaskedLM(BertConfig()).parameters()),
                    "special_tokens": {k: vocab[t] for k, t in dict(pad="[PAD]", mask="[MASK]", cls="[CLS]", sep="[SEP]",
                                                                   unk="[UNK]").items()}, "files": files}
        (art / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return art


def sharebert_artifacts(out: Path, model: Path | None = None) -> dict[str, Path]:
    """sharebert-small (``model``, else random weights) exported compact fp32 and compact int8 by the real exporter."""
    from sharebert.build import build_model
    from sharebert.export.exporter import export_model

    if model is None:
        model = out / "sharebert-small-model"
        if not (model / "config.json").is_file():
            build_model("sharebert-small", model)
    arts = {}
    for quantize in ("none", "int8"):
        art = out / f"sharebert-small-{quantize}"
        if not (art / "manifest.json").is_file():
            export_model(model, art, task="fill-mask", weights="compact", quantize=quantize, overwrite=True, check_limit=64)
        arts[quantize] = art
    return arts


def measure(path: Path, threads: int, ram: str, reps: int, sentences: list[str]) -> dict:
    """Run one device subprocess; cold start is measured from its spawn to its first result."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps([str(path), threads, ram, reps, sentences])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cold = None
    result = None
    for line in proc.stdout:
        if line.startswith("FIRST") and cold is None:
            cold = time.perf_counter() - t0
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
    err = proc.stderr.read()
    if proc.wait() != 0 or result is None:
        raise RuntimeError(f"device subprocess failed for {path} ({ram}, {threads} threads):\n{err}")
    return {"cold_s": cold, **result}


def ram_parity(path: Path, sentences: list[str]) -> dict:
    """``ram="int8"`` vs ``ram="fp32"`` logits at the real tokens of ``sentences``: agreement and error."""
    import numpy as np

    from sharebert.deploy import Runtime

    fp32, int8 = Runtime(path), Runtime(path, ram="int8")
    ids, mask, _ = fp32._encode(sentences)
    a, b = fp32._run(ids, mask)["logits"], int8._run(ids, mask)["logits"]
    real = mask.astype(bool)
    a, b = a[real], b[real]
    masked = ids[real] == fp32.mask_id
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return {"top1_all": float((a.argmax(-1) == b.argmax(-1)).mean()),
            "top1_mask": float((a[masked].argmax(-1) == b[masked].argmax(-1)).mean()),
            "max_abs": float(np.abs(a - b).max()), "min_cosine": float(cosine.min())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="artifacts/device_bench", help="where the artifacts are built (reused if present)")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per shape (default: 30)")
    ap.add_argument("--model", help="a trained sharebert-small MLM folder (default: random weights); exported into --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sentences = sst2_masked(8)
    small = sharebert_artifacts(out, Path(args.model) if args.model else None)
    rows = [("dense BERT Base fp32", dense_bert_artifact(out), "fp32"),
            ("sharebert-small compact fp32, ram fp32", small["none"], "fp32"),
            ("sharebert-small compact fp32, ram int8", small["none"], "int8"),
            ("sharebert-small int8 file, ram fp32", small["int8"], "fp32"),
            ("sharebert-small int8 file, ram int8", small["int8"], "int8")]
    results = {}
    for threads in (1, 2):
        for name, path, ram in rows:
            results[name, threads] = measure(path, threads, ram, args.reps, sentences)
            r = results[name, threads]
            print(f"measured {name} @ {threads} thread(s): cold {r['cold_s']:.2f} s, peak {r['peak_mb']:.0f} MB", flush=True)

    disk = {name: sum(p.stat().st_size for p in path.iterdir() if p.is_file()) / 1e6 for name, path, _ in rows}
    print("\nAbsolute figures (latency ms p50/p95; 1 and 8 sentences)")
    print(f"{'variant':42s} {'thr':>3s} {'disk MB':>8s} {'cold s':>7s} {'peak MB':>8s} {'RSS MB':>7s} "
          f"{'1: p50/p95':>14s} {'8: p50/p95':>14s}")
    for (name, threads), r in results.items():
        lat = r["latency"]
        print(f"{name:42s} {threads:3d} {disk[name]:8.1f} {r['cold_s']:7.2f} {r['peak_mb']:8.0f} {r['rss_mb']:7.0f} "
              f"{lat['1'][0]:6.1f}/{lat['1'][1]:6.1f} {lat['8'][0]:6.1f}/{lat['8'][1]:6.1f}")
    print("\nRatios vs dense BERT Base at the same thread count (lower is better)")
    print(f"{'variant':42s} {'thr':>3s} {'disk':>6s} {'cold':>6s} {'peak':>6s} {'RSS':>6s} {'p50@1':>6s} {'p95@1':>6s} "
          f"{'p50@8':>6s} {'p95@8':>6s}")
    for (name, threads), r in results.items():
        d = results[rows[0][0], threads]
        ratios = [disk[name] / disk[rows[0][0]], r["cold_s"] / d["cold_s"], r["peak_mb"] / d["peak_mb"], r["rss_mb"] / d["rss_mb"]]
        ratios += [r["latency"][n][i] / d["latency"][n][i] for n in ("1", "8") for i in (0, 1)]
        print(f"{name:42s} {threads:3d} " + " ".join(f"{x:6.2f}" for x in ratios))
    print("\nParity of ram int8 vs ram fp32 (same artifact; 64 SST-2 dev sentences, one [MASK] each)")
    for quantize, path in small.items():
        p = ram_parity(path, sst2_masked(64))
        print(f"sharebert-small {quantize:5s}: top-1 at [MASK] {p['top1_mask']:.3f}, top-1 at all tokens {p['top1_all']:.3f}, "
              f"max |diff| {p['max_abs']:.4f}, min cosine {p['min_cosine']:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
