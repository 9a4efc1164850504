"""ShareBERT and BERT-style encoders with shared attention weights, as transformers models.

Data flow (``docs/ARCHITECTURE.md``)::

    config -> column plan -> generated weights (once per forward) -> N layers -> heads

With ``sharing='veps'`` the weights come from the virtual embedding ``M = A @ P + p`` (E x V); with
``'eps'`` from the word-embedding matrix itself; with ``'none'`` they are learned matrices (one set
per layer, or one shared set with ``share_layers``). Each layer owns its biases and LayerNorms.
Only learned tensors are parameters: generated weights are temporaries, cached in eval mode
(see ``eps._SourceCache``) and never saved.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

try:  # transformers 5: each function leaves alone a tensor a checkpoint loaded
    from transformers import initialization as init
except ImportError:  # transformers 4 (the optimum extra's environment) initialises before loading
    from torch.nn import init

from .attention import SelfAttention
from .configuration_sharebert import ShareBertConfig
from .eps import _SourceCache, generate_from_source, generate_virtual, tracing

# The key/value cache's keyword and output field: transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old
# name still accepted, with a warning); the models take either and answer under the installed library's name.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class ShareBertEmbeddings(nn.Module):
    """Token, position and token-type embeddings -> ``(B, T, V)``.

    Factorised (F < V): ``LN_V(W_in LN_F(A[ids]) + pos + type)``; otherwise ``LN_V(A[ids] + pos + type)``.
    """

    def __init__(self, config: ShareBertConfig):
        super().__init__()
        V, Fw = config.hidden_size, config.word_embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, Fw)
        if config.factorized:
            self.input_norm = nn.LayerNorm(Fw, eps=config.layer_norm_eps)
            self.input_projection = nn.Linear(Fw, V)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, V)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, V)
        self.LayerNorm = nn.LayerNorm(V, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None, position_ids=None, past_length: int = 0):
        """``position_ids`` (B, T), default ``past_length .. past_length + T - 1`` (after a key/value cache)."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        B, T = inputs_embeds.shape[:2]
        if position_ids is None and not tracing() and past_length + T > self.max_positions:  # traced: T stays dynamic
            raise ValueError(
                f"sequence length {past_length + T} exceeds max_position_embeddings {self.max_positions}; "
                f"truncate the input (tokenizer(..., truncation=True, max_length={self.max_positions}))"
            )
        x = inputs_embeds
        if hasattr(self, "input_projection"):
            x = self.input_projection(self.input_norm(x))
        if position_ids is None:
            x = x + self.position_embeddings.weight[past_length : past_length + T]
        else:
            x = x + self.position_embeddings(position_ids)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class WeightGenerator(nn.Module):
    """Generates the shared encoder's matrices (and the pooler's, when the model has one) from the embeddings.

    ``veps`` owns the virtual projection ``P`` (F x V) and bias ``p`` (V); ``eps`` owns nothing.
    ``forward(word_embeddings)`` returns ``{name: (out, in)}`` views of one buffer.
    """

    def __init__(self, config: ShareBertConfig, with_pooler: bool = True):
        super().__init__()
        self.plan = config.column_plan()
        if not with_pooler and config.pooler == "generated":  # its columns stay reserved, just not computed
            self.plan = self.plan.without("pooler")
        self.virtual = config.sharing == "veps"
        if self.virtual:
            self.projection = nn.Parameter(torch.empty(config.word_embedding_size, config.hidden_size))
            self.bias = nn.Parameter(torch.zeros(config.hidden_size))
        self._cache = _SourceCache()

    def virtual_embeddings(self, word_embeddings: torch.Tensor) -> torch.Tensor:
        """The full virtual embedding matrix ``A @ P + p`` (E x V); for analysis, not the forward."""
        return torch.addmm(self.bias, word_embeddings, self.projection) if self.virtual else word_embeddings

    def forward(self, word_embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.virtual:
            return self._cache.get(
                [word_embeddings, self.projection, self.bias],
                lambda: generate_virtual(self.plan, word_embeddings, self.projection, self.bias),
            )
        return self._cache.get([word_embeddings], lambda: generate_from_source(self.plan, word_embeddings))


class LayerMatrices(nn.ParameterDict):
    """``DenseWeights``' matrices, a type of their own for ``_init_weights``: transformers 5 initialises custom
    code module by module, each module's own parameters, so these are initialised where they are held."""


class DenseWeights(nn.Module):
    """Learned encoder matrices for ``sharing='none'``; ``forward()`` returns them as a dict."""

    def __init__(self, config: ShareBertConfig):
        super().__init__()
        self.matrices = LayerMatrices({n: nn.Parameter(torch.empty(s)) for n, s in config.layer_matrices()})

    def forward(self) -> dict[str, torch.Tensor]:
        return dict(self.matrices.items())


class ShareBertLayer(GradientCheckpointingLayer):
    """One encoder layer: attention and feed-forward with its own biases and two LayerNorms."""

    def __init__(self, config: ShareBertConfig):
        super().__init__()
        V = config.hidden_size
        self.names = [n for n, _ in config.layer_matrices()]
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(V, eps=config.layer_norm_eps)
        self.ffn_in_bias = nn.Parameter(torch.zeros(config.intermediate_size))
        self.ffn_out_bias = nn.Parameter(torch.zeros(V))
        self.ffn_norm = nn.LayerNorm(V, eps=config.layer_norm_eps)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.pre_norm = config.norm_position == "pre"

    def forward(self, x, mask, *weights, output_attentions=False, cache=None, layer_idx=0, head_mask=None):
        """``x`` (B, T, V); ``weights`` positional, in ``self.names`` order (for checkpointing); ``cache``: a
        transformers ``Cache`` this layer's keys and values are appended to (slot ``layer_idx``)."""
        w = dict(zip(self.names, weights))
        h = self.attention_norm(x) if self.pre_norm else x
        a, probs = self.attention(h, mask, w, output_attentions, cache, layer_idx, head_mask)
        x = x + self.dropout(a)
        if not self.pre_norm:
            x = self.attention_norm(x)
        h = self.ffn_norm(x) if self.pre_norm else x
        f = F.linear(self.act(F.linear(h, w["ffn_in"], self.ffn_in_bias)), w["ffn_out"], self.ffn_out_bias)
        x = x + self.dropout(f)
        if not self.pre_norm:
            x = self.ffn_norm(x)
        return x, probs


def _copy_(tensor: torch.Tensor, value: torch.Tensor):
    """``init.copy_`` of transformers 5 (torch.nn.init has none): a tensor a checkpoint loaded keeps its values."""
    if not getattr(tensor, "_is_hf_initialized", False):
        with torch.no_grad():
            tensor.copy_(value)


# Every forward() here and in attention.py, and ShareBertConfig.__init__, takes transformers' BERT keywords: its API.
class ShareBertPreTrainedModel(PreTrainedModel):
    config_class = ShareBertConfig
    base_model_prefix = "sharebert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True

    def prune_heads(self, heads_to_prune):
        """Not supported: every layer runs the same generated (or shared) weights, so a head cannot leave one layer."""
        raise NotImplementedError(
            "head pruning is not supported by sharebert models: their layers share generated "
            "weights; mask heads with head_mask instead"
        )

    def _init_weights(self, module):
        """Each module's own tensors. ``init`` leaves alone a tensor a checkpoint loaded (transformers 5
        initialises only what a load left missing, module by module)."""
        std = self.config.initializer_range
        if isinstance(module, WeightGenerator) and module.virtual:
            # A ~ N(0, std) and P ~ N(0, 1/sqrt(F)) give generated weights of std ~ `std`.
            init.normal_(module.projection, 0.0, module.projection.shape[0] ** -0.5)
            init.zeros_(module.bias)
        elif isinstance(module, LayerMatrices):
            for name, p in module.items():
                if name == "pair":  # S_h = I: pairwise starts as symmetric attention
                    d = p.shape[1]
                    _copy_(p, torch.eye(d).repeat(p.shape[0] // d, 1))
                else:
                    init.normal_(p, 0.0, std)
        elif isinstance(module, SelfAttention):
            for p in module.bias.values():
                init.zeros_(p)
            init.zeros_(module.output_bias)
            for p in getattr(module, "scaling", {}).values():
                init.ones_(p)
        elif isinstance(module, ShareBertLayer):
            init.zeros_(module.ffn_in_bias)
            init.zeros_(module.ffn_out_bias)
        elif isinstance(module, ShareBertModel) and hasattr(module, "pooler_bias"):
            init.zeros_(module.pooler_bias)  # a bare Parameter: the only one outside a submodule
        else:  # nn.Linear and nn.Embedding ~ N(0, std), zero biases; LayerNorm ones and zeros
            super()._init_weights(module)

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' resize for ``sharing='none'``; refused where the encoder is generated from the embeddings.

        With EPS/VEPS every encoder weight is cut from columns of length ``vocab_size`` of the embedding
        (or virtual embedding) matrix, so the vocabulary size is part of the encoder's shape: a resize
        would change every generated weight. Build a new model with the vocabulary instead.
        """
        if self.config.sharing != "none":
            raise ValueError(
                f"resize_token_embeddings is not supported with sharing={self.config.sharing!r}: the "
                "encoder's weights are generated from the word embeddings, so vocab_size is part of its "
                "shape; build a new model with the vocabulary (sharebert build --vocab ... or "
                "--set vocab_size=N)"
            )
        return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)


class ShareBertModel(ShareBertPreTrainedModel):
    """The backbone: embeddings, N layers (one shared weight set when sharing), optional pooler."""

    def __init__(self, config: ShareBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = ShareBertEmbeddings(config)
        self.has_pooler = add_pooling_layer and config.pooler != "none"
        if config.sharing != "none":
            self.weight_generator = WeightGenerator(config, with_pooler=self.has_pooler)
        else:
            n_sets = 1 if config.share_layers else config.num_hidden_layers
            self.layer_weights = nn.ModuleList(DenseWeights(config) for _ in range(n_sets))
        self.layers = nn.ModuleList(ShareBertLayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.norm_position == "pre" else None
        )
        self.causal = bool(config.is_decoder)
        if self.has_pooler:
            if config.pooler == "dense":
                self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
            else:  # generated weight, learned bias
                self.pooler_bias = nn.Parameter(torch.zeros(config.hidden_size))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def _head_masks(self, head_mask) -> list:
        """Per layer: ``None`` or the ``(heads,)`` mask of that layer."""
        N = self.config.num_hidden_layers
        if head_mask is None:
            return [None] * N
        if head_mask.dim() == 1:
            return [head_mask] * N
        if head_mask.shape[0] != N:
            raise ValueError(f"head_mask has {head_mask.shape[0]} rows for {N} layers")
        return list(head_mask)

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _depth(self, depth: int | None) -> int:
        """Layers to run: ``depth`` (checked), a sampled depth in training, else all."""
        N = self.config.num_hidden_layers
        if depth is None:
            low = self.config.train_min_depth
            if not (self.training and low):
                return N
            return int(torch.randint(low, N + 1, ()))  # stochastic depth over the shared layers
        if (
            isinstance(depth, torch.Tensor)
            and depth.dim() == 0
            and not depth.is_floating_point()
            and depth.dtype != torch.bool
        ):
            depth = int(depth)
        if isinstance(depth, bool) or not (isinstance(depth, numbers.Integral) and 1 <= depth <= N):
            raise ValueError(f"depth must be an integer in 1..{N} (num_hidden_layers), got {depth!r}")
        return int(depth)

    def generated_weights(self) -> dict[str, torch.Tensor]:
        """The generated matrices ``{name: (out, in)}`` (empty without sharing)."""
        if self.config.sharing == "none":
            return {}
        return self.weight_generator(self.embeddings.word_embeddings.weight)

    def virtual_embeddings(self) -> torch.Tensor:
        """Embeddings the papers evaluate: ``A @ P + p`` for VEPS, else the word embeddings."""
        A = self.embeddings.word_embeddings.weight
        return self.weight_generator.virtual_embeddings(A) if self.config.sharing == "veps" else A

    def _attention_mask(self, attention_mask, T, past, device):
        """Boolean ``(B, 1, T|1, S)`` mask over ``S = past + T`` keys, True where attention is allowed; None if all are.

        Causal: query ``i`` sees keys ``<= past + i``, and always itself, so a left-padding query (whose
        earlier keys are all padding) gets no empty row (an empty row would make NaN that 0-weights spread).
        """
        mask = None
        if attention_mask is not None and (tracing() or not bool(attention_mask.all())):
            mask = attention_mask.bool()[:, None, None, :]
        if self.causal:
            keys = torch.arange(past + T, device=device)[None, :]
            queries = (torch.arange(T, device=device) + past)[:, None]  # positions stay traced, not constants
            causal = (keys <= queries)[None, None]
            mask = causal if mask is None else (mask & causal) | (keys == queries)[None, None]
        return mask

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        head_mask: torch.Tensor | None = None,
        depth: int | None = None,
        cache: Cache | None = None,
        **kwargs,
    ):
        """``cache`` (or ``past_key_values``, its name before transformers 5.2x) and ``use_cache``: a transformers
        ``Cache`` of earlier keys and values (causal models; a ``DynamicCache`` is made when ``use_cache`` and none
        is given). ``head_mask``: ``(heads,)`` or
        ``(layers, heads)``, multiplies attention probabilities per head. ``depth``: run only the first
        ``depth`` layers (1..N; default N, or in training with ``config.train_min_depth`` a depth drawn
        uniformly from ``train_min_depth..N`` per forward): every layer shares the generated weights, so
        a shallower model costs nothing new. ``cache_position`` and other generation keyword arguments
        are accepted and unused."""
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        cache = self._cache(use_cache, cache if cache is not None else past_key_values)
        past = cache.get_seq_length() if cache is not None else 0
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds, position_ids, past)
        T = x.shape[1]
        mask = self._attention_mask(attention_mask, T, past, x.device)
        head_masks = self._head_masks(head_mask)

        generated = self.generated_weights()  # once per forward, shared by every layer
        x, all_hidden, all_attn = self._encode(
            x, mask, head_masks, generated, depth, cache, output_attentions, output_hidden_states
        )
        pooled = self._pool(x, generated) if self.has_pooler else None
        out = BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
            **{CACHE: cache},
        )
        return out if return_dict else out.to_tuple()

    def _cache(self, use_cache: bool | None, cache):
        """The cache this forward reads and extends (a new ``DynamicCache`` when none is given), or None when it
        keeps none: a causal model's, by default only where it helps (generating, not training or exporting)."""
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training and not tracing()
        use_cache = self.causal and use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        return cache if use_cache else None

    # 8: forward's per-call values that every layer reads, passed on from forward's transformers keywords
    def _encode(self, x, mask, head_masks, generated, depth, cache, output_attentions, output_hidden_states):
        """``(x, hidden states or None, attentions or None)`` after the first ``depth`` layers and the final norm."""
        all_hidden, all_attn = ([x] if output_hidden_states else None), ([] if output_attentions else None)
        for i, layer in enumerate(self.layers[: self._depth(depth)]):
            w = generated or self.layer_weights[0 if self.config.share_layers else i]()
            x, probs = layer(
                x,
                mask,
                *(w[n] for n in layer.names),
                output_attentions=output_attentions,
                cache=cache,
                layer_idx=i,
                head_mask=head_masks[i],
            )
            if output_hidden_states:
                all_hidden.append(x)
            if output_attentions:
                all_attn.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if output_hidden_states:
                all_hidden[-1] = x
        return x, all_hidden, all_attn

    def _pool(self, x, generated):
        """The pooler's output: the [CLS] state through a dense or generated projection, then tanh if configured."""
        cls = x[:, 0]
        if self.config.pooler == "dense":
            pooled = self.pooler(cls)
        else:
            pooled = F.linear(cls, generated["pooler"], self.pooler_bias)
        return torch.tanh(pooled) if self.config.pooler_activation == "tanh" else pooled


class ShareBertLMHead(nn.Module):
    """Language-model head ``(B, T, V) -> (B, T, E)``.

    ``tied`` (default, ALBERT-like): ``V -> F`` transform, GELU, LayerNorm, decoder tied to the word
    embeddings ``A`` (E x F); for an unfactorised model this is BERT's head. ``untied`` (the
    reference's): ``V -> V`` transform and an untied ``V x E`` decoder.
    """

    def __init__(self, config: ShareBertConfig):
        super().__init__()
        width = config.word_embedding_size if config.mlm_head == "tied" else config.hidden_size
        self.transform = nn.Linear(config.hidden_size, width)
        self.act = ACT2FN[config.hidden_act]
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(width, config.vocab_size)

    def forward(self, x):
        return self.decoder(self.norm(self.act(self.transform(x))))


class _WithLMHead(ShareBertPreTrainedModel):
    # transformers 5's form, {tied: source}; tied only where config.tie_word_embeddings (mlm_head="tied")
    _tied_weights_keys = {"lm_head.decoder.weight": "sharebert.embeddings.word_embeddings.weight"}
    accepts_loss_kwargs = False  # our loss is a plain mean; Trainer divides by grad accumulation

    def _build(self, config):
        self.sharebert = ShareBertModel(config, add_pooling_layer=False)
        self.lm_head = ShareBertLMHead(config)
        if config.tie_word_embeddings:  # saved once, as the word embeddings: a checkpoint's load misses nothing else
            self._keys_to_ignore_on_save = ["lm_head.decoder.weight"]  # (the Trainer then ties it, without a warning)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new):
        self.lm_head.decoder = new


class ShareBertForMaskedLM(_WithLMHead):
    def __init__(self, config):
        super().__init__(config)
        self._build(config)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        head_mask=None,
        depth=None,
    ):
        """``labels`` (B, T): token ids at masked positions, -100 elsewhere.

        ``logits`` is ``(B, T, E)``, as in BERT. With ``config.mlm_logits_in_training == "masked"``
        (``sharebert pretrain`` sets it), a training forward with labels runs the head only at the
        labelled positions (~15%): the same loss and gradients for a sixth of the head's work, and
        ``logits`` is ``None``.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.sharebert(
            input_ids,
            attention_mask,
            token_type_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
            head_mask=head_mask,
            depth=depth,
        )
        h, logits, loss = out.last_hidden_state, None, None
        if labels is not None and self.training and self.config.mlm_logits_in_training == "masked":
            keep = labels.ne(-100)
            loss = F.cross_entropy(self.lm_head(h[keep]), labels[keep])
        else:
            logits = self.lm_head(h)
            if labels is not None:
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        res = MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
        return res if return_dict else res.to_tuple()


class ShareBertForCausalLM(_WithLMHead, GenerationMixin):
    """Left-to-right language model (causal mask), e.g. character-level LM in the partial Q-K paper."""

    def __init__(self, config):
        if not config.is_decoder:
            config.is_decoder = True
        super().__init__(config)
        self._build(config)

    def prepare_inputs_for_generation(
        self, input_ids, past_key_values=None, attention_mask=None, token_type_ids=None, cache=None, **kwargs
    ):
        """One generation step's inputs: the tokens the cache has not seen, with their token types (a
        tokenizer's ``token_type_ids``, which ``generate`` extends with each new token) and their positions
        counted over the attention mask (so left padding does not shift them), and every other model keyword.

        Beyond ``max_position_embeddings`` tokens the context is a sliding window of the last ones, run
        again from an empty cache (positions cannot grow further).
        """
        P = self.config.max_position_embeddings
        past_key_values = cache if cache is not None else past_key_values  # its name before transformers 5.2x
        kwargs.pop("next_sequence_length", None)  # transformers 5's slicing hint: the cache length says the same
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if input_ids.shape[1] > P:
            input_ids, attention_mask, past = input_ids[:, -P:], attention_mask[:, -P:], 0
            past_key_values = DynamicCache() if past_key_values is not None else None
        if token_type_ids is not None:  # (B, T) like input_ids: the same window, the same new positions
            token_type_ids = token_type_ids[:, -input_ids.shape[1] :][:, past:]
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        kwargs.pop("position_ids", None)  # generate's own, counted without the mask
        return {
            **kwargs,
            "input_ids": input_ids[:, past:],
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids[:, past:],
            CACHE: past_key_values,
        }

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        past_key_values=None,
        use_cache=None,
        head_mask=None,
        depth=None,
        cache=None,
        **kwargs,
    ):
        """``labels`` (B, T): the inputs themselves (shifted inside), -100 to ignore. ``cache`` (or
        ``past_key_values``): a transformers ``Cache`` (returned, extended, in the output when ``use_cache``)."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.sharebert(
            input_ids,
            attention_mask,
            token_type_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            head_mask=head_mask,
            depth=depth,
            cache=cache,
        )
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        res = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{CACHE: getattr(out, CACHE)},
        )
        return res if return_dict else res.to_tuple()


