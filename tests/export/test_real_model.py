"""A real pre-trained model (all-MiniLM-L6-v2, a sentence-transformers folder: mean pooling, Normalize,
max_seq_length 256) through export and the device runtime: parity with transformers at every
quantization, and the artifact's default embeddings score STS-B as sentence-transformers does."""

import csv
import json

import numpy as np
import pytest
import torch

from sharebert.formats.paths import data_path
from sharebert_runtime import Runtime

STSB_PAIRS = 500  # the first pairs of STS-B dev (the benchmark scores all 1,500)
QUANTIZATIONS = ("none", "int8", "int8-dynamic")


@pytest.fixture(scope="session")
def minilm_artifact(minilm_dir, tmp_path_factory):
    """One exported artifact per quantization, made on first use and shared by every test."""
    from sharebert.export.exporter import export_model

    made = {}

    def get(quantize: str):
        if quantize not in made:
            out = tmp_path_factory.mktemp("minilm") / quantize
            manifest = export_model(
                minilm_dir, out, quantize=quantize, check_limit=16, runs=1, shapes=("1x8",), progress=False
            )
            made[quantize] = out, manifest
        return made[quantize]

    return get


@pytest.fixture(scope="session")
def stsb():
    with open(data_path("glue", "STS-B", "dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:STSB_PAIRS]
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], np.array([float(r["score"]) for r in rows])


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).correlation)


def cosine_scores(first, second) -> np.ndarray:
    a, b = np.stack(first), np.stack(second)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="session")
def torch_reference(minilm_dir, stsb):
    """sentence-transformers' own embeddings of the STS-B pairs (the model's recipe, in PyTorch)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    first, second, gold = stsb
    a, b = model.encode(first, batch_size=64), model.encode(second, batch_size=64)
    return model, a, b, spearman(cosine_scores(a, b), gold)


@pytest.mark.parametrize("quantize", QUANTIZATIONS)
def test_export_matches_transformers_at_every_quantization(minilm_artifact, quantize):
    """The export's own parity run (token states and the sentence embedding against PyTorch) at each quantization."""
    _, manifest = minilm_artifact(quantize)
    parity, emb = manifest["parity"], manifest["parity"]["sentence_embedding"]
    # fp32: rounding only; weight-only int8: the weights' error; dynamic int8: activations quantized too
    # (token states: max |diff|, least cosine; sentence embeddings: least cosine)
    tolerance = {"none": (1e-4, 0.99999, 0.99999), "int8": (0.2, 0.99, 0.995), "int8-dynamic": (1.0, 0.95, 0.98)}[
        quantize
    ]
    assert parity["max_abs_diff"] <= tolerance[0] and parity["cosine_min"] >= tolerance[1], parity
    assert emb["sentences"] == 16 and emb["cosine_min"] >= tolerance[2], emb
    assert manifest["embedding"] == {
        "pooling": "mean",
        "normalize": True,
        "dense": [],
        "max_seq_length": 256,
        "do_lower_case": False,
        "source": "modules.json",
        "output": "sentence_embedding",
    }


@pytest.mark.parametrize(
    "quantize, ram, tolerance",
    [("none", "fp32", 0.002), ("int8", "fp32", 0.005), ("int8-dynamic", "fp32", 0.005), ("none", "int8", 0.005)],
)
def test_default_embeddings_score_stsb_as_pytorch(minilm_artifact, torch_reference, stsb, quantize, ram, tolerance):
    """STS-B dev Spearman of cosine similarity: the artifact's default embeddings (mean pooling, normalised:
    the folder's recipe) within ``tolerance`` of sentence-transformers; [CLS] pooling would lose ~0.07."""
    path, _ = minilm_artifact(quantize)
    runtime = Runtime(path, threads=1, ram=ram)
    first, second, gold = stsb
    a, b = runtime.embed(first), runtime.embed(second)
    ours, ref = spearman(cosine_scores(a, b), gold), torch_reference[3]
    assert ref >= 0.85 and abs(ours - ref) <= tolerance, (ours, ref)
    assert np.allclose(np.linalg.norm(np.stack(a), axis=1), 1.0, atol=1e-5)
    if quantize == "none" and ram == "fp32":
        err = np.abs(np.stack(a) - torch_reference[1]).max()
        assert err <= 1e-5, err
        cls = spearman(cosine_scores(runtime.embed(first, pooling="cls"), runtime.embed(second, pooling="cls")), gold)
        assert cls <= ref - 0.01, cls  # why the recipe matters (on all of STS-B dev: 0.797 against 0.867)


