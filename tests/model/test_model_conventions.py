"""transformers' model conventions, checked in the pattern of transformers' model testers: a tiny config,
inputs made by a tester class, one check per convention.

Which conventions hold and which are declared unsupported (and why) is in docs/MODEL.md.
"""

import pytest
import torch
from torch.export import Dim, export
from transformers import BertConfig, BertModel
from transformers.cache_utils import DynamicCache

from sharebert import (
    ShareBertConfig,
    ShareBertForCausalLM,
    ShareBertForMaskedLM,
    ShareBertForQuestionAnswering,
    ShareBertForSequenceClassification,
    ShareBertForTokenClassification,
    ShareBertModel,
)
from sharebert.formats.model_folder import bert_state_dict

ALL_CLASSES = (
    ShareBertModel,
    ShareBertForMaskedLM,
    ShareBertForCausalLM,
    ShareBertForSequenceClassification,
    ShareBertForTokenClassification,
    ShareBertForQuestionAnswering,
)


class ShareBertModelTester:
    """A tiny ShareBERT (VEPS, 3 shared layers) and inputs with right padding in the last row."""

    batch_size, seq_length, vocab_size, num_heads = 2, 12, 1000, 4

    def get_config(self, **kw):
        fields = dict(
            vocab_size=self.vocab_size,
            embedding_size=16,
            hidden_size=64,
            num_hidden_layers=3,
            intermediate_size=128,
            num_attention_heads=self.num_heads,
            max_position_embeddings=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return ShareBertConfig.from_preset("sharebert-tiny", **{**fields, **kw})

    def prepare_config_and_inputs(self, seed=0, batch=None, length=None):
        g = torch.Generator().manual_seed(seed)
        B, T = batch or self.batch_size, length or self.seq_length
        ids = torch.randint(5, self.vocab_size, (B, T), generator=g)
        mask = torch.ones_like(ids)
        mask[-1, T - 3 :] = 0
        return self.get_config(), {"input_ids": ids, "attention_mask": mask}


tester = ShareBertModelTester()


def _first(output):
    return output[0] if isinstance(output, tuple) else output.to_tuple()[0]


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("with_mask", [True, False], ids=["mask", "no-mask"])
def test_torch_export_dynamic_batch_and_length_equals_eager(cls, with_mask):
    config, inputs = tester.prepare_config_and_inputs()
    model = cls(config).eval()
    if not with_mask:
        inputs.pop("attention_mask")
    dims = {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=config.max_position_embeddings)}
    program = export(model, (), inputs, dynamic_shapes={k: dims for k in inputs})
    _, other = tester.prepare_config_and_inputs(seed=1, batch=3, length=20)  # another batch size and length
    if not with_mask:
        other.pop("attention_mask")
    with torch.no_grad():
        want = _first(model(**other))
    got = _first(program.module()(**other))
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff <= 1e-5, diff


def _lm():
    torch.manual_seed(0)
    return ShareBertForCausalLM(tester.get_config(is_decoder=True)).eval()


@pytest.mark.parametrize("new_tokens", [8, 40])  # 40 runs past max_position_embeddings=32: a sliding window
def test_generate_with_cache_gives_the_tokens_of_generate_without(new_tokens):
    model = _lm()
    _, inputs = tester.prepare_config_and_inputs()
    ids = inputs["input_ids"]
    cached = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0)
    plain = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, use_cache=False, pad_token_id=0)
    assert cached.shape == (2, ids.shape[1] + new_tokens) and torch.equal(cached, plain)


def test_cache_holds_every_layer_and_one_step_equals_the_full_forward():
    model = _lm()
    _, inputs = tester.prepare_config_and_inputs()
    ids = inputs["input_ids"]
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache = DynamicCache()
        first = model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
        step = model(input_ids=ids[:, -1:], past_key_values=first.past_key_values, use_cache=True)
    assert cache.get_seq_length() == ids.shape[1] and len(cache.layers) == model.config.num_hidden_layers
    diff = (step.logits[:, -1] - full[:, -1]).abs().max().item()
    assert diff <= 1e-5, diff


