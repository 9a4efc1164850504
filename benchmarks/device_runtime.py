"""Device figures for the torch-free runtime, as ratios against dense BERT Base measured in the same run.

Artifacts (random weights unless ``--model`` names a trained sharebert-small; time and memory do not
depend on the weights, the int8 parity does):

* dense ``transformers`` ``BertForMaskedLM`` (BERT Base shape) exported plainly by ``torch.onnx``
  (``sharebert.export.torch_onnx.export_folder``: the graph optimum's ``main_export`` writes), fp32,
  and that graph through the exporter's int8-dynamic quantizer (``quantize_dynamic``, int8 MatMuls);
* ``sharebert-small`` fill-mask exported compact (fp32 file) and with int8-stored tensors, run with
  ``ram="fp32"`` (ONNX Runtime folds the generated weights to fp32) and ``ram="int8"`` (made a few rows
  at a time, held as int8, dynamic-int8 MatMuls).

Each row is a fresh subprocess in which importing torch/transformers/optimum/onnx raises (a device):
cold start (spawn to first result), peak RSS at load, steady RSS (after the one-sentence runs), p50/p95
of ``fill_mask`` on one SST-2 dev sentence with a ``[MASK]`` at each ``--depths`` (layer-shared
artifacts), and sentences/s over ``--throughput`` SST-2 dev sentences in three batching modes: grouped
by length (the runtime's default), calls in input order (no grouping), every input padded to 128.
The last lines check the device goal: sharebert-small int8 at depth 4 no slower than BERT Base fp32 for
one sentence, at <= 0.25x its peak RSS.

    python benchmarks/device_runtime.py [--model runs/small-pretrained] [--out artifacts/device_bench] [--reps 30]
"""

from __future__ import annotations

import argparse
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

CHILD = (
    BLOCK
    + """
import json, time
import numpy as np
from sharebert_runtime import Runtime
spec = json.loads(sys.argv[1])
def status():  # /proc VmHWM, not getrusage: ru_maxrss survives exec and would report the parent's peak
    return {l.split(":")[0]: int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("Vm")}
rt = Runtime(spec["path"], threads=spec["threads"], ram=spec["ram"])
peak_load = status()["VmHWM"]
one = spec["sentences"][:1]
rt.fill_mask(one)
print("FIRST", flush=True)
depths = [d for d in spec["depths"] if rt.max_depth and d <= rt.max_depth] or [None]
latency = {}
for d in depths:
    view = rt.at_depth(d)
    for _ in range(3):
        view.fill_mask(one)
    times = []
    for _ in range(spec["reps"]):
        t = time.perf_counter()
        view.fill_mask(one)
        times.append(time.perf_counter() - t)
    latency[d or rt.max_depth or 12] = (float(np.percentile(times, 50)) * 1e3, float(np.percentile(times, 95)) * 1e3)
steady = status()["VmRSS"]
pad = rt._pad
def padded(rows):  # every input padded to the maximum length, as a fixed-shape export runs
    ids, mask = pad(rows)
    width = ((0, 0), (0, rt.max_length - ids.shape[1]))
    return np.pad(ids, width, constant_values=rt.pad_id), np.pad(mask, width)
modes = {"grouped": (True, pad), "input order": (False, pad), "pad to 128": (False, padded)}
texts, rates = spec["throughput"], {m: [] for m in modes}
for r in range(spec["throughput_repeats"]):
    for mode in list(modes)[r % 3:] + list(modes)[: r % 3]:  # each mode takes each place in turn
        rt.group_by_length, rt._pad = modes[mode]
        t = time.perf_counter()
        rt.fill_mask(texts)
        rates[mode].append(len(texts) / (time.perf_counter() - t))
print("RESULT " + json.dumps({"latency": latency, "peak_load_mb": peak_load, "steady_mb": steady,
                              "rates": {m: float(np.median(v)) for m, v in rates.items()},
                              "peak_mb": status()["VmHWM"]}),
      flush=True)
"""
)


def sst2_masked(n: int = 8) -> list[str]:
    """The first ``n`` SST-2 dev sentences with their third word replaced by ``[MASK]``."""
    from sharebert.formats.paths import data_path

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


