"""The sentence-embedding recipe (sharebert/formats/recipe.py): what write_recipe writes, sentence-transformers loads
and computes as the recipe says; read_recipe reads it back; each malformed recipe file is refused naming it."""

import json

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from sharebert.formats.paths import default_vocab
from sharebert.formats.recipe import (
    DEFAULT_RECIPE,
    DenseLayer,
    EmbeddingRecipe,
    read_dense_weights,
    read_recipe,
    write_recipe,
)
from sharebert_runtime.pooling import POOLING_MODES

TANH, IDENTITY = "torch.nn.modules.activation.Tanh", "torch.nn.modules.linear.Identity"
TEXTS = ["a short one", "a rather longer sentence with quite a few more words in it", "mid length text here"]


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A plain transformers BERT folder (no sentence-transformers files) and its model."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertModel(config).eval()
    folder = tmp_path_factory.mktemp("plain_bert")
    model.save_pretrained(folder)
    BertTokenizerFast(str(default_vocab())).save_pretrained(folder)
    return folder, model


def _copy(folder, dest):
    import shutil

    shutil.copytree(folder, dest)
    return dest


def _pool(h, mask, mode):
    """Reference pooling in numpy: h [batch, seq, hidden], mask [batch, seq] of 0/1 (right padding)."""
    m = mask[..., None].astype(np.float64)
    if mode == "cls":
        return h[:, 0]
    if mode == "max":
        return np.where(m > 0, h, -np.inf).max(1)
    if mode in ("mean", "mean_sqrt_len"):
        n = m.sum(1)
        return (h * m).sum(1) / (n if mode == "mean" else np.sqrt(n))
    if mode == "weightedmean":
        w = m * np.arange(1, h.shape[1] + 1)[None, :, None]
        return (h * w).sum(1) / w.sum(1)
    last = mask.sum(1) - 1
    return h[np.arange(len(h)), last]


@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_written_recipe_loads_in_sentence_transformers_as_the_recipe_says(bert_folder, tmp_path, pooling):
    from sentence_transformers import SentenceTransformer

    folder, bert = bert_folder
    out = _copy(folder, tmp_path / "st")
    assert read_recipe(out) == DEFAULT_RECIPE and "no sentence-transformers files" in DEFAULT_RECIPE.source
    rng = np.random.default_rng(1)
    w1, b1 = rng.normal(size=(24, 32)).astype(np.float32) * 0.2, rng.normal(size=24).astype(np.float32)
    w2 = rng.normal(size=(16, 24)).astype(np.float32) * 0.2
    recipe = EmbeddingRecipe(
        pooling=pooling,
        normalize=pooling != "max",
        dense=(DenseLayer("", 32, 24, True, TANH), DenseLayer("", 24, 16, False, IDENTITY)),
        max_seq_length=40,
        do_lower_case=False,
        source="test",
    )
    write_recipe(out, recipe, [(w1, b1), (w2, None)])
    back = read_recipe(out)
    assert back == EmbeddingRecipe(
        pooling=pooling,
        normalize=recipe.normalize,
        max_seq_length=40,
        do_lower_case=False,
        dense=(DenseLayer("2_Dense", 32, 24, True, TANH), DenseLayer("3_Dense", 24, 16, False, IDENTITY)),
        source="modules.json",
    )
    got_w, got_b = read_dense_weights(out, back.dense[0])
    assert np.array_equal(got_w, w1) and np.array_equal(got_b, b1) and read_dense_weights(out, back.dense[1])[1] is None

    model = SentenceTransformer(str(out), device="cpu")
    assert model.max_seq_length == 40
    got = model.encode(TEXTS, convert_to_numpy=True, batch_size=8)
    tokens = BertTokenizerFast.from_pretrained(out)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = bert(**tokens).last_hidden_state.double().numpy()
    want = np.tanh(_pool(h, tokens["attention_mask"].numpy(), pooling) @ w1.T + b1) @ w2.T
    if recipe.normalize:
        want /= np.linalg.norm(want, axis=1, keepdims=True)
    err = np.abs(got - want).max()
    assert got.shape == (3, 16) and err <= 1e-5, err


def test_sentence_transformers_folder_is_read_as_shipped(minilm_dir):
    assert read_recipe(minilm_dir) == EmbeddingRecipe(
        pooling="mean", normalize=True, max_seq_length=256, do_lower_case=False, source="modules.json"
    )


T, P, D, N = ("sentence_transformers.models." + k for k in ("Transformer", "Pooling", "Dense", "Normalize"))
CHAIN = [
    {"idx": 0, "name": "0", "path": "", "type": T},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": P},
    {"idx": 2, "name": "2", "path": "2_Dense", "type": D},
    {"idx": 3, "name": "3", "path": "3_Normalize", "type": N},
]
POOL = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
DENSE = {"in_features": 32, "out_features": 8, "bias": True, "activation_function": TANH}


