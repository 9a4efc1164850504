"""The embedding recipe in the graph: a feature-extraction artifact's ``sentence_embedding`` output.

``add_sentence_embedding`` appends to an exported graph the nodes of a ``sharebert.formats.recipe.EmbeddingRecipe``:
the pooling of ``last_hidden_state (B, T, H)`` under ``attention_mask (B, T)`` and each ``Dense`` layer with
its activation, giving ``sentence_embedding (B, D)``. Normalisation is not in the graph: the manifest's
``embedding.normalize`` says whether the runtime divides by the L2 norm, so ``normalize=False`` can still
be asked of a normalising model. The nodes read only the graph's final output, so layer gating by the
``depth`` input and the RAM-int8 graphs keep working. ``embedding_parity`` checks the nodes against the
numpy pooling of the device runtime (``sharebert_runtime.pooling``) applied to PyTorch's token states.
"""

from __future__ import annotations

import numpy as np

from sharebert.formats.recipe import ACTIVATIONS, EmbeddingRecipe

OUTPUT = "sentence_embedding"
HIDDEN, MASK = "last_hidden_state", "attention_mask"
_P = "sentence_embedding/"


def add_sentence_embedding(proto, recipe: EmbeddingRecipe, dense_weights: list, opset: int) -> None:
    """Append the recipe's pooling and Dense layers to ``proto`` (an ONNX ModelProto whose graph outputs
    ``last_hidden_state`` and takes ``attention_mask``) and its ``sentence_embedding`` output.
    ``dense_weights``: ``(W [out, in], b [out] or None)`` per Dense layer."""
    from onnx import TensorProto, helper, numpy_helper

    g = proto.graph
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), _P + name))
        return _P + name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [_P + name], name=_P + name, **attrs))
        return _P + name

    def reduce(op, x, name):  # over the token axis, keeping it; axes became an input in opset 18 (13 for ReduceSum)
        if op == "ReduceSum" or opset >= 18:
            return node(op, [x, const(name + ".axes", np.array([1], np.int64))], name, keepdims=0)
        return node(op, [x], name, axes=[1], keepdims=0)

    def row(x, index, name):  # x[b, index[b], :] for index (B, 1) int64
        idx = node("Unsqueeze", [index, const(name + ".axis", np.array([2], np.int64))], name + ".idx3")
        shape = node("Shape", [x], name + ".shape")
        wide = node(
            "Concat",
            [
                node(
                    "Slice",
                    [shape, const(name + ".s0", np.array([0], np.int64)), const(name + ".s1", np.array([1], np.int64))],
                    name + ".b",
                ),
                const(name + ".one", np.array([1], np.int64)),
                node(
                    "Slice",
                    [shape, const(name + ".s2", np.array([2], np.int64)), const(name + ".s3", np.array([3], np.int64))],
                    name + ".h",
                ),
            ],
            name + ".target",
            axis=0,
        )
        picked = node("GatherElements", [x, node("Expand", [idx, wide], name + ".idx")], name + ".rows", axis=1)
        return node("Squeeze", [picked, const(name + ".sq", np.array([1], np.int64))], name)

    mask_f = node(
        "Unsqueeze",
        [node("Cast", [MASK], "mask_f", to=TensorProto.FLOAT), const("axis2", np.array([2], np.int64))],
        "mask3",
    )  # (B, T, 1)
    mode = recipe.pooling
    if mode == "cls":
        x = row(HIDDEN, node("ArgMax", [MASK], "first", axis=1, keepdims=1), "pooled")
    elif mode == "lasttoken":
        masked = node("Mul", [HIDDEN, mask_f], "masked")
        x = row(masked, node("ArgMax", [MASK], "last", axis=1, keepdims=1, select_last_index=1), "pooled")
    elif mode == "max":
        real = node("Greater", [mask_f, const("zero", np.array(0, np.float32))], "real")
        x = reduce(
            "ReduceMax", node("Where", [real, HIDDEN, const("ninf", np.array(-np.inf, np.float32))], "filled"), "pooled"
        )
    else:
        weights = mask_f
        if mode == "weightedmean":
            T = node("Gather", [node("Shape", [HIDDEN], "hshape"), const("i1", np.array(1, np.int64))], "T", axis=0)
            pos = node(
                "Range",
                [
                    const("r0", np.array(1, np.int64)),
                    node("Add", [T, const("r1", np.array(1, np.int64))], "T1"),
                    const("rd", np.array(1, np.int64)),
                ],
                "pos",
            )
            pos = node(
                "Reshape",
                [node("Cast", [pos], "pos_f", to=TensorProto.FLOAT), const("pshape", np.array([1, -1, 1], np.int64))],
                "pos3",
            )
            weights = node("Mul", [mask_f, pos], "weights")
        total = reduce("ReduceSum", node("Mul", [HIDDEN, weights], "weighted"), "sum")
        count = node(
            "Max", [reduce("ReduceSum", weights, "count"), const("eps", np.array(1e-9, np.float32))], "count_c"
        )
        if mode == "mean_sqrt_len":
            count = node("Sqrt", [count], "sqrt_count")
        x = node("Div", [total, count], "pooled")
    for i, (layer, (w, b)) in enumerate(zip(recipe.dense, dense_weights)):
        x = node(
            "MatMul",
            [x, const(f"dense{i}.weight", np.ascontiguousarray(np.asarray(w, np.float32).T))],
            f"dense{i}.matmul",
        )
        if b is not None:
            x = node("Add", [x, const(f"dense{i}.bias", np.asarray(b, np.float32))], f"dense{i}.add")
        op = ACTIVATIONS[layer.activation]
        if op == "Gelu":  # torch's exact GELU, 0.5 x (1 + erf(x / sqrt 2)), in ops every opset has
            erf = node(
                "Erf",
                [node("Mul", [x, const(f"dense{i}.rsqrt2", np.array(2**-0.5, np.float32))], f"dense{i}.scaled")],
                f"dense{i}.erf",
            )
            half = node("Mul", [x, const(f"dense{i}.half", np.array(0.5, np.float32))], f"dense{i}.half_x")
            x = node(
                "Mul",
                [half, node("Add", [erf, const(f"dense{i}.one", np.array(1.0, np.float32))], f"dense{i}.erf1")],
                f"dense{i}.gelu",
            )
        elif op != "Identity":
            x = node(op, [x], f"dense{i}.{op.lower()}")
    nodes.append(helper.make_node("Identity", [x], [OUTPUT], name=_P + "output"))
    g.node.extend(nodes)
    g.initializer.extend(inits)
    width = recipe.dense[-1].out_features if recipe.dense else _hidden_width(g)
    g.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch_size", width]))