def test_left_padding_gives_the_continuation_of_no_padding():
    model = _lm()
    prompt = torch.randint(5, 1000, (1, 6), generator=torch.Generator().manual_seed(3))
    pad = torch.zeros(1, 4, dtype=torch.long)
    padded = torch.cat([pad, prompt], 1)
    mask = torch.cat([pad, torch.ones_like(prompt)], 1)
    alone = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    batched = model.generate(padded, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(alone[:, 6:], batched[:, 10:])


def test_generate_forwards_model_kwargs():
    model = _lm()
    ids = tester.prepare_config_and_inputs()[1]["input_ids"]
    out = model.generate(
        ids,
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_attentions=True,
        output_hidden_states=True,
    )
    L, T = model.config.num_hidden_layers, ids.shape[1]
    assert len(out.attentions) == 3 and len(out.attentions[0]) == L and len(out.hidden_states[0]) == L + 1
    assert out.attentions[0][0].shape == (2, tester.num_heads, T, T)  # the prompt, then one new query
    assert out.attentions[1][0].shape == (2, tester.num_heads, 1, T + 1)  # over the cached keys


@pytest.fixture(scope="module")
def wordpiece_lm(tmp_path_factory):
    """(causal LM, tokenizer) as ``build_model`` writes them for a decoder preset, with the project's WordPiece
    tokenizer (which returns ``token_type_ids`` and ends every text with ``[SEP]``), loaded back by the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharebert.formats.build import build_model

    out = tmp_path_factory.mktemp("wordpiece_lm") / "model"
    build_model(
        "charlm-tiny",
        out,
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            max_position_embeddings=32,
        ),
        seed=0,
    )
    return AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)


GENERATION_MODES = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True, top_k=20),
    "beam": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "beam-sample": dict(do_sample=True, num_beams=2),
}


@pytest.mark.parametrize("mode", GENERATION_MODES)
def test_generate_on_tokenizer_output_with_and_without_the_cache(wordpiece_lm, mode):
    """transformers' generation tester's core property, per decoding mode: ``generate(**tokenizer(...))`` (with
    ``token_type_ids``) gives the same tokens with the cache as without, and per-step scores of ``(rows, E)``."""
    model, tokenizer = wordpiece_lm
    enc = tokenizer(["the weather is", "a"], return_tensors="pt", padding=True)
    assert "token_type_ids" in enc
    runs = {}
    for use_cache in (True, False):
        torch.manual_seed(0)
        runs[use_cache] = model.generate(
            **enc,
            **GENERATION_MODES[mode],
            max_new_tokens=6,
            min_new_tokens=6,
            use_cache=use_cache,
            return_dict_in_generate=True,
            output_scores=True,
        )
    cached, plain = runs[True], runs[False]
    rows = 2 * GENERATION_MODES[mode].get("num_return_sequences", 1)
    assert cached.sequences.shape == (rows, enc["input_ids"].shape[1] + 6)
    assert torch.equal(cached.sequences, plain.sequences)
    assert len(cached.scores) == 6 and cached.scores[0].shape[1] == model.config.vocab_size
    for a, b in zip(cached.scores, plain.scores):
        finite = torch.isfinite(a)
        assert torch.equal(finite, torch.isfinite(b)) and (a[finite] - b[finite]).abs().max().item() <= 1e-4


def test_generate_stops_at_sep(wordpiece_lm):
    """A WordPiece causal LM's ``generation_config.eos_token_id`` is ``[SEP]``: generation ends there."""
    model, tokenizer = wordpiece_lm
    sep = tokenizer.sep_token_id
    assert (
        model.generation_config.eos_token_id == sep and model.generation_config.pad_token_id == tokenizer.pad_token_id
    )
    enc = tokenizer(["the weather is"], return_tensors="pt")
    free = model.generate(**enc, max_new_tokens=12, do_sample=False)[0, enc["input_ids"].shape[1] :]
    with torch.no_grad():
        saved = model.lm_head.decoder.bias.clone()
        try:
            model.lm_head.decoder.bias[sep] += 1e4  # [SEP] always wins ...
            stopped = model.generate(**enc, max_new_tokens=12, do_sample=False)[0, enc["input_ids"].shape[1] :]
            unstopped = model.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None)
        finally:
            model.lm_head.decoder.bias.copy_(saved)
    assert stopped.tolist() == [sep]  # ... and ends generation at once
    assert unstopped.shape[1] == enc["input_ids"].shape[1] + 12  # without an eos, it runs to max_new_tokens
    assert free.numel() >= 1 and (free[:-1] != sep).all()  # at most one [SEP], the last token


