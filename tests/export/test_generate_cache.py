"""The causal-LM artifact carries the key/value cache (optimum's decoder inputs and outputs) and
``Runtime.generate`` uses it: the same tokens as without it, and as PyTorch's ``generate``."""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from sharebert import ShareBertForCausalLM
from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert.training.corpus import char_tokenizer
from sharebert_runtime import Runtime

SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
PROMPTS = ["ROMEO: what", "To be or not"]


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("charlm")
    text = data_path("tinyshakespeare", "input.txt").read_text()[:20000]
    build_model("charlm-tiny", root / "model", SHAPE, head="clm", tokenizer=char_tokenizer(text), seed=0)
    manifest = export_model(root / "model", root / "artifact", check_limit=16, runs=2, shapes=("1x16",), progress=False)
    return root, manifest


def test_artifact_has_the_decoder_cache_inputs_and_outputs(char_lm):
    _, manifest = char_lm
    layers = SHAPE["num_hidden_layers"]
    assert manifest["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"]
    assert [n for n in manifest["inputs"] if n.startswith("past_key_values.")] == [
        f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")
    ]
    assert [n for n in manifest["outputs"] if n.startswith("present.")] == [
        f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")
    ]
    assert not (manifest["parity"]["max_abs_diff"] > 1e-4)  # the first step, run with an empty cache


@pytest.mark.parametrize("new_tokens", [10, 50])  # 50 runs past the 32 positions: the window slides
def test_runtime_generate_with_cache_equals_without(char_lm, new_tokens):
    runtime = Runtime(char_lm[0] / "artifact", threads=1)
    assert runtime.cached
    with_cache = runtime.generate(PROMPTS, max_new_tokens=new_tokens, use_cache=True)
    assert with_cache == runtime.generate(PROMPTS, max_new_tokens=new_tokens, use_cache=False)
    assert with_cache == [runtime.generate(p, max_new_tokens=new_tokens)[0] for p in PROMPTS]  # left padding
    assert all(len(text) > 0 for text in with_cache)


def test_runtime_continues_as_pytorch_generate(char_lm):
    root, _ = char_lm
    model = ShareBertForCausalLM.from_pretrained(root / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    runtime = Runtime(root / "artifact", threads=1)
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        out = model.generate(ids, max_new_tokens=50, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]
        assert runtime.generate(prompt, max_new_tokens=50)[0] == tokenizer.decode(out, skip_special_tokens=True)


def test_one_cached_step_equals_the_full_window(char_lm):
    """present.* of a prompt, fed back with one more token, gives the logits of the whole sequence."""
    runtime = Runtime(char_lm[0] / "artifact", threads=1)
    ids = np.array([[5, 9, 12, 7, 30, 2]], dtype=np.int64)
    full = runtime._run(ids, np.ones_like(ids))["logits"][:, -1]
    first = runtime._run(ids[:, :-1], np.ones_like(ids[:, :-1]))
    past = {"past_key_values." + n[len("present.") :]: v for n, v in first.items() if n.startswith("present.")}
    step = runtime._run(ids[:, -1:], np.ones_like(ids), past)["logits"][:, -1]
    assert not (np.abs(step - full).max() > 1e-5)


def test_ram_int8_generates_with_the_cache(char_lm):
    """Dynamic int8 scales activations per call, so one cached token and a whole window need not round alike;
    the first token (the same call either way, for one prompt) must agree, and every step must run."""
    runtime = Runtime(char_lm[0] / "artifact", threads=1, ram="int8")
    cached = runtime.generate(PROMPTS[0], max_new_tokens=40, use_cache=True)[0]
    plain = runtime.generate(PROMPTS[0], max_new_tokens=40, use_cache=False)[0]
    assert cached[0] == plain[0] and len(cached) >= 30  # a few ids may decode to nothing ([PAD], [UNK])