# (file to spoil, its new content (None: delete it), what the one-line refusal says besides the file's name)
BAD_FILES = [
    ("modules.json", "[{", "not valid JSON"),
    ("modules.json", {"0": T}, "not a JSON list"),
    ("modules.json", CHAIN[:1] + [{"path": "1_LSTM", "type": "sentence_transformers.models.LSTM"}], "not supported"),
    ("modules.json", CHAIN[:1] + [{"path": "x", "type": "my_package.Pooling"}], "not supported"),
    ("modules.json", [CHAIN[0], CHAIN[2], CHAIN[1]], "in that order"),
    ("modules.json", [dict(CHAIN[0], path="0_Transformer")] + CHAIN[1:], "model folder itself"),
    ("modules.json", CHAIN[:1] + [dict(CHAIN[1], path="../elsewhere")], "inside the model folder"),
    ("modules.json", CHAIN[:1] + [dict(CHAIN[1], path="1_Pooling\x00")], "inside the model folder"),
    ("modules.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (
        "modules.json",
        CHAIN[:1] + [dict(CHAIN[1], path="")] + CHAIN[2:],
        "the Pooling module's path is the model folder",
    ),
    ("modules.json", CHAIN[:2] + [dict(CHAIN[2], path=".")] + CHAIN[3:], "the Dense module's path is the model folder"),
    ("1_Pooling/config.json", None, "not found"),
    ("1_Pooling/config.json", "{'a': 1}", "not valid JSON"),
    ("1_Pooling/config.json", [1], "not a JSON object"),
    ("1_Pooling/config.json", {"pooling_mode": "median"}, "'median' is not one of"),
    ("1_Pooling/config.json", {"pooling_mode": {"mean": True}}, "is not one of"),
    ("1_Pooling/config.json", {"pooling_mode": [["mean"]]}, "is not one of"),
    ("1_Pooling/config.json", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "one pooling mode"),
    ("1_Pooling/config.json", {"pooling_mode_mean_tokens": "yes"}, "true or false"),
    ("1_Pooling/config.json", dict(POOL, word_embedding_dimension=384), "not the model's hidden_size 32"),
    ("2_Dense/config.json", None, "not found"),
    ("2_Dense/config.json", "", "not valid JSON"),
    ("2_Dense/config.json", {"out_features": 8}, "in_features is missing"),
    ("2_Dense/config.json", dict(DENSE, out_features=0), "out_features must be an integer >= 1"),
    ("2_Dense/config.json", dict(DENSE, in_features=16), "not the model's hidden_size 32"),
    ("2_Dense/config.json", dict(DENSE, activation_function="my_package.Swish"), "not supported"),
    ("2_Dense/config.json", dict(DENSE, activation_function=[TANH]), "not supported"),
    ("2_Dense/config.json", dict(DENSE, module_input_name="token_embeddings"), "not supported"),
    ("2_Dense/model.safetensors", None, "not found"),
    ("sentence_bert_config.json", "{", "not valid JSON"),
    ("sentence_bert_config.json", {"max_seq_length": "long"}, "max_seq_length must be an integer"),
    ("sentence_bert_config.json", {"do_lower_case": 1}, "do_lower_case must be true or false"),
]


@pytest.fixture(scope="module")
def recipe_folder(bert_folder, tmp_path_factory):
    """A plain BERT folder with a mean-pooling, Dense (32->8, tanh), Normalize recipe written into it."""
    out = _copy(bert_folder[0], tmp_path_factory.mktemp("recipe") / "st")
    rng = np.random.default_rng(0)
    write_recipe(
        out,
        EmbeddingRecipe("mean", True, (DenseLayer("", 32, 8, True, TANH),), 64, False),
        [(rng.normal(size=(8, 32)), rng.normal(size=8))],
    )
    return out


@pytest.mark.parametrize("name, content, says", BAD_FILES, ids=[f"{n}-{s}" for n, _, s in BAD_FILES])
def test_malformed_recipe_file_is_refused_naming_it(recipe_folder, tmp_path, name, content, says):
    folder = _copy(recipe_folder, tmp_path / "st")
    assert read_recipe(folder).dense[0].path == "2_Dense"
    path = folder / name
    if content is None:
        path.unlink()
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError) as e:
        read_recipe(folder)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and str(path) in message and says in message, message