def test_overrides_and_max_seq_length(minilm_artifact, minilm_dir, torch_reference):
    """``pooling=``/``normalize=`` override the recipe; texts are cut at max_seq_length 256, as
    sentence-transformers cuts them (the artifact's tokenizer files say 256 too)."""
    from transformers import AutoModel, AutoTokenizer

    path, manifest = minilm_artifact("none")
    runtime = Runtime(path, threads=1)
    long_text = "the quick brown fox jumps over the lazy dog " * 60
    texts = ["A man is playing a guitar.", long_text]
    got = runtime.embed(texts)
    assert got.truncated == 1 and runtime.max_length == manifest["max_length"] == 256
    want = torch_reference[0].encode(texts)
    assert np.abs(np.stack(got) - want).max() <= 1e-5
    assert json.loads((path / "tokenizer_config.json").read_text())["model_max_length"] == 256
    assert json.loads((path / "tokenizer.json").read_text())["truncation"]["max_length"] == 256

    tokenizer, bert = AutoTokenizer.from_pretrained(minilm_dir), AutoModel.from_pretrained(minilm_dir).eval()
    enc = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(**enc).last_hidden_state.numpy()
    cls = np.stack(runtime.embed(texts, pooling="cls", normalize=False))
    assert np.abs(cls - hidden[:, 0]).max() <= 1e-4
    m = enc["attention_mask"].numpy()[..., None]
    mean = (hidden * m).sum(1) / m.sum(1)
    assert np.abs(np.stack(runtime.embed(texts, normalize=False)) - mean).max() <= 1e-4
    assert (
        np.abs(
            np.stack(runtime.embed(texts, pooling="max"))
            - np.stack(runtime.embed(texts, pooling="max", normalize=False))
            / np.linalg.norm(np.where(m > 0, hidden, -np.inf).max(1), axis=1, keepdims=True)
        ).max()
        <= 1e-4
    )


def test_manifest_counts_what_the_file_holds(minilm_artifact, minilm_dir):
    """A feature-extraction graph holds no pooler: learned_params counts BertModel without its 147,840."""
    import onnx
    from onnx import numpy_helper
    from transformers import BertModel

    path, manifest = minilm_artifact("none")
    bert = BertModel.from_pretrained(minilm_dir)
    pooler = sum(p.numel() for p in bert.pooler.parameters())
    assert pooler == 147_840 and manifest["learned_params"] == bert.num_parameters() - pooler
    stored = sum(
        numpy_helper.to_array(t).size
        for t in onnx.load(str(path / "model.onnx")).graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT
    )
    assert 0 <= stored - manifest["learned_params"] <= 16, stored  # the rest: scalar constants (eps, 0.5, ...)


def test_predict_and_serve_embed_by_the_recipe(minilm_artifact, capsys, tmp_path, http_json):
    """`predict` and `serve /embed` answer with the recipe's embeddings by default; --pooling/--no-normalize and
    the request's "pooling"/"normalize" override it; a bad override is refused in one line."""
    import threading

    from sharebert_runtime.main import main
    from sharebert_runtime.serve import make_server

    path, _ = minilm_artifact("none")
    runtime = Runtime(path, threads=1)
    texts = ["A man is playing a guitar.", "A woman is slicing an onion."]
    default, raw_cls = np.stack(runtime.embed(texts)), np.stack(runtime.embed(texts, pooling="cls", normalize=False))
    for extra, want in (([], default), (["--pooling", "cls", "--no-normalize"], raw_cls)):
        assert main(["predict", str(path), "--json", "--threads", "1", *extra, *texts]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert np.abs(np.array([r["result"] for r in rows]) - want).max() <= 1e-5
    assert main(["predict", str(path), "--pooling", "median", texts[0]]) == 2
    assert "invalid choice" in capsys.readouterr().err

    server = make_server(runtime, "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def post(body):
        return http_json(f"http://127.0.0.1:{server.server_address[1]}/embed", body)

    try:
        status, body = post({"texts": texts})
        assert status == 200 and np.abs(np.array(body["results"]) - default).max() <= 1e-5
        status, body = post({"texts": texts, "pooling": "cls", "normalize": False})
        assert status == 200 and np.abs(np.array(body["results"]) - raw_cls).max() <= 1e-5
        for bad, says in [
            ({"text": "a", "normalize": "yes"}, "true or false"),
            ({"text": "a", "normalize": 1}, "true or false"),
            ({"text": "a", "pooling": "median"}, "must be one of"),
            ({"text": "a", "text_pair": "b"}, "single texts"),
        ]:
            status, body = post(bad)
            assert status == 400 and says in body["error"], (bad, body)
    finally:
        server.shutdown()
        server.server_close()
    for kwargs, says in [
        ({"pooling": "median"}, "pooling must be one of"),
        ({"pooling": ["mean"]}, "pooling must be one of"),
        ({"normalize": "yes"}, "true or false"),
    ]:
        with pytest.raises(ValueError, match=says):
            runtime.embed(texts, **kwargs)
