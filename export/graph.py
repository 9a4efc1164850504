"""ONNX graph surgery for compact and materialized exports.

A *constant* tensor is computable from initializers and ``Constant`` nodes alone (e.g. a generated
weight ``Split(MatMul(...))`` or ``Transpose(E)``). Two constants with the same *structural key*
(same op, attributes and input keys) hold the same value, so each is computed or stored once.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sharebert_runtime.artifact import session_options

# Ops that only move or select numbers: a constant built from one learned tensor with these alone
# is a view of it (materializing it would store a copy of a learned tensor, not a generated weight).
LAYOUT_OPS = {
    "Constant",
    "Identity",
    "Transpose",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Slice",
    "Split",
    "Gather",
    "Concat",
    "Shape",
    "Cast",
    "Flatten",
    "Expand",
}
PRODUCT_OPS = ("MatMul", "Gemm")


def constant_keys(graph) -> dict[str, str]:
    """``{tensor name: structural key}`` for every constant tensor of ``graph`` (in node order)."""
    keys = {t.name: "init:" + t.name for t in graph.initializer}
    for node in graph.node:
        inputs = [i for i in node.input if i]
        if not all(i in keys for i in inputs):
            continue
        attrs = sorted((a.name, repr(helper.get_attribute_value(a))) for a in node.attribute)
        body = repr((node.domain, node.op_type, attrs, [keys.get(i, "") for i in node.input]))
        digest = hashlib.sha256(body.encode()).hexdigest()[:24]
        for index, out in enumerate(node.output):
            keys[out] = f"{digest}:{index}"
    return keys


def computed_products(graph, keys: dict[str, str] | None = None) -> list[tuple[object, str | None]]:
    """``(node, layout)`` for each MatMul/Gemm of an activation by a weight computed from initializers.

    ``layout``: ``"kn"`` for a MatMul's ``B`` ``(K, N)``, ``"nk"`` for a plain Gemm with ``transB``
    ``(N, K)``, None for another Gemm. ``DequantizeLinear`` of an initializer (a QDQ weight) does not
    count: it is a stored int8 weight.
    """
    keys = constant_keys(graph) if keys is None else keys
    stored = {t.name for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    return [
        (node, _product_layout(node)) for node in graph.node if _reads_computed_weight(node, keys, stored, producer)
    ]


def _reads_computed_weight(node, keys: dict, stored: set, producer: dict) -> bool:
    """``node`` is a standard MatMul/Gemm of an activation by a weight computed from initializers (not stored, and
    not ``DequantizeLinear`` of a stored int8 weight)."""
    if node.op_type not in PRODUCT_OPS or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return False
    x, w = node.input[0], node.input[1]
    if x in keys or w not in keys or w in stored:
        return False
    p = producer.get(w)
    return not (p is not None and p.op_type == "DequantizeLinear" and p.input[0] in stored)


def _product_layout(node) -> str | None:
    """``"kn"`` for a MatMul, ``"nk"`` for a plain Gemm with ``transB``, None for another Gemm."""
    if node.op_type == "MatMul":
        return "kn"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plain = attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
    return "nk" if plain and attrs.get("transB", 0) == 1 else None


def computed_product_weights(graph) -> list[str]:
    """Names of MatMul/Gemm weight inputs that are computed from initializers, not stored."""
    return [node.input[1] for node, _ in computed_products(graph)]


def node_inputs(node) -> set[str]:
    """Every value ``node`` reads, including outer-scope values its subgraphs (If/Loop bodies) read."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for g in [attr.g] if attr.type == attr.GRAPH else list(attr.graphs):
            produced = (
                {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
            )
            names |= {i for n in g.node for i in node_inputs(n)} - produced
    return names


def gather_before_dequantize(model) -> int:
    """``Gather(DequantizeLinear(q, scale, axis=0), ids)`` -> ``Cast(Gather(q, ids)) * Gather(scale, ids)[..., None]``.

    For a table stored int8 per row (``q`` ``(rows, width)``, ``scale`` ``(rows,)``, no zero point) the same
    numbers, but only the gathered rows are dequantized: ONNX Runtime does not fold the whole table to
    fp32 at load. Returns the number of rewritten Gathers (``model`` changed in place).
    """
    g = model.graph
    stored = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    nodes, count = [], 0
    for node in g.node:
        dq = producer.get(node.input[0]) if node.op_type == "Gather" else None
        axis = {a.name: helper.get_attribute_value(a) for a in node.attribute}.get("axis", 0)
        if (
            dq is None
            or dq.op_type != "DequantizeLinear"
            or axis != 0
            or len(dq.input) > 2
            or any(a.name == "axis" and a.i != 0 for a in dq.attribute)
            or not all(i in stored for i in dq.input)
            or len(stored[dq.input[1]].dims) != 1
        ):
            nodes.append(node)
            continue
        (q, scale), ids, out = dq.input, node.input[1], node.output[0]
        tag = f"{node.name or out}/rows"
        nodes += [
            helper.make_node("Gather", [q, ids], [f"{tag}.q"], name=f"{tag}.q"),
            helper.make_node("Gather", [scale, ids], [f"{tag}.scale"], name=f"{tag}.scale"),
            helper.make_node(
                "Constant",
                [],
                [f"{tag}.last"],
                name=f"{tag}.last",
                value=numpy_helper.from_array(np.array([-1], np.int64)),
            ),
            helper.make_node("Unsqueeze", [f"{tag}.scale", f"{tag}.last"], [f"{tag}.scale_col"], name=f"{tag}.col"),
            helper.make_node("Cast", [f"{tag}.q"], [f"{tag}.float"], name=f"{tag}.cast", to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", [f"{tag}.float", f"{tag}.scale_col"], [out], name=f"{tag}.mul"),
        ]
        count += 1
    replace_all(g.node, nodes)
    prune(model)
    return count


def prune(model) -> None:
    """Drop nodes no graph output depends on, and initializers nothing reads."""
    g = model.graph
    stored = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    wanted, stack = set(), [o.name for o in g.output]
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if name in stored or node is None or id(node) in wanted:
            continue
        wanted.add(id(node))
        stack.extend(node_inputs(node))
    kept = [n for n in g.node if id(n) in wanted]
    used = {i for n in kept for i in node_inputs(n)} | {o.name for o in g.output}
    inits = [t for t in g.initializer if t.name in used]
    replace_all(g.node, kept)
    replace_all(g.initializer, inits)


def replace_all(field, items) -> None:
    """Make the repeated proto ``field`` hold copies of ``items`` (which may be its own elements)."""
    copies = [type(i)() for i in items]
    for c, i in zip(copies, items):
        c.CopyFrom(i)
    del field[:]
    field.extend(copies)


def _rewire(model, rename: dict[str, str]) -> None:
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name in rename:
                node.input[k] = rename[name]


def remove_initializer_inputs(model) -> int:
    """Remove graph inputs that are also initializers (they block ORT's constant folding)."""
    stored = {t.name for t in model.graph.initializer}
    keep = [i for i in model.graph.input if i.name not in stored]
    removed = len(model.graph.input) - len(keep)
    replace_all(model.graph.input, keep)
    return removed


def dedup_constants(model) -> int:
    """Make equal constant subexpressions (e.g. one ``Transpose`` of a generated weight per layer)
    a single node, so ONNX Runtime folds each generated weight into one tensor. Returns nodes removed."""
    keys = constant_keys(model.graph)
    stored = {t.name for t in model.graph.initializer}
    first, rename = {}, {}
    for name, key in keys.items():
        if name in stored:
            continue
        if key in first:
            rename[name] = first[key]
        else:
            first[key] = name
    before = len(model.graph.node)
    _rewire(model, rename)
    prune(model)
    return before - len(model.graph.node)


def evaluate(model, names: list[str]) -> dict[str, np.ndarray]:
    """Values of constant tensors ``names`` of ``model`` (runs their subgraph in ONNX Runtime)."""
    import onnxruntime as ort

    sub = onnx.ModelProto()
    sub.CopyFrom(model)
    g = sub.graph
    del g.input[:], g.output[:], g.value_info[:]
    g.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    prune(sub)
    so = session_options(level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    session = ort.InferenceSession(sub.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {})))


def materialize(model, views: bool = False) -> dict:
    """Store every generated weight as an initializer (in place); return what was folded.

    Folds each constant that a runtime node reads and that involves arithmetic. Views of a single
    learned tensor (such as the tied decoder's ``Transpose(E)``) stay nodes, unless ``views`` is set
    and they are a MatMul/Gemm weight (so that a quantizer that needs stored weights sees them).
    Equal constants are stored once.
    """
    g = model.graph
    keys = constant_keys(g)
    arithmetic = _arithmetic_constants(g, keys)
    frontier, representative = _fold_frontier(g, keys, arithmetic, views)
    if not representative:
        return {"folded_tensors": 0, "folded_numel": 0}
    values = evaluate(model, list(representative.values()))
    _rewire(model, {n: r for n, r in frontier.items() if n != r})
    producers = {o for n in g.node for o in n.output}
    for name, value in values.items():
        assert name in producers
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
    # The folded names now come from initializers: drop their producer nodes, then what is unused.
    kept = [n for n in g.node if not any(o in values for o in n.output)]
    replace_all(g.node, kept)
    prune(model)
    return {"folded_tensors": len(values), "folded_numel": int(sum(v.size for v in values.values()))}


def _arithmetic_constants(g, keys: dict) -> dict[str, bool]:
    """For each constant node output: whether it involves arithmetic (not only layout ops over a stored tensor)."""
    arithmetic = {}
    for node in g.node:
        inputs = [i for i in node.input if i]
        if node.output and node.output[0] in keys:
            value = node.op_type not in LAYOUT_OPS or any(arithmetic.get(i, False) for i in inputs)
            for out in node.output:
                arithmetic[out] = value
    return arithmetic


def _fold_frontier(g, keys: dict, arithmetic: dict, views: bool) -> tuple[dict[str, str], dict[str, str]]:
    """``(frontier, representative)``: each constant a runtime node reads that is to be folded, mapped to the first
    name of its structural key; and that first name by key."""
    frontier: dict[str, str] = {}  # name -> representative with the same key
    representative: dict[str, str] = {}
    for node in g.node:
        if node.output and node.output[0] in keys:
            continue
        for k, name in enumerate(node.input):
            view_weight = views and k == 1 and node.op_type in PRODUCT_OPS and name in arithmetic
            if name and (arithmetic.get(name) or view_weight):
                frontier[name] = representative.setdefault(keys[name], name)
    return frontier, representative


def stored_tensors(model, min_numel: int = 1) -> dict[str, dict]:
    """``{dtype: {"tensors": n, "numel": n, "bytes": n}}`` over initializers and Constant nodes
    holding at least ``min_numel`` numbers (2 leaves out scalars such as a LayerNorm epsilon)."""
    out: dict[str, dict] = {}
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for t in tensors:
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        numel = int(np.prod(t.dims)) if len(t.dims) else 1
        if numel < min_numel:
            continue
        entry = out.setdefault(np.dtype(dtype).name, {"tensors": 0, "numel": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["numel"] += numel
        entry["bytes"] += numel * np.dtype(dtype).itemsize
    return out


def split_at_constants(model, min_bytes: int = 256):
    """``(generator, compute, names)``: ``model`` (flat, not changed) cut where its constant part meets
    the part that depends on the inputs.

    ``names`` are the distinct constant tensors that input-dependent nodes read and that depend on an
    initializer of at least ``min_bytes`` (the learned tensors and the generated weights, one name per
    structural key). ``generator`` has no input and outputs ``names``; ``compute`` is ``model`` with
    ``names`` as typed graph inputs and their producers (and what only they read) removed, so it
    stores no tensor of ``min_bytes`` or more. Smaller constants (shapes, scalars) stay in ``compute``.
    """
    g = model.graph
    keys = constant_keys(g)
    sizes = {
        t.name: int(np.prod(t.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        for t in g.initializer
    }
    producer = {o: n for n in g.node for o in n.output}
    large: dict[str, bool] = {}

    def reads_large(name: str) -> bool:  # iterative: a deep chain of constant nodes must not recurse
        stack = [name]
        while stack:
            top = stack[-1]
            if top in large:
                stack.pop()
                continue
            node = producer.get(top)
            pending = [i for i in (node.input if node is not None else ()) if i and i not in large]
            if pending:
                stack.extend(pending)
                continue
            large[top] = sizes.get(top, 0) >= min_bytes or any(
                large.get(i, False) for i in (node.input if node else ()) if i
            )
            stack.pop()
        return large[name]

    representative: dict[str, str] = {}
    rename: dict[str, str] = {}
    for node in g.node:
        if node.output and node.output[0] in keys:
            continue
        for name in node.input:
            if name in keys and name not in rename and reads_large(name):
                rename[name] = representative.setdefault(keys[name], name)
    names = list(representative.values())
    types = {t.name: t.data_type for t in g.initializer}
    inferred = onnx.shape_inference.infer_shapes(model)
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info})

    return _generator_part(model, names, types), _compute_part(model, rename, names, types), names


def _generator_part(model, names: list[str], types: dict):
    """``model``'s constant part, no input, ``names`` its outputs."""
    generator = onnx.ModelProto()
    generator.CopyFrom(model)
    gg = generator.graph
    del gg.input[:], gg.output[:], gg.value_info[:]
    gg.output.extend(helper.make_tensor_value_info(n, types[n], None) for n in names)
    prune(generator)
    gg.name = f"{model.graph.name or 'model'}_generator"
    return generator


def _compute_part(model, rename: dict[str, str], names: list[str], types: dict):
    """``model`` reading ``names`` as graph inputs (each constant renamed to its representative), their producers
    and what only they read removed."""
    compute = onnx.ModelProto()
    compute.CopyFrom(model)
    c = compute.graph
    _rewire(compute, rename)
    moved = set(names)
    replace_all(c.node, [n for n in c.node if not any(o in moved for o in n.output)])
    replace_all(c.initializer, [t for t in c.initializer if t.name not in moved])
    c.input.extend(helper.make_tensor_value_info(n, types[n], None) for n in names)
    prune(compute)
    c.ClearField("value_info")
    return compute
