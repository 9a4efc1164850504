"""ShareBERT models: BERT equivalence, generation once per forward, eval cache, HF round trips."""

import copy

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    pipeline,
)

import sharebert.model.modeling_sharebert as modeling
from sharebert import (
    ShareBertConfig,
    ShareBertForCausalLM,
    ShareBertForMaskedLM,
    ShareBertForQuestionAnswering,
    ShareBertForSequenceClassification,
    ShareBertForTokenClassification,
    ShareBertModel,
)
from sharebert.formats.build import build_model
from sharebert.formats.paths import default_vocab

TINY = dict(
    vocab_size=1000,
    embedding_size=16,
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=128,
    num_attention_heads=4,
    max_position_embeddings=32,
)


def tiny(**kw):
    return ShareBertConfig.from_preset("sharebert-tiny", **{**TINY, **kw})


def with_labels(config, n):
    config = copy.deepcopy(config)
    config.num_labels = n
    return config


def batch(B=2, T=12, vocab=1000, pad=3):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[-1, T - pad :] = 0
    return ids, mask


def test_plain_encoder_equals_transformers_bert():
    """sharing='none', post-LN, dense tanh pooler: the same function as BertForMaskedLM."""
    torch.manual_seed(0)
    bc = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    bert = BertForMaskedLM(bc).eval()
    config = ShareBertConfig.from_preset(
        "bert-base",
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ours = ShareBertForMaskedLM(config).eval()
    assert ours.num_parameters() == bert.num_parameters()
    sd = bert.state_dict()
    mine = {
        "sharebert.embeddings." + k[len("bert.embeddings.") :]: v
        for k, v in sd.items()
        if k.startswith("bert.embeddings.") and "position_ids" not in k
    }
    for i in range(2):
        b, s = f"bert.encoder.layer.{i}.", f"sharebert.layers.{i}."
        for name in ("query", "key", "value"):
            mine[f"sharebert.layer_weights.{i}.matrices.{name}"] = sd[b + f"attention.self.{name}.weight"]
            mine[s + f"attention.bias.{name}"] = sd[b + f"attention.self.{name}.bias"]
        mine[f"sharebert.layer_weights.{i}.matrices.output"] = sd[b + "attention.output.dense.weight"]
        mine[s + "attention.output_bias"] = sd[b + "attention.output.dense.bias"]
        mine[f"sharebert.layer_weights.{i}.matrices.ffn_in"] = sd[b + "intermediate.dense.weight"]
        mine[s + "ffn_in_bias"] = sd[b + "intermediate.dense.bias"]
        mine[f"sharebert.layer_weights.{i}.matrices.ffn_out"] = sd[b + "output.dense.weight"]
        mine[s + "ffn_out_bias"] = sd[b + "output.dense.bias"]
        for ln, dst in (("attention.output.LayerNorm", "attention_norm"), ("output.LayerNorm", "ffn_norm")):
            mine[s + dst + ".weight"], mine[s + dst + ".bias"] = sd[b + ln + ".weight"], sd[b + ln + ".bias"]
    p = "cls.predictions."
    mine.update(
        {
            "lm_head.transform.weight": sd[p + "transform.dense.weight"],
            "lm_head.transform.bias": sd[p + "transform.dense.bias"],
            "lm_head.norm.weight": sd[p + "transform.LayerNorm.weight"],
            "lm_head.norm.bias": sd[p + "transform.LayerNorm.bias"],
            "lm_head.decoder.bias": sd[p + "bias"],
            "lm_head.decoder.weight": sd[p + "decoder.weight"],
        }
    )
    missing, unexpected = ours.load_state_dict(mine, strict=False)
    assert not unexpected and not missing
    ids, mask = batch()
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def _count_generation(monkeypatch):
    calls = []
    real = modeling.generate_virtual

    def counting(plan, *args):
        calls.append(plan.columns_used)
        return real(plan, *args)

    monkeypatch.setattr(modeling, "generate_virtual", counting)
    return calls


def test_weights_generated_once_per_forward_only_used_columns(monkeypatch):
    calls = _count_generation(monkeypatch)
    model = ShareBertForMaskedLM(tiny()).train()
    ids, mask = batch()
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    plan = model.config.column_plan()
    pooler = plan.slot("pooler")  # reserved in the plan, not computed: the MLM model has no pooler
    assert calls == [plan.columns_used - pooler.num_columns] and plan.columns_used < model.config.hidden_size
    model(input_ids=ids, attention_mask=mask)
    assert len(calls) == 2  # training mode: fresh weights every forward
    backbone = ShareBertModel(model.config)
    backbone(input_ids=ids, attention_mask=mask)
    assert calls[-1] == plan.columns_used  # the backbone's pooler is generated too
    shared = set(backbone.weight_generator.plan.slots) & set(model.sharebert.weight_generator.plan.slots)
    assert len(shared) == len(plan.slots) - 1  # every other target keeps its columns


def test_eval_cache_reused_and_never_stale(monkeypatch, tmp_path):
    calls = _count_generation(monkeypatch)
    torch.manual_seed(0)
    model = ShareBertForMaskedLM(tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids, mask = batch()
    model.eval()
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask).logits
        again = model(input_ids=ids, attention_mask=mask).logits
    assert len(calls) == 1 and torch.equal(first, again)

    # An optimizer step changes the parameters in place: the cache must notice.
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        stepped = model(input_ids=ids, attention_mask=mask).logits
        model.sharebert.weight_generator._cache.key = None  # force a fresh generation for reference
        fresh = model(input_ids=ids, attention_mask=mask).logits
    assert not torch.equal(stepped, first)
    torch.testing.assert_close(stepped, fresh, rtol=0, atol=0)

    # load_state_dict of other weights, then a dtype move.
    other = ShareBertForMaskedLM(tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=ids, attention_mask=mask).logits,
            other(input_ids=ids, attention_mask=mask).logits,
            rtol=0,
            atol=0,
        )
        model.to(torch.float64)
        assert model(input_ids=ids, attention_mask=mask).logits.dtype == torch.float64