# The modes ``pool`` computes: the three of sentence-transformers' (``sharebert_runtime.pooling.POOLING_MODES``, which
# this file cannot import: it ships as portable code) that a classifier and embedding distillation's loss read.
TORCH_POOLING = ("mean", "cls", "max")


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pooled sentence vectors ``(B, H)`` from token states ``(B, T, H)`` and the attention mask ``(B, T)``; ``mode``
    one of :data:`TORCH_POOLING`."""
    if mode == "cls":
        return hidden[:, 0]
    m = mask.to(hidden.dtype).unsqueeze(-1)
    if mode == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    if mode == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
    raise ValueError(f"pooling {mode!r} is not supported ({', '.join(TORCH_POOLING)})")


def sequence_vector(out, attention_mask, pooling: str) -> torch.Tensor:
    """What a sequence classifier reads ``(B, H)``: the pooler's output where the backbone has one, else
    ``pool`` of the last token states (``classifier_pooling``)."""
    if out.pooler_output is not None:
        return out.pooler_output
    hidden = out.last_hidden_state
    mask = attention_mask if attention_mask is not None else torch.ones(hidden.shape[:2], device=hidden.device)
    return pool(hidden, mask.to(hidden.device), pooling)


class ShareBertForSequenceClassification(ShareBertPreTrainedModel):
    """Classifier on the pooled [CLS] vector, or on the masked mean of the token states (``classifier_pooling=
    "mean"``, no pooler); regression (MSE) when ``num_labels == 1``."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sharebert = ShareBertModel(config, add_pooling_layer=config.classifier_pooling == "cls")
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        head_mask=None,
        depth=None,
    ):
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.sharebert(
            input_ids,
            attention_mask,
            token_type_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
            head_mask=head_mask,
            depth=depth,
        )
        pooled = sequence_vector(out, attention_mask, self.config.classifier_pooling)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                self.config.problem_type = (
                    "regression"
                    if self.num_labels == 1
                    else "single_label_classification"
                    if labels.dtype in (torch.long, torch.int)
                    else "multi_label_classification"
                )
            if self.config.problem_type == "regression":
                loss = F.mse_loss(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype))
            elif self.config.problem_type == "single_label_classification":
                loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        res = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return res if return_dict else res.to_tuple()


