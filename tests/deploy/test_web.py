"""`sharebert export --format web` in JavaScript: transformers.js in Node (examples/web/node.mjs, onnxruntime-node)
and in headless Chromium (examples/web/index.html served from 127.0.0.1, onnxruntime-web's WASM backend, driven by
browser.mjs with puppeteer-core) gives the Python runtime's embeddings, labels and token ids on the same folder.

The `web` tier (`make test-web`: `npm ci` in examples/web from its lock, then `pytest -m web`); skipped, in one line,
where node, examples/web/node_modules or (for the browser tests) Chromium is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx
import pytest

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert_runtime import Runtime
from sharebert_runtime.artifact import MANIFEST

pytestmark = [pytest.mark.web, pytest.mark.slow]

WEB = Path(__file__).resolve().parents[2] / "examples" / "web"
NODE_TIMEOUT_S = 300  # a hung process fails the test instead of hanging the suite
BROWSER_TIMEOUT_S = 600  # browser.mjs bounds each of its own waits (SHAREBERT_WEB_WAIT_MS, 120 s) and its whole run
PAGE_FILES = ("index.html", "app.mjs", "sharebert.mjs", "sentences.json")
QUERY = "a charming and funny film"
SCREENSHOT_TO = "SHAREBERT_WEB_SCREENSHOT"  # where the search page's screenshot is copied (docs/web_search.png)
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=2,
    embedding_size=16,
    max_position_embeddings=64,
)
QUICK = dict(check_limit=16, runs=3, progress=False, shapes=("1x16",))
SENTENCES = 50
# the empty string, 10,000 characters, emoji, mixed scripts, control characters, ... (the benchmark's too)
HOSTILE = json.loads((WEB / "hostile.json").read_text(encoding="utf-8"))


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the web tier needs Node 20 and `npm ci` in examples/web")
    if not (WEB / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip("examples/web/node_modules is missing: run `make test-web` (npm ci from examples/web's lock)")
    return node


def _sentence_model(folder: Path) -> None:
    """A tiny ShareBERT sentence model: mean pooling, a Dense layer with tanh, normalisation, lower-casing."""
    from sharebert import ShareBertModel
    from sharebert.formats.recipe import DenseLayer, EmbeddingRecipe, write_recipe

    # 128 positions: compress's exports (export_once) time sequences of 128 tokens, as a real student reads
    build_model("sharebert-tiny", folder, {**TINY, "max_position_embeddings": 128}, seed=0)
    ShareBertModel.from_pretrained(folder).save_pretrained(folder)
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(24, 64)).astype(np.float32) * 0.2, rng.normal(size=24).astype(np.float32)
    tanh = DenseLayer("", 64, 24, True, "torch.nn.modules.activation.Tanh")
    write_recipe(folder, EmbeddingRecipe("mean", True, (tanh,), 48, True), [(w, b)])


def _classifier(folder: Path, sentences: list[str]) -> None:
    """A tiny ShareBERT classifier (random head) whose bias puts the widest gap between the middle half of the
    sentences' margins at zero: both labels occur, no sentence on the fence."""
    import torch
    from transformers import AutoTokenizer

    from sharebert import ShareBertForSequenceClassification

    build_model("sharebert-tiny", folder, TINY, seed=1)
    labels = {0: "negative", 1: "positive"}
    model = ShareBertForSequenceClassification.from_pretrained(
        folder, num_labels=2, id2label=labels, label2id={v: k for k, v in labels.items()}
    ).eval()
    enc = AutoTokenizer.from_pretrained(folder)(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    margins = np.sort((logits[:, 1] - logits[:, 0]).numpy())
    middle = margins[len(margins) // 4 : 3 * len(margins) // 4]
    gap = int(np.argmax(np.diff(middle)))
    with torch.no_grad():
        model.classifier.bias[1] -= float(middle[gap] + middle[gap + 1]) / 2
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def texts() -> dict:
    lines = data_path("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : SENTENCES + 1]
    return {"sentences": [line.split("\t")[0].strip() for line in lines], "hostile": HOSTILE}


@pytest.fixture(scope="module")
def web(tmp_path_factory, texts, minilm_dir):
    """The web folders under one models root (the student and the all-MiniLM-L6-v2 teacher, int8, the student's int8
    artifact beside; the classifier, fp32) and ``run(name) -> node.mjs's report``."""
    node = _node()
    root = tmp_path_factory.mktemp("web")
    models = root / "models"
    _sentence_model(root / "student")
    _classifier(root / "classifier", texts["sentences"])
    export_model(root / "student", root / "student_int8", quantize="int8", **QUICK)
    for name, source in (("student", root / "student"), ("teacher", minilm_dir)):
        export_model(source, models / name, quantize="int8", format="web", **QUICK)
    # fp32 (onnx/model.onnx): the random head's margins are within int8's rounding of PyTorch's
    export_model(root / "classifier", models / "classifier", format="web", **QUICK)
    (root / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    reports = {}

    def run(name: str) -> dict:
        if name not in reports:
            out = root / f"{name}.json"
            done = subprocess.run(
                [node, "node.mjs", "--models", str(models), "--model", name, "--texts", str(root / "texts.json")]
                + ["--out", str(out)],
                cwd=WEB,
                capture_output=True,
                text=True,
                timeout=NODE_TIMEOUT_S,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            reports[name] = json.loads(out.read_text(encoding="utf-8"))
        return reports[name]

    return {"root": root, "models": models, "run": run, "node": node, "texts": root / "texts.json"}


class _QuietFiles(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".wasm": "application/wasm"}

    def log_message(self, *args):  # the test's output is the browser's, not one line per file served
        pass


@pytest.fixture(scope="module")
def browser(web):
    """``run(query) -> browser.mjs's completed process``: the page (examples/web, the models and node_modules beside
    it, as on a static host) served from 127.0.0.1 by http.server in this process; and ``check(name) -> report``."""
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).is_file():
        pytest.skip(f"no Chromium at {chromium}: apt-get install chromium (or set CHROMIUM) for the browser tests")
    if not (WEB / "node_modules" / "puppeteer-core").is_dir():
        pytest.skip("examples/web/node_modules has no puppeteer-core: run `make test-web`")
    site = web["root"] / "site"
    site.mkdir()
    for name in PAGE_FILES:
        (site / name).symlink_to(WEB / name)
    (site / "node_modules").symlink_to(WEB / "node_modules")
    (site / "models").symlink_to(web["models"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietFiles, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    reports = {}

    def run(query: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [web["node"], "browser.mjs", "--url", f"{url}?{query}", "--texts", str(web["texts"]), *argv],
            cwd=WEB,
            capture_output=True,
            text=True,
            timeout=BROWSER_TIMEOUT_S,
            env={**os.environ, "CHROMIUM": chromium},
        )

    def check(name: str) -> dict:
        if name not in reports:
            out = web["root"] / f"{name}.browser.json"
            done = run(f"model={name}&check", "--out", str(out))
            assert done.returncode == 0, done.stderr[-2000:]
            reports[name] = json.loads(out.read_text(encoding="utf-8"))
        return reports[name]

    yield {"run": run, "check": check}
    server.shutdown()
    server.server_close()


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_the_folder_is_transformers_js_layout_within_a_tenth_of_the_int8_artifact(web):
    folder = web["models"] / "student"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "config.json",
        MANIFEST,
        "onnx/model_quantized.onnx",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["sharebert_model_type"]) == ("bert", "sharebert")
    assert config["transformers.js_config"] == {"dtype": "q8"}
    assert config["sharebert"]["embedding"]["normalize"] is True
    graph = onnx.load(str(folder / "onnx" / "model_quantized.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]  # no depth
    assert {n.op_type for n in graph.node}.isdisjoint({"If", "DequantizeLinear"})
    assert _folder_bytes(folder) <= 1.1 * _folder_bytes(web["root"] / "student_int8")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["web"]["parity_vs_onnx"]["max_abs_diff"] <= 1e-5


def test_runtime_embed_normalize_false_and_verify_on_a_web_folder_use_the_raw_vector(web, texts, tmp_path):
    sentences = texts["sentences"][:8]
    folder, artifact = Runtime(web["models"] / "student"), Runtime(web["root"] / "student_int8", ram="fp32")
    for normalize in (None, False):  # the same graph: the web one normalises inside, keeping the vector before
        got = np.array(folder.embed(sentences, normalize=normalize))
        want = np.array(artifact.embed(sentences, normalize=normalize))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, atol=1e-5)
    raw = np.linalg.norm(np.array(folder.embed(sentences, normalize=False)), axis=1)
    assert np.isfinite(raw).all() and np.abs(raw - 1).min() > 0.01  # not unit vectors: the raw ones
    checked = folder.verify()  # the stored reference is PyTorch's raw vector: compared with the raw output
    figures = checked["outputs"]["sentence_embedding"]
    assert checked["passed"]
    assert figures["max_abs_diff"] == pytest.approx(figures["at_export"]["max_abs_diff"], abs=1e-5)
    older = tmp_path / "older"  # a web folder whose graph keeps no vector before its Normalize
    shutil.copytree(web["models"] / "student", older)
    manifest = json.loads((older / MANIFEST).read_text())
    del manifest["web"]["unnormalized_output"]
    (older / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="normalize=False needs the folder exported again"):
        Runtime(older).embed(sentences, normalize=False)


def test_compress_web_publishes_the_folder_beside_the_artifact_sealed_and_exported_once(web, texts, tmp_path):
    """`compress --web`'s step (out_folder.publish_web) on a compress-like --out: the folder is one of the run's parts
    (--overwrite sets it aside with the others), the sealed marker lists its files and vouches for them, it is within
    a tenth of the int8 artifact and gives its embeddings, and a resumed run finding it newer than the student does
    not export it again."""
    from sharebert.pipelines.out_folder import COMMAND, PARTS, WEB, publish_web
    from sharebert_runtime.outdir import mark_out, read_mark, seal_out, unlisted, vouched

    out = tmp_path / "run"
    mark_out(out, COMMAND, {"run": "test"})
    shutil.copytree(web["root"] / "student_int8", out / "artifact")
    entry = publish_web(web["root"] / "student", out, out / "artifact", False, "feature-extraction", False)
    seal_out(out)
    assert WEB in PARTS and entry["folder"] == WEB and entry["model"] == "onnx/model_quantized.onnx"
    assert entry["bytes"] == _folder_bytes(out / WEB) <= 1.1 * entry["artifact_bytes"]
    mark = read_mark(out)
    assert {f"{WEB}/onnx/model_quantized.onnx", f"{WEB}/{MANIFEST}"} <= set(mark["files"])
    assert vouched(out, mark) is None and unlisted(out) == []
    sentences = texts["sentences"][:8]
    got, want = Runtime(out / WEB).embed(sentences), Runtime(out / "artifact", ram="fp32").embed(sentences)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
    written = (out / WEB / MANIFEST).stat().st_mtime_ns
    publish_web(web["root"] / "student", out, out / "artifact", False, "feature-extraction", False)
    assert (out / WEB / MANIFEST).stat().st_mtime_ns == written


@pytest.mark.parametrize("name", ["student", "teacher"])
def test_node_embeddings_and_token_ids_are_the_python_runtimes(web, texts, name):
    _assert_embeddings_and_ids(web["run"](name), web["models"] / name, texts, name)


@pytest.mark.parametrize("name", ["student", "teacher"])
def test_chromium_embeddings_and_token_ids_are_the_python_runtimes(web, browser, texts, name):
    report = browser["check"](name)
    assert "onnxruntime-web wasm" in report["runtime"]
    _assert_embeddings_and_ids(report, web["models"] / name, texts, name)


def test_chromium_classifier_labels_are_the_python_runtimes(web, browser, texts):
    report = browser["check"]("classifier")
    runtime = Runtime(web["models"] / "classifier")
    want = [p["label"] for p in runtime.classify(texts["sentences"])]
    assert report["labels"] == want and report["pipeline_labels"] == want
    assert report["hostile_labels"] == [p["label"] for p in runtime.classify(texts["hostile"])]


def test_the_search_page_ranks_the_sentences_and_its_screenshot_is_a_small_png(web, browser, tmp_path):
    shot = tmp_path / "search.png"
    done = browser["run"](
        "model=teacher", "--out", str(tmp_path / "r.json"), "--query", QUERY, "--screenshot", str(shot)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 300_000
    search = json.loads((tmp_path / "r.json").read_text())["search"]
    assert len(search["results"]) == 8 and search["error"] == ""
    assert search["empty_query_results"] == 0  # the emptied box: no ranking, and the page still answers
    if os.environ.get(SCREENSHOT_TO):  # `make web-screenshot`: the picture docs/DEVICE.md shows
        shutil.copyfile(shot, os.environ[SCREENSHOT_TO])


def _corrupt(web) -> str:
    """A copy of the student's web folder whose graph is cut to its first 1,000 bytes, beside the others."""
    folder = web["models"] / "corrupt"
    if not folder.is_dir():
        shutil.copytree(web["models"] / "student", folder)
        graph = folder / "onnx" / "model_quantized.onnx"
        graph.write_bytes(graph.read_bytes()[:1000])
    return folder.name


@pytest.mark.parametrize("model, fragment", [("absent", ""), ("corrupt", "protobuf parsing failed")])
def test_a_page_whose_model_is_missing_or_damaged_says_so_in_one_line(web, browser, tmp_path, model, fragment):
    if model == "corrupt":
        _corrupt(web)
    done = browser["run"](f"model={model}", "--out", str(tmp_path / "r.json"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "the page could not load its model" in done.stderr
    assert fragment in done.stderr


def test_node_on_a_damaged_graph_is_one_line_exit_1(web):
    done = subprocess.run(
        [web["node"], "node.mjs", "--models", str(web["models"]), "--model", _corrupt(web)]
        + ["--texts", str(web["texts"]), "--out", "/dev/null"],
        cwd=WEB,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "corrupt: its graph could not be loaded" in done.stderr
    assert "Protobuf parsing failed" in done.stderr


def _cosines(want, got) -> np.ndarray:
    want, got = np.array(want, dtype=np.float64), np.array(got, dtype=np.float64)
    assert got.shape == want.shape and np.isfinite(got).all()
    return (want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)


def _assert_embeddings_and_ids(report: dict, folder: Path, texts: dict, name: str) -> None:
    runtime = Runtime(folder)
    want = np.array(runtime.embed(texts["sentences"]), dtype=np.float64)
    cosine = _cosines(want, report["embeddings"])
    assert cosine.min() >= 0.999, cosine.min()
    hostile = _cosines(runtime.embed(texts["hostile"]), report["hostile_embeddings"])  # "", 10,000 characters, ...
    assert hostile.min() >= 0.999, (hostile.min(), texts["hostile"][int(hostile.argmin())][:40])
    got = np.array(report["embeddings"], dtype=np.float64)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the recipe's Normalize, in the graph
    lower = runtime.manifest["embedding"]["do_lower_case"]  # embed() lower-cases before the tokenizer, as node.mjs
    ids, _ = runtime._tokenized([t.lower() if lower else t for t in texts["sentences"] + texts["hostile"]])
    assert report["token_ids"] + report["hostile_token_ids"] == ids
    if name == "teacher":  # mean pooling and Normalize only: the pipeline's own options reproduce the recipe
        pipeline = np.array(report["pipeline_embeddings"], dtype=np.float64)
        assert np.isfinite(pipeline).all()
        assert ((want * pipeline).sum(1) / np.linalg.norm(pipeline, axis=1)).min() >= 0.999


def test_node_classifier_labels_are_the_python_runtimes(web, texts):
    report = web["run"]("classifier")
    runtime = Runtime(web["models"] / "classifier")
    want = [p["label"] for p in runtime.classify(texts["sentences"])]
    assert report["labels"] == want
    assert report["hostile_labels"] == [p["label"] for p in runtime.classify(texts["hostile"])]
    assert report["pipeline_labels"] == want
    assert len(set(want)) == 2  # both labels occur: equal labels are not a constant answer


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "absent"], "is not a folder"),
        (["--model", "student", "--texts", "/nonexistent.json"], "/nonexistent.json"),
        (["--model"], "usage: node node.mjs"),
    ],
)
def test_node_bad_input_is_one_line_and_exit_2(web, args, message):
    base = {"--models": str(web["models"]), "--texts": str(web["root"] / "texts.json"), "--out": "/dev/null"}
    given = dict(zip(args[::2], args[1::2]))
    argv = [x for k, v in {**base, **given}.items() for x in (k, v)] if len(args) % 2 == 0 else args
    done = subprocess.run(
        [web["node"], "node.mjs", *argv], cwd=WEB, capture_output=True, text=True, timeout=NODE_TIMEOUT_S
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr and done.stderr.startswith("node.mjs: error:")


def test_a_folder_that_is_no_web_export_is_refused_in_one_line(web):
    models = web["root"] / "plain"
    models.mkdir(exist_ok=True)
    if not (models / "student_int8").exists():
        (models / "student_int8").symlink_to(web["root"] / "student_int8")
    done = subprocess.run(
        [web["node"], "node.mjs", "--models", str(models), "--model", "student_int8"]
        + ["--texts", str(web["root"] / "texts.json"), "--out", "/dev/null"],
        cwd=WEB,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and 'has no "sharebert" entry' in done.stderr


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--quantize", "int8-dynamic"], "--format web is checked with onnxruntime-web"),
        (["--quantize", "fp16"], "got --quantize fp16"),
        (["--optimize"], "--optimize applies ONNX Runtime's fp32 encoder fusions"),
    ],
)
def test_web_export_of_what_was_not_checked_is_one_line_exit_2(tmp_path, capsys, argv, fragment):
    from sharebert_runtime.main import main

    _sentence_model(tmp_path / "model")
    code = main(
        ["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "web"), "--format", "web", *argv]
    )
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "web").exists()