def _hidden_width(graph):
    """The last dimension of the graph's ``last_hidden_state`` output (a number, or its symbolic name)."""
    for o in graph.output:
        if o.name == HIDDEN:
            dim = o.type.tensor_type.shape.dim[-1]
            return dim.dim_value or dim.dim_param or "hidden_size"
    raise ValueError(f"the graph has no {HIDDEN} output to pool")


def reference(hidden: np.ndarray, mask: np.ndarray, recipe: EmbeddingRecipe, dense_weights: list) -> np.ndarray:
    """The recipe in numpy (before normalisation): ``(B, D)`` float64 from token states ``(B, T, H)``."""
    from sharebert_runtime.pooling import pool

    x = pool(hidden, mask, recipe.pooling).astype(np.float64)
    for layer, (w, b) in zip(recipe.dense, dense_weights):
        x = x @ np.asarray(w, np.float64).T + (0 if b is None else np.asarray(b, np.float64))
        op = ACTIVATIONS[layer.activation]
        if op == "Tanh":
            x = np.tanh(x)
        elif op == "Relu":
            x = np.maximum(x, 0)
        elif op == "Sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif op == "Gelu":
            from math import erf, sqrt

            x = 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))
    return x


def embedding_parity(check, session, recipe: EmbeddingRecipe, dense_weights: list, batch_size: int = 32) -> dict:
    """The graph's ``sentence_embedding`` against the recipe applied to PyTorch's token states, normalised as
    the recipe says: ``max_abs_diff``, ``cosine_mean`` and ``cosine_min`` over the check's sentences
    (``check``: :class:`parity.Check`)."""
    import torch

    from sharebert_runtime.artifact import model_feeds
    from sharebert_runtime.pooling import l2_normalize

    from .parity import encode

    sentences = check.sentences
    names = {i.name for i in session.get_inputs()}
    diffs, cosines = [], []
    for start in range(0, len(sentences), batch_size):
        feeds = encode(check.tokenizer, sentences[start : start + batch_size], check.max_length)
        feeds = {
            **model_feeds(session.get_inputs(), feeds["input_ids"], feeds["attention_mask"]),
            **{k: v for k, v in feeds.items() if k in names},
        }
        with torch.no_grad():
            hidden = check.model(
                **{
                    k: torch.from_numpy(v)
                    for k, v in feeds.items()
                    if k in ("input_ids", "attention_mask", "token_type_ids")
                }
            ).last_hidden_state
        want = reference(hidden.float().numpy(), feeds["attention_mask"], recipe, dense_weights)
        got = session.run([OUTPUT], feeds)[0].astype(np.float64)
        if recipe.normalize:
            want, got = l2_normalize(want), l2_normalize(got)
        diffs.append(float(np.abs(got - want).max()))
        cosines.append(
            float(
                (
                    (got * want).sum(-1)
                    / np.maximum(np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1), 1e-30)
                ).min()
            )
        )
    return {
        "sentences": len(sentences),
        "max_abs_diff": max(diffs),
        "cosine_mean": float(np.mean(cosines)),
        "cosine_min": min(cosines),
    }