class ShareBertForTokenClassification(ShareBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sharebert = ShareBertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        head_mask=None,
        depth=None,
    ):
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.sharebert(
            input_ids,
            attention_mask,
            token_type_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
            head_mask=head_mask,
            depth=depth,
        )
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1), ignore_index=-100)
        res = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return res if return_dict else res.to_tuple()


class ShareBertForQuestionAnswering(ShareBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.sharebert = ShareBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        head_mask=None,
        depth=None,
    ):
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.sharebert(
            input_ids,
            attention_mask,
            token_type_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
            head_mask=head_mask,
            depth=depth,
        )
        start, end = self.qa_outputs(out.last_hidden_state).split(1, dim=-1)
        start, end = start.squeeze(-1), end.squeeze(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            T = start.shape[1]
            loss = (
                F.cross_entropy(start, start_positions.clamp(0, T), ignore_index=T)
                + F.cross_entropy(end, end_positions.clamp(0, T), ignore_index=T)
            ) / 2
        res = QuestionAnsweringModelOutput(
            loss=loss, start_logits=start, end_logits=end, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return res if return_dict else res.to_tuple()


class ShareBertForMultipleChoice(ShareBertPreTrainedModel):
    """Multiple choice as BERT does it: inputs ``(B, C, T)`` (C choices, each paired with the context) run as
    ``B * C`` sequences; a linear scorer on each pooled [CLS] vector gives ``logits`` ``(B, C)``."""

    def __init__(self, config):
        super().__init__(config)
        self.sharebert = ShareBertModel(config, add_pooling_layer=config.classifier_pooling == "cls")
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        position_ids=None,
        head_mask=None,
        depth=None,
    ):
        """``labels`` (B,): the index of the right choice."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(t):  # (B, C, T, ...) -> (B * C, T, ...)
            return None if t is None else t.reshape(-1, *t.shape[2:])

        out = self.sharebert(
            flat(input_ids),
            flat(attention_mask),
            flat(token_type_ids),
            flat(inputs_embeds),
            output_attentions,
            output_hidden_states,
            return_dict=True,
            position_ids=flat(position_ids),
            head_mask=head_mask,
            depth=depth,
        )
        pooled = sequence_vector(out, flat(attention_mask), self.config.classifier_pooling)
        logits = self.classifier(self.dropout(pooled)).view(-1, choices)
        loss = F.cross_entropy(logits, labels.view(-1)) if labels is not None else None
        res = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return res if return_dict else res.to_tuple()


# The Auto class of each model class: ``sharebert.model.registration`` registers them with transformers (and so with
# pipelines and optimum's ORTModel*), and ``make_portable`` names them in a portable folder's ``auto_map``.
AUTO_CLASSES = {
    "AutoModel": ShareBertModel,
    "AutoModelForMaskedLM": ShareBertForMaskedLM,
    "AutoModelForCausalLM": ShareBertForCausalLM,
    "AutoModelForSequenceClassification": ShareBertForSequenceClassification,
    "AutoModelForTokenClassification": ShareBertForTokenClassification,
    "AutoModelForQuestionAnswering": ShareBertForQuestionAnswering,
    "AutoModelForMultipleChoice": ShareBertForMultipleChoice,
}