@pytest.mark.parametrize(
    "tensors, says",
    [
        ({"linear.weight": np.zeros((8, 16), np.float32), "linear.bias": np.zeros(8, np.float32)}, "shape [8, 32]"),
        ({"linear.weight": np.zeros((8, 32), np.float32)}, "linear.bias must have shape [8]"),
        ({"linear.weight": np.full((8, 32), np.nan, np.float32), "linear.bias": np.zeros(8, np.float32)}, "NaN"),
        (b"not safetensors", "damaged"),
    ],
)
def test_bad_dense_weights_are_refused_naming_the_file(recipe_folder, tmp_path, tensors, says):
    from safetensors.numpy import save_file

    folder = _copy(recipe_folder, tmp_path / "st")
    path = folder / "2_Dense" / "model.safetensors"
    if isinstance(tensors, bytes):
        path.write_bytes(tensors)
    else:
        save_file(tensors, str(path))
    with pytest.raises(ValueError) as e:
        read_dense_weights(folder, read_recipe(folder).dense[0])
    assert len(str(e.value).splitlines()) == 1 and str(path) in str(e.value) and says in str(e.value), str(e.value)


def test_bfloat16_dense_weights_are_read_in_a_process_without_ml_dtypes(recipe_folder, tmp_path):
    """bfloat16 Dense weights (numpy alone cannot read them: `data type 'bfloat16' not understood`) read as
    float32, in a fresh process where nothing registered bfloat16 with numpy. transformers is blocked there too:
    the read goes through torch alone, and ``import sharebert`` skips its registration (transformers' import, most
    of the process's start) without it."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file, save_file

    folder = _copy(recipe_folder, tmp_path / "st")
    path = folder / "2_Dense" / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(path)).items()}, str(path))
    code = (
        "import sys; sys.modules['ml_dtypes'] = None; "  # nothing can register bfloat16 with numpy
        "sys.modules['transformers'] = None; "  # nor need it: sharebert then imports no transformers to register
        "from sharebert.formats.recipe import read_dense_weights, read_recipe; "
        "w, b = read_dense_weights(sys.argv[1], read_recipe(sys.argv[1]).dense[0]); "
        "print(w.dtype, w.shape, b.dtype, sys.modules.get('ml_dtypes') is None)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["float32", "(8,", "32)", "float32", "True"], done


GELU, RELU = "torch.nn.modules.activation.GELU", "torch.nn.modules.activation.ReLU"


@pytest.mark.parametrize(
    "pooling, activation",
    [
        ("cls", TANH),
        ("mean", GELU),
        ("max", RELU),
        ("mean_sqrt_len", IDENTITY),
        ("weightedmean", TANH),
        ("lasttoken", TANH),
    ],
)
def test_exported_recipe_embeds_as_sentence_transformers(bert_folder, tmp_path, pooling, activation):
    """export puts the recipe's pooling and Dense layer into the graph; Runtime.embed (defaults) gives what
    SentenceTransformer(folder).encode gives; overrides pool the token states as deploy.pooling says."""
    from sentence_transformers import SentenceTransformer

    from sharebert.export.exporter import export_model
    from sharebert_runtime import Runtime
    from sharebert_runtime.pooling import l2_normalize, pool

    folder = _copy(bert_folder[0], tmp_path / "st")
    rng = np.random.default_rng(2)
    recipe = EmbeddingRecipe(
        pooling,
        normalize=pooling != "cls",
        dense=(DenseLayer("", 32, 12, True, activation),),
        max_seq_length=12,
        do_lower_case=False,
    )
    write_recipe(
        folder, recipe, [(rng.normal(size=(12, 32)).astype(np.float32), rng.normal(size=12).astype(np.float32))]
    )
    manifest = export_model(folder, tmp_path / "art", check_limit=4, runs=1, shapes=("1x8",), progress=False)
    assert manifest["max_length"] == 12 and manifest["embedding"]["pooling"] == pooling
    assert manifest["parity"]["sentence_embedding"]["max_abs_diff"] <= 1e-4
    runtime = Runtime(tmp_path / "art", threads=1)
    got = np.stack(runtime.embed(TEXTS))
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert got.shape == (3, 12) and np.abs(got - want).max() <= 1e-5, np.abs(got - want).max()
    other = "mean" if pooling != "mean" else "max"
    tokens = BertTokenizerFast.from_pretrained(folder)(
        TEXTS, padding=True, truncation=True, max_length=12, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = bert_folder[1](**tokens).last_hidden_state.numpy()
    plain = pool(hidden, tokens["attention_mask"].numpy(), other)
    assert np.abs(np.stack(runtime.embed(TEXTS, pooling=other, normalize=False)) - plain).max() <= 1e-4
    assert np.abs(np.stack(runtime.embed(TEXTS, pooling=other, normalize=True)) - l2_normalize(plain)).max() <= 1e-4


@pytest.mark.parametrize("mode", ["median", ["mean"], None, {"mean": True}])
def test_unknown_pooling_mode_is_refused(mode):
    from sharebert_runtime.pooling import pool

    with pytest.raises(ValueError, match="pooling must be one of"):
        pool(np.zeros((1, 2, 3), np.float32), np.ones((1, 2), np.int64), mode)
