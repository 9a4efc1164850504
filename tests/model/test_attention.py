"""Attention variants: the equivalences that follow from their definitions."""

import pytest
import torch

from sharebert import ShareBertConfig, ShareBertModel
from sharebert.model.attention import SelfAttention

V, H = 32, 4


def attn(variant, p=0.5):
    config = ShareBertConfig(
        vocab_size=100,
        embedding_size=None,
        hidden_size=V,
        num_attention_heads=H,
        sharing="none",
        pooler="dense",
        attention=variant,
        qk_share_ratio=p,
        attention_probs_dropout_prob=0.0,
    )
    module = SelfAttention(config).eval()
    torch.manual_seed(1)
    for b in module.bias.values():
        b.data.normal_()
    return module, {n: torch.randn(s) / 4 for n, s in config.layer_matrices()}


def run(module, x, w, mask=None):
    with torch.no_grad():
        return module(x, mask, w)[0]


x = torch.randn(2, 7, V)
mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
mask[1, ..., 5:] = False


def test_symmetric_scores_are_symmetric():
    module, w = attn("symmetric")
    s = module.scores(x, w)
    torch.testing.assert_close(s, s.transpose(-1, -2))
    std, ws = attn("standard")
    assert not torch.allclose(std.scores(x, ws), std.scores(x, ws).transpose(-1, -2))


def test_pairwise_with_identity_equals_symmetric():
    pair, w = attn("pairwise")
    sym, ws = attn("symmetric")
    d = V // H
    w["pair"] = torch.eye(d).repeat(H, 1)
    for k in ("query", "value", "output"):
        ws[k] = w[k]
    sym.load_state_dict(pair.state_dict())
    torch.testing.assert_close(run(pair, x, w, mask), run(sym, x, ws, mask))
    w["pair"] = torch.randn(H * d, d)  # a general S_h breaks the symmetry
    s = pair.scores(x, w)
    assert not torch.allclose(s, s.transpose(-1, -2))


def test_shared_qkv_equals_standard_with_factored_weights():
    shared, w = attn("shared-qkv")
    for k in shared.scaling.values():
        k.data.uniform_(0.5, 1.5)
    std, ws = attn("standard")
    Ws, bs = w["shared_qkv"], shared.bias["shared_qkv"].data
    for name in ("query", "key", "value"):
        D = shared.scaling[name].data
        ws[name] = D[:, None] * Ws  # W_q = W_s D_q in (out, in) layout
        std.bias[name].data = D * bs
    ws["output"] = w["output"]
    std.output_bias.data = shared.output_bias.data.clone()
    torch.testing.assert_close(run(shared, x, w, mask), run(std, x, ws, mask))


def _partial_as(target_variant, p):
    part, w = attn("partial-qk", p)
    other, wo = attn(target_variant)
    wo["value"], wo["output"] = w["value"], w["output"]
    other.bias["value"].data = part.bias["value"].data.clone()
    other.output_bias.data = part.output_bias.data.clone()
    if target_variant == "standard":  # p = 0: all dims own
        wo["query"], wo["key"] = w["query"], w["key"]
        other.bias["query"].data, other.bias["key"].data = part.bias["query"].data, part.bias["key"].data
    else:  # p = 1: all dims shared
        wo["query"] = w["qk_shared"]
        other.bias["query"].data = part.bias["qk_shared"].data
    return run(part, x, w, mask), run(other, x, wo, mask)


def test_partial_qk_p0_is_standard_and_p1_is_symmetric():
    torch.testing.assert_close(*_partial_as("standard", 0.0))
    torch.testing.assert_close(*_partial_as("symmetric", 1.0))


def test_partial_qk_shares_the_first_dims_of_each_head():
    module, w = attn("partial-qk", 0.5)
    q, k, _ = module.qkv(x, w)
    ds = round(0.5 * V // H)
    torch.testing.assert_close(q[..., :ds], k[..., :ds])
    assert not torch.allclose(q[..., ds:], k[..., ds:])


@pytest.mark.parametrize("sharing", ["eps", "veps"])
def test_fewer_matrices_take_fewer_columns(sharing):
    kw = dict(
        vocab_size=2000,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        sharing=sharing,
        embedding_size=16 if sharing == "veps" else None,
    )
    used = {
        a: ShareBertConfig(attention=a, **kw).column_plan().columns_used
        for a in ("standard", "symmetric", "pairwise", "shared-qkv", "partial-qk")
    }
    assert used["shared-qkv"] < used["symmetric"] < used["standard"]
    assert used["symmetric"] < used["pairwise"] < used["standard"]
    for a in used:  # and each variant runs in a ShareBERT encoder
        model = ShareBertModel(ShareBertConfig(attention=a, **kw))
        assert model(input_ids=torch.randint(0, 2000, (1, 5))).last_hidden_state.shape == (1, 5, 64)