def test_no_generated_weight_in_state_dict_and_bit_exact_round_trip(tmp_path):
    model = ShareBertForMaskedLM(tiny()).eval()
    learned = {n for n, _ in model.named_parameters()}
    keys = set(model.state_dict())
    assert keys - learned == {"lm_head.decoder.weight"}  # the tied alias of the word embeddings
    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    assert stored == learned and sum(1 for _ in stored) == len(learned)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is ShareBertForMaskedLM
    assert loaded.lm_head.decoder.weight is loaded.sharebert.embeddings.word_embeddings.weight
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids, attention_mask=mask).logits, loaded(input_ids=ids, attention_mask=mask).logits
        )
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ShareBertConfig)
    assert type(AutoModel.from_pretrained(tmp_path)) is ShareBertModel


@pytest.mark.parametrize(
    "sharing,attention",
    [("veps", "standard"), ("eps", "symmetric"), ("none", "pairwise"), ("veps", "shared-qkv"), ("none", "partial-qk")],
)
def test_heads_outputs_and_losses(sharing, attention):
    kw = dict(sharing=sharing, attention=attention)
    if sharing == "eps":
        kw.update(embedding_size=None, hidden_size=32, intermediate_size=64)
    if sharing == "none":
        kw.update(pooler="dense")
    config = tiny(**kw)
    ids, mask = batch()
    out = ShareBertModel(config)(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (2, 12, config.hidden_size)
    assert len(out.hidden_states) == config.num_hidden_layers + 1 and len(out.attentions) == config.num_hidden_layers
    assert out.attentions[0].shape == (2, config.num_attention_heads, 12, 12)
    assert torch.allclose(out.attentions[0][1, :, :, -3:], torch.zeros(()))  # padded keys get no attention
    mlm = ShareBertForMaskedLM(config)(input_ids=ids, attention_mask=mask, labels=ids)
    assert mlm.logits.shape == (2, 12, config.vocab_size) and mlm.loss.ndim == 0
    clf = ShareBertForSequenceClassification(with_labels(config, 3))
    assert clf(input_ids=ids, labels=torch.tensor([0, 2])).logits.shape == (2, 3)
    tok = ShareBertForTokenClassification(with_labels(config, 5))
    assert tok(input_ids=ids, labels=torch.zeros(2, 12, dtype=torch.long)).logits.shape == (2, 12, 5)
    qa = ShareBertForQuestionAnswering(config)(
        input_ids=ids, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 4])
    )
    assert qa.start_logits.shape == (2, 12) and qa.loss.ndim == 0


def test_regression_when_one_label():
    model = ShareBertForSequenceClassification(tiny(num_labels=1))
    ids, _ = batch()
    target = torch.tensor([0.5, 3.0])
    out = model(input_ids=ids, labels=target)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), target))
    assert model.config.problem_type == "regression"


def test_mean_pooling_classifier_reads_the_mean_of_the_unpadded_token_states():
    """``classifier_pooling="mean"``: logits = classifier(mean of the real tokens' last states); no pooler is built,
    and padding a sentence further leaves its logits unchanged (the mask keeps pads out of the mean)."""
    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(tiny(num_labels=2, classifier_pooling="mean")).eval()
    assert not model.sharebert.has_pooler
    ids, mask = batch(pad=4)
    with torch.no_grad():
        hidden = model.sharebert(ids, mask).last_hidden_state
        logits = model(input_ids=ids, attention_mask=mask).logits
        m = mask.unsqueeze(-1).float()
        torch.testing.assert_close(logits, model.classifier((hidden * m).sum(1) / m.sum(1)))
        longer = model(
            input_ids=torch.cat([ids, ids[:, :5]], 1),
            attention_mask=torch.cat([mask, torch.zeros(2, 5, dtype=mask.dtype)], 1),
        ).logits
    torch.testing.assert_close(longer, logits, atol=1e-5, rtol=0)
    cls = ShareBertForSequenceClassification(tiny(num_labels=2, pooler="none")).eval()
    with torch.no_grad():  # the default reads [CLS]
        torch.testing.assert_close(
            cls(input_ids=ids, attention_mask=mask).logits,
            cls.classifier(cls.sharebert(ids, mask).last_hidden_state[:, 0]),
        )


