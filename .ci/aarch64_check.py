"""The two halves of ``.ci/aarch64``'s artifact check: the same artifacts answer on aarch64 as on x86-64.

``record ROOT`` (x86-64, the workstation's venv): exports two tiny artifacts (a fill-mask, compact fp32; a
text-classification, compact ``--quantize int8``) beside the ones ``.ci/aarch64`` put in ``ROOT/artifacts`` (a
compress student and its teacher), then records, for every artifact and RAM mode it has (``fp32``; ``int8`` where
it has RAM-int8 graphs), the token ids of the check texts and every output of the x86-64 runtime on them
(``ROOT/x86/NAME-RAM.npz``).

``compare ROOT`` (aarch64, under emulation, torch-free): the runtime tokenizes the same texts (the ids must be equal)
and runs the same ids; per output it prints ``max_abs_diff``, ``cosine_min`` / ``cosine_mean`` (per row: a sentence
vector, a classifier's logits, a token's states or logits) and ``top1_agreement`` (the class or token; for sentence
vectors each text's nearest other text), writes them to ``ROOT/agreement.json`` and exits 1 when an output falls
outside the artifact's own thresholds for that RAM mode (the manifest's ``reference.thresholds``, which
``sharebert verify`` holds it to against PyTorch).
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np

BATCH = 16  # texts per ONNX Runtime call (the same batches on both sides: the same padding)
SENTENCES = 16  # SST-2 dev sentences, after the short texts below
SHORT = ["ok", "hello world", "", "the capital of france is [MASK].", "a [MASK] movie , and a [MASK] one ."]


def texts() -> list[str]:
    """The check texts: short ones (where int8's answers moved most) and SST-2 dev sentences (or the package's text)."""
    from sharebert.formats.paths import data_path

    sst2 = Path(data_path("glue/SST-2/dev.tsv"))
    rows = [line.split("\t")[0] for line in sst2.read_text(encoding="utf-8").splitlines()[1:]]
    return SHORT + rows[:SENTENCES]


def build_tiny(root: Path) -> None:
    """A tiny fill-mask ShareBERT (compact fp32) and a tiny three-label classifier (compact int8: RAM-int8 graphs)."""
    import torch

    from sharebert import ShareBertForSequenceClassification
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model, config_for_vocab
    from sharebert.formats.paths import default_vocab
    from sharebert.formats.tokenization import hf_tokenizer

    tiny = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
    quick = dict(weights="compact", check_limit=16, runs=3, progress=False, overwrite=True)
    work = root / "work"
    build_model("sharebert-tiny", work / "tiny-mlm", tiny, seed=0)
    # fp32: an untrained fill-mask has near-ties that int8's rounding flips (top-1 0.875 < 0.9 at export)
    export_model(work / "tiny-mlm", root / "artifacts" / "tiny-mlm", task="fill-mask", quantize="none", **quick)

    tokenizer = hf_tokenizer(default_vocab())
    labels = {"num_labels": 3, "id2label": {0: "neg", 1: "neu", 2: "pos"}, "label2id": {"neg": 0, "neu": 1, "pos": 2}}
    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(config_for_vocab("sharebert-tiny", {**tiny, **labels}, len(tokenizer)))
    with torch.no_grad():  # a head large enough that the three classes differ visibly
        model.classifier.weight.normal_(0, 1.0)
    model.save_pretrained(work / "tiny-classifier")
    tokenizer.save_pretrained(work / "tiny-classifier")
    classifier = root / "artifacts" / "tiny-classifier"
    export_model(work / "tiny-classifier", classifier, task="text-classification", quantize="int8", **quick)


def rams(manifest: dict) -> list[str]:
    """The RAM modes the artifact offers: ``fp32`` (the graph as exported), ``int8`` where it has RAM-int8 graphs."""
    return ["fp32", "int8"] if (manifest.get("ram_int8") or {}).get("weights") else ["fp32"]


def outputs(runtime, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Every output of ``runtime`` on ``ids``, ``BATCH`` rows a call, concatenated (padded to the longest row)."""
    calls = [runtime._run(ids[i : i + BATCH], mask[i : i + BATCH]) for i in range(0, len(ids), BATCH)]
    return {name: np.concatenate([c[name] for c in calls]) for name in calls[0]}