def dense_bert_artifacts(out: Path) -> dict[str, Path]:
    """BERT Base (random weights) exported plainly by ``torch.onnx`` (fp32), and the same graph through the
    exporter's int8-dynamic quantizer; each with a sharebert manifest so the same runtime runs it."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from sharebert.export.quantize import dynamic_int8
    from sharebert.export.torch_onnx import export_folder
    from sharebert.formats.paths import default_vocab
    from sharebert.formats.tokenization import hf_tokenizer
    from sharebert_runtime.artifact import sha256

    src, arts = (
        out / "bert-base-model",
        {"fp32": out / "bert-base-onnx", "int8-dynamic": out / "bert-base-int8-dynamic"},
    )
    tok = hf_tokenizer(default_vocab())
    if not (arts["fp32"] / "manifest.json").is_file():
        shutil.rmtree(arts["fp32"], ignore_errors=True)
        torch.manual_seed(0)
        BertForMaskedLM(BertConfig(max_position_embeddings=128)).save_pretrained(src)
        tok.save_pretrained(src)
        export_folder(src, arts["fp32"], "fill-mask")
    if not (arts["int8-dynamic"] / "manifest.json").is_file():
        shutil.rmtree(arts["int8-dynamic"], ignore_errors=True)
        shutil.copytree(
            arts["fp32"], arts["int8-dynamic"], ignore=shutil.ignore_patterns("model.onnx", "manifest.json")
        )
        dynamic_int8(arts["fp32"] / "model.onnx", arts["int8-dynamic"] / "model.onnx")
    vocab = tok.get_vocab()
    learned = sum(p.numel() for p in BertForMaskedLM(BertConfig()).parameters())
    for quantization, art in arts.items():
        if (art / "manifest.json").is_file():
            continue
        files = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(art.iterdir()) if p.is_file()}
        manifest = {
            "format": "sharebert-onnx",
            "format_version": 1,
            "task": "fill-mask",
            "inputs": ["input_ids", "attention_mask", "token_type_ids"],
            "outputs": ["logits"],
            "labels": None,
            "problem_type": None,
            "max_length": 128,
            "opset": 17,
            "weights": "materialized",
            "quantization": "none" if quantization == "fp32" else quantization,
            "session_config": {},
            "learned_params": learned,
            "files": files,
            "special_tokens": {
                k: vocab[t] for k, t in dict(pad="[PAD]", mask="[MASK]", cls="[CLS]", sep="[SEP]", unk="[UNK]").items()
            },
        }
        (art / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return arts


def sharebert_artifacts(out: Path, model: Path | None = None) -> dict[str, Path]:
    """sharebert-small (``model``, else random weights) exported compact fp32 and compact int8 by the real exporter."""
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model

    if model is None:
        model = out / "sharebert-small-model"
        if not (model / "config.json").is_file():
            build_model("sharebert-small", model)
    arts = {}
    for quantize in ("none", "int8"):
        art = out / f"sharebert-small-{quantize}"
        if not (art / "manifest.json").is_file():
            export_model(
                model, art, task="fill-mask", weights="compact", quantize=quantize, overwrite=True, check_limit=64
            )
        arts[quantize] = art
    return arts


def measure(spec: dict) -> dict:
    """Run one device subprocess on ``spec`` (see ``CHILD``); cold start is its spawn to its first result."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    cold, result = None, None
    for line in proc.stdout:
        if line.startswith("FIRST") and cold is None:
            cold = time.perf_counter() - t0
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
    err = proc.stderr.read()
    if proc.wait() != 0 or result is None:
        raise RuntimeError(
            f"device subprocess failed for {spec['path']} ({spec['ram']}, {spec['threads']} threads):\n{err}"
        )
    return {"cold_s": cold, **result}