def test_causal_lm_does_not_look_ahead():
    model = ShareBertForCausalLM(tiny()).eval()
    ids, _ = batch(B=1)
    changed = ids.clone()
    changed[0, 8:] = 7
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])
    loss = model(input_ids=ids, labels=ids).loss
    want = torch.nn.functional.cross_entropy(a[0, :-1], ids[0, 1:])
    torch.testing.assert_close(loss, want)


def test_gradient_checkpointing_gives_identical_gradients():
    torch.manual_seed(0)
    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids, mask = batch()
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = ShareBertForMaskedLM(config).train()
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], msg=n)


def test_too_long_input_is_a_clear_error():
    model = ShareBertModel(tiny())
    with pytest.raises(ValueError, match="max_position_embeddings 32"):
        model(input_ids=torch.ones(1, 40, dtype=torch.long))


def test_fill_mask_pipeline_on_a_built_folder(tmp_path):
    build_model("sharebert-tiny", tmp_path, {"num_hidden_layers": 2}, default_vocab())
    fill = pipeline("fill-mask", model=str(tmp_path), tokenizer=str(tmp_path))
    preds = fill("the capital of france is [MASK].", top_k=3)
    assert len(preds) == 3 and all("token_str" in p for p in preds)
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    assert type(clf) is ShareBertForSequenceClassification


@pytest.mark.parametrize("mlm_head", ["tied", "untied"])
def test_masked_only_logits_in_training_give_the_same_loss_and_gradients(mlm_head):
    cfg = dict(TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, mlm_head=mlm_head)
    torch.manual_seed(0)
    masked = ShareBertForMaskedLM(
        ShareBertConfig.from_preset("sharebert-tiny", mlm_logits_in_training="masked", **cfg)
    ).train()
    full = ShareBertForMaskedLM(ShareBertConfig.from_preset("sharebert-tiny", **cfg)).train()
    full.load_state_dict(masked.state_dict())
    ids = torch.randint(5, 1000, (3, 20))
    labels = torch.full_like(ids, -100)
    labels[:, ::5] = ids[:, ::5]
    a, b = masked(input_ids=ids, labels=labels), full(input_ids=ids, labels=labels)
    assert a.logits is None and b.logits.shape == (3, 20, 1000)  # masked: the head ran on 12 of 60 positions
    torch.testing.assert_close(a.loss, b.loss)
    a.loss.backward()
    b.loss.backward()
    grads = dict(full.named_parameters())
    for name, p in masked.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)
    assert masked.eval()(input_ids=ids, labels=labels).logits.shape == (3, 20, 1000)  # eval: BERT's full logits


HEAD_CLASSES = (
    ShareBertModel,
    ShareBertForMaskedLM,
    ShareBertForCausalLM,
    ShareBertForSequenceClassification,
    ShareBertForTokenClassification,
    ShareBertForQuestionAnswering,
)
INIT_CONFIGS = {
    "veps-generated-pooler": {},
    "eps-dense-pooler": dict(sharing="eps", embedding_size=None, pooler="dense"),
    "bert": "bert-small",
}


def _init_config(name):
    spec = INIT_CONFIGS[name]
    if isinstance(spec, str):
        return ShareBertConfig.from_preset(spec, **{k: v for k, v in TINY.items() if k != "embedding_size"})
    return tiny(**spec)


@pytest.mark.parametrize("cls", HEAD_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("config_name", list(INIT_CONFIGS))
def test_init_weights_covers_every_parameter(cls, config_name):
    """_init_weights sets every learned tensor: none keeps what was in memory (NaN here) before it ran."""
    model = cls(_init_config(config_name))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.apply(model._init_weights)
    left = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    assert not left, f"not initialised by _init_weights: {left}"


def test_mlm_checkpoint_loads_as_classifier_the_standard_way(tmp_path):
    """The pooler bias missing from an MLM checkpoint is initialised (zero), so logits and Trainer losses are finite."""
    ShareBertForMaskedLM(tiny()).save_pretrained(tmp_path)
    model, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert "sharebert.pooler_bias" in info["missing_keys"]
    assert torch.equal(model.sharebert.pooler_bias, torch.zeros_like(model.sharebert.pooler_bias))
    ids, mask = batch()
    out = model.eval()(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    assert torch.isfinite(out.logits).all() and bool(torch.isfinite(out.loss))
    assert not (out.loss.item() > 10.0)  # two classes from a fresh head: about ln 2, never 1e13


def test_resize_token_embeddings_refused_when_generated_and_works_when_dense():
    shared = ShareBertForMaskedLM(tiny())
    with pytest.raises(ValueError, match="vocab_size is part of its shape"):
        shared.resize_token_embeddings(1100)
    assert shared.config.vocab_size == 1000 and shared.get_input_embeddings().weight.shape[0] == 1000
    dense = ShareBertForMaskedLM(_init_config("bert")).eval()
    dense.resize_token_embeddings(1100)
    logits = dense(input_ids=torch.randint(0, 1100, (2, 8))).logits
    assert logits.shape == (2, 8, 1100) and torch.isfinite(logits).all()