def encoded(runtime, items: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ids, mask, _ = runtime._encode(items)
    return ids, mask


def record(root: Path) -> None:
    from sharebert_runtime import Runtime

    build_tiny(root)
    items = texts()
    out = root / "x86"
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for artifact in sorted((root / "artifacts").iterdir()):
        for ram in rams(json.loads((artifact / "manifest.json").read_text(encoding="utf-8"))):
            runtime = Runtime(artifact, ram=ram, threads=1)
            ids, mask = encoded(runtime, items)
            np.savez(
                out / f"{artifact.name}-{ram}.npz", input_ids=ids, attention_mask=mask, **outputs(runtime, ids, mask)
            )
            runs.append({"artifact": artifact.name, "ram": ram})
            print(f"recorded {artifact.name} ram {ram}: {len(items)} texts, {ids.shape[1]} tokens padded")
    (out / "index.json").write_text(json.dumps({"texts": items, "runs": runs}), encoding="utf-8")


def rows(value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``(N, D)`` rows to compare: a token output's real tokens, else the output as it is."""
    return value[mask.astype(bool)] if value.ndim == 3 else value.reshape(len(value), -1)


def top1(task: str, value: np.ndarray) -> np.ndarray:
    """The predicted class or token per row; for sentence vectors each row's nearest other row (by cosine)."""
    if task != "feature-extraction":
        return value.argmax(-1)
    unit = value / np.maximum(np.linalg.norm(value, axis=-1, keepdims=True), 1e-30)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(-1)


def figures(task: str, want: np.ndarray, got: np.ndarray) -> dict:
    want, got = want.astype(np.float64), got.astype(np.float64)
    den = np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1)
    cos = np.where(den > 0, (want * got).sum(-1) / np.maximum(den, 1e-30), 1.0)  # two zero rows agree
    return {
        "rows": int(len(want)),
        "max_abs_diff": float(np.abs(want - got).max()),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
        "top1_agreement": float((top1(task, want) == top1(task, got)).mean()),
    }


def outside(f: dict, limits: dict) -> list[str]:
    """The figures outside ``limits`` (``top1``, ``cosine``: least; ``max_abs_diff``: most); NaN is outside."""
    checks = (("top1_agreement", "top1", 1), ("cosine_mean", "cosine", 1), ("max_abs_diff", "max_abs_diff", -1))
    return [
        f"{name} {f[name]:.4g} {'<' if sign > 0 else '>'} {limits[key]:g}"
        for name, key, sign in checks
        if key in limits and not f[name] * sign >= limits[key] * sign
    ]


def compare_one(artifact: Path, ram: str, x86: dict, items: list[str]) -> dict:
    from sharebert_runtime import Runtime

    runtime = Runtime(artifact, ram=ram, threads=1)
    ids, mask = encoded(runtime, items)
    if not (ids.shape == x86["input_ids"].shape and (ids == x86["input_ids"]).all()):
        return {"artifact": artifact.name, "ram": ram, "below": ["token ids differ from x86-64's"], "outputs": {}}
    got = outputs(runtime, ids, mask)
    limits = ((runtime.manifest.get("reference") or {}).get("thresholds") or {}).get(ram)
    quantization = runtime.manifest.get("quantization")
    result = {"artifact": artifact.name, "task": runtime.task, "quantization": quantization, "ram": ram}
    result.update(thresholds=limits, outputs={})
    below = [] if limits else [f"the manifest holds no reference thresholds for ram {ram}"]
    for name, value in got.items():
        f = figures(runtime.task, rows(x86[name], mask), rows(value, mask))
        result["outputs"][name] = f
        below += [f"{name}: {b}" for b in outside(f, limits or {})]
    result["below"] = below
    return result


def compare(root: Path) -> int:
    index = json.loads((root / "x86" / "index.json").read_text(encoding="utf-8"))
    items, results = index["texts"], []
    for run in index["runs"]:
        with np.load(root / "x86" / f"{run['artifact']}-{run['ram']}.npz") as data:
            x86 = dict(data)
        results.append(compare_one(root / "artifacts" / run["artifact"], run["ram"], x86, items))
        print_result(results[-1])
    (root / "agreement.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    failed = [f"{r['artifact']} ram {r['ram']}" for r in results if r["below"]]
    print(
        f"{platform.machine()} vs x86-64 on {len(items)} texts: "
        + (f"FAIL ({', '.join(failed)})" if failed else "PASS")
    )
    return 1 if failed else 0


def print_result(r: dict) -> None:
    for name, f in r["outputs"].items():
        print(
            f"{r['artifact']:<16} ram {r['ram']:<4} {name:<18} rows {f['rows']:>5}  "
            f"max_abs_diff {f['max_abs_diff']:.3g}  "
            f"cosine min {f['cosine_min']:.7f} mean {f['cosine_mean']:.7f}  top1 {f['top1_agreement']:.4f}"
        )
    if r["below"]:
        print(f"{r['artifact']} ram {r['ram']}: BELOW its thresholds {r.get('thresholds')}: {'; '.join(r['below'])}")


def verify(root: Path) -> int:
    """``sharebert verify`` (:meth:`Runtime.verify`, printed as the command prints it) on every recorded artifact
    and RAM mode. A mode below its thresholds fails unless its figures at export, on x86-64, were below them too
    (the artifact's own parity, not this CPU: an untrained fill-mask's near-ties in RAM int8)."""
    from sharebert_runtime import Runtime
    from sharebert_runtime.reference import below, report

    failed = []
    for run in json.loads((root / "x86" / "index.json").read_text(encoding="utf-8"))["runs"]:
        result = Runtime(root / "artifacts" / run["artifact"], ram=run["ram"], threads=1).verify()
        print(report(result))
        if result["passed"]:
            continue
        at_export = [below(f["at_export"] or {}, result["thresholds"]) for f in result["outputs"].values()]
        if all(at_export):
            print(f"(not counted: {run['artifact']} ram {run['ram']} was below its thresholds at export on x86-64 too)")
        else:
            failed.append(f"{run['artifact']} ram {run['ram']}")
    print(f"sharebert verify on {platform.machine()}: " + (f"FAIL ({', '.join(failed)})" if failed else "PASS"))
    return 1 if failed else 0


COMMANDS = {"record": record, "compare": compare, "verify": verify}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in COMMANDS:
        print(f"usage: aarch64_check.py {{{','.join(COMMANDS)}}} ROOT", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](Path(argv[1])) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