def ram_parity(path: Path, sentences: list[str]) -> dict:
    """``ram="int8"`` vs ``ram="fp32"`` logits at the real tokens of ``sentences``: agreement and error."""
    import numpy as np

    from sharebert_runtime import Runtime

    fp32, int8 = Runtime(path), Runtime(path, ram="int8")
    ids, mask, _ = fp32._encode(sentences)
    a, b = fp32._run(ids, mask)["logits"], int8._run(ids, mask)["logits"]
    real = mask.astype(bool)
    a, b = a[real], b[real]
    masked = ids[real] == fp32.mask_id
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return {
        "top1_all": float((a.argmax(-1) == b.argmax(-1)).mean()),
        "top1_mask": float((a[masked].argmax(-1) == b[masked].argmax(-1)).mean()),
        "max_abs": float(np.abs(a - b).max()),
        "min_cosine": float(cosine.min()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="artifacts/device_bench", help="where the artifacts are built (reused if present)")
    ap.add_argument("--reps", type=int, default=30, help="timed one-sentence calls per depth (default: 30)")
    ap.add_argument(
        "--model", help="a trained sharebert-small MLM folder (default: random weights); exported into --out"
    )
    ap.add_argument("--depths", type=int, nargs="+", default=[12, 8, 4, 2], help="depths timed (default: 12 8 4 2)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="ONNX Runtime threads (default: 1)")
    ap.add_argument(
        "--throughput", type=int, default=256, help="SST-2 dev sentences per throughput pass (default: 256)"
    )
    ap.add_argument("--throughput-repeats", type=int, default=3, help="passes per batching mode (default: 3)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sentences, texts = sst2_masked(1), sst2_masked(args.throughput)
    dense = dense_bert_artifacts(out)
    small = sharebert_artifacts(out, Path(args.model) if args.model else None)
    base = "dense BERT Base fp32"
    rows = [
        (base, dense["fp32"], "fp32"),
        ("dense BERT Base int8-dynamic", dense["int8-dynamic"], "fp32"),
        ("sharebert-small fp32 file, ram fp32", small["none"], "fp32"),
        ("sharebert-small fp32 file, ram int8", small["none"], "int8"),
        ("sharebert-small int8 file, ram int8", small["int8"], "int8"),
    ]
    results = {}
    for threads in args.threads:
        for name, path, ram in rows:
            spec = {
                "path": str(path),
                "threads": threads,
                "ram": ram,
                "reps": args.reps,
                "depths": args.depths,
                "sentences": sentences,
                "throughput": texts,
                "throughput_repeats": args.throughput_repeats,
            }
            r = results[name, threads] = measure(spec)
            print(
                f"measured {name} @ {threads} thread(s): cold {r['cold_s']:.2f} s, "
                f"peak at load {r['peak_load_mb']:.0f} MB",
                flush=True,
            )

    disk = {name: sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6 for name, path, _ in rows}
    print(
        "\nMemory and start (peak RSS at load; steady = RSS after the one-sentence runs; "
        "ratios vs dense BERT Base fp32)"
    )
    print(
        f"{'variant':38s} {'thr':>3s} {'disk MB':>8s} {'cold s':>7s} {'peak MB':>8s} {'steady MB':>9s} {'peak x':>7s} "
        f"{'steady x':>8s}"
    )
    for (name, threads), r in results.items():
        d = results[base, threads]
        print(
            f"{name:38s} {threads:3d} {disk[name]:8.1f} {r['cold_s']:7.2f} {r['peak_load_mb']:8.0f} "
            f"{r['steady_mb']:9.0f} {r['peak_load_mb'] / d['peak_load_mb']:7.2f} {r['steady_mb'] / d['steady_mb']:8.2f}"
        )
    print("\nOne sentence, p50 ms (p95) by depth, and p50 ratio vs dense BERT Base fp32 (12 layers)")
    for (name, threads), r in results.items():
        d = results[base, threads]["latency"]["12"][0]
        cells = [f"depth {k}: {p50:6.1f} ({p95:6.1f}) x{p50 / d:4.2f}" for k, (p50, p95) in r["latency"].items()]
        print(f"{name:38s} {threads:3d}  " + "  ".join(cells))
    print(f"\nSentences/s over {len(texts)} SST-2 dev sentences (median of {args.throughput_repeats} passes per mode)")
    print(f"{'variant':38s} {'thr':>3s} {'grouped':>8s} {'input order':>11s} {'pad 128':>8s} {'grouped/pad':>11s}")
    for (name, threads), r in results.items():
        rate = r["rates"]
        print(
            f"{name:38s} {threads:3d} {rate['grouped']:8.1f} {rate['input order']:11.1f} {rate['pad to 128']:8.1f} "
            f"{rate['grouped'] / rate['pad to 128']:11.2f}"
        )
    print("\nGoal (issue 13): sharebert-small int8 at depth 4 no slower than dense BERT Base fp32 for one sentence,")
    print("at <= 0.25x its peak RSS")
    for threads in args.threads:
        d = results[base, threads]
        for name in ("sharebert-small fp32 file, ram int8", "sharebert-small int8 file, ram int8"):
            r = results[name, threads]
            if "4" not in r["latency"]:
                continue
            speed, memory = r["latency"]["4"][0] / d["latency"]["12"][0], r["peak_load_mb"] / d["peak_load_mb"]
            print(
                f"{name} @ {threads} thread(s): p50 x{speed:.2f} ({'met' if speed <= 1.0 else 'NOT met'}), "
                f"peak RSS x{memory:.2f} ({'met' if memory <= 0.25 else 'NOT met'})"
            )
    print("\nParity of ram int8 vs ram fp32 (same artifact; 64 SST-2 dev sentences, one [MASK] each)")
    for quantize, path in small.items():
        p = ram_parity(path, sst2_masked(64))
        print(
            f"sharebert-small {quantize:5s}: top-1 at [MASK] {p['top1_mask']:.3f}, "
            f"top-1 at all tokens {p['top1_all']:.3f}, max |diff| {p['max_abs']:.4f}, min cosine {p['min_cosine']:.5f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