def test_left_padded_tokenizer_batch_continues_as_each_text_alone(wordpiece_lm):
    model, tokenizer = wordpiece_lm
    texts = ["the weather is very", "a"]
    tokenizer.padding_side = "left"
    try:
        batch = model.generate(
            **tokenizer(texts, return_tensors="pt", padding=True), max_new_tokens=5, min_new_tokens=5, do_sample=False
        )[:, -5:]
    finally:
        tokenizer.padding_side = "right"
    alone = [
        model.generate(**tokenizer([t], return_tensors="pt"), max_new_tokens=5, min_new_tokens=5, do_sample=False)[
            0, -5:
        ]
        for t in texts
    ]
    assert torch.equal(batch, torch.stack(alone))


def _bert_with_head_mask(bert, head_mask):
    """``bert`` attending as transformers 4's BERT did with ``head_mask`` (transformers 5 dropped the argument): eager
    attention whose probabilities, after dropout, are multiplied by ``head_mask[layer]`` per head. Registered as an
    attention implementation (with eager's mask), transformers 5's documented way to change how a model attends."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.models.bert.modeling_bert import eager_attention_forward

    def attend(module, query, key, value, attention_mask, **kwargs):
        _, probs = eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
        probs = probs * head_mask[module.layer_idx][None, :, None, None]
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    AttentionInterface.register("sharebert_test_head_mask", attend)
    AttentionMaskInterface.register("sharebert_test_head_mask", ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # eager's mask
    bert.set_attn_implementation("sharebert_test_head_mask")
    return bert


def test_head_mask_matches_transformers_bert():
    """sharing='none' is BERT: the same head_mask gives the same hidden states and attentions as BertModel."""
    torch.manual_seed(0)
    shape = dict(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    bert = BertModel(BertConfig(**shape), add_pooling_layer=False).eval()
    ours = ShareBertModel(ShareBertConfig.from_preset("bert-base", **shape), add_pooling_layer=False).eval()
    missing, unexpected = ours.load_state_dict(bert_state_dict(bert.state_dict(), 2, ""), strict=False)
    assert not missing and not unexpected
    _, inputs = tester.prepare_config_and_inputs()
    head_mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [0.0, 1.0, 1.0, 1.0]])
    with torch.no_grad():
        want = _bert_with_head_mask(bert, head_mask)(**inputs, output_attentions=True)
        got = ours(**inputs, head_mask=head_mask, output_attentions=True)
        fast = ours(**inputs, head_mask=head_mask).last_hidden_state  # the SDPA path scales the context instead
    keep = inputs["attention_mask"].bool()
    for g in (got.last_hidden_state, fast):
        assert (g[keep] - want.last_hidden_state[keep]).abs().max().item() <= 1e-5
    for g, w in zip(got.attentions, want.attentions, strict=True):
        assert (g - w).abs().max().item() <= 1e-5
    assert (got.attentions[0][:, 1] == 0).all() and (got.attentions[1][:, 0] == 0).all()


def test_pruning_is_declared_unsupported_and_changes_nothing():
    model = ShareBertForMaskedLM(tester.get_config())
    before = model.config.to_dict()
    with pytest.raises(NotImplementedError, match="head pruning is not supported"):
        model.prune_heads({0: [1]})
    assert model.config.to_dict() == before
