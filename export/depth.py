"""Depth chosen at inference: an exported encoder runs its first ``depth`` layers only.

Every layer of a layer-shared model runs the same generated weights, so running ``k < N`` layers
needs nothing new on disk or in RAM. :func:`wrap_layers` rewrites an exported graph so that each
layer ``i >= 1`` runs inside an ONNX ``If(i < depth)``: the then-branch holds the layer's nodes that
depend on its input hidden states, the else-branch passes them (and a causal LM's cache) through.
``depth`` is an optional graph input (an overridable initializer holding ``N``), so a caller that
does not feed it gets the full model. Layer 0 always runs (``1 <= depth <= N``). Constant work
inside a layer's scope (transposed generated weights, shape constants) stays in the outer graph,
so ONNX Runtime still folds it once at load. :func:`inline_layers` is the inverse (a flat graph for
the passes that derive other graphs from ``model.onnx``).

Layers are found by the exporter's node-name scopes (``.../layers.{i}/...``; a transformers BERT's
``.../encoder/layer.{i}/...``).
"""
from __future__ import annotations

import re

from onnx import TensorProto, helper

from sharebert.deploy.artifact import DEPTH, PAST, PRESENT

from .graph import node_inputs

_LAYER = re.compile(r"/layers?\.(\d+)/")  # ours: .../layers.{i}/...; transformers BERT: .../encoder/layer.{i}/...
_IF = "sharebert_depth_layer_"  # If node names: _IF + layer index


class DepthError(ValueError):
    """The graph's layers cannot be gated by depth (an unexpected value crosses a layer boundary)."""


def _topological(nodes: list) -> list:
    """``nodes`` ordered so each comes after the producers of what it reads (stable)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    needs = [{producer[i] for i in node_inputs(n) if i in producer} for n in nodes]
    done, order = set(), []
    while len(order) < len(nodes):
        before = len(order)
        for k, n in enumerate(nodes):
            if k not in done and needs[k] <= done:
                done.add(k)
                order.append(n)
        if len(order) == before:
            raise DepthError("the graph has a cycle")
    return order


def layer_count(graph) -> int:
    """Number of encoder layers named in ``graph`` (0 when none)."""
    found = {int(m.group(1)) for n in graph.node for m in [_LAYER.search(n.name)] if m}
    return max(found) + 1 if found else 0


def is_wrapped(graph) -> bool:
    return any(n.op_type == "If" and n.name.startswith(_IF) for n in graph.node)


def wrap_layers(model) -> int:
    """Gate layers ``1..N-1`` of ``model`` (an ``onnx.ModelProto``, changed in place) by a ``depth`` input.

    Returns ``N`` (0 when the graph has fewer than two layers or is wrapped already: nothing changed).
    Raises :class:`DepthError` when a layer's dynamic values reach anything but the next layer's
    hidden states and the cache outputs.
    """
    g = model.graph
    N = layer_count(g)
    if N < 2 or is_wrapped(g):
        return 0
    stored = {t.name for t in g.initializer}
    dynamic = {i.name for i in g.input if i.name not in stored}  # values that depend on the inputs
    for n in g.node:
        if node_inputs(n) & dynamic:
            dynamic.update(n.output)
    layer_of = {}
    for k, n in enumerate(g.node):
        m = _LAYER.search(n.name)
        if m and set(n.output) & dynamic:
            layer_of[k] = int(m.group(1))
    outputs = {o.name for o in g.output}
    readers: dict[str, set[int]] = {}
    for k, n in enumerate(g.node):
        for name in node_inputs(n):
            readers.setdefault(name, set()).add(k)
    hidden = None  # the hidden states leaving the previous layer
    for k in sorted(k for k, i in layer_of.items() if i == 0):
        for out in g.node[k].output:
            if any(layer_of.get(r) == 1 for r in readers.get(out, ())):
                hidden = out
    if hidden is None:
        raise DepthError("cannot find the hidden states passed from layer 0 to layer 1")
    kept, ifs = [], []
    for i in range(1, N):
        body = [k for k in sorted(layer_of) if layer_of[k] == i]
        inside = {o for k in body for o in g.node[k].output}
        leaving = sorted({o for o in inside if o in outputs or any(r not in body for r in readers.get(o, ()))})
        passthrough = {o: PAST + o[len(PRESENT):] if o.startswith(PRESENT) else hidden for o in leaving}
        nexts = [o for o in leaving if passthrough.get(o) == hidden]
        if len(nexts) != 1 or any(p not in dynamic for p in passthrough.values()):
            raise DepthError(f"layer {i} passes {leaving} on; expected one hidden-state tensor and the cache")
        rename = {o: f"{o}__depth_then" for o in leaving}
        then_nodes = []
        for k in body:
            node = g.node[k]
            copy = helper.make_node(node.op_type, [rename.get(x, x) for x in node.input], [rename.get(o, o) for o in node.output],
                                    name=node.name, domain=node.domain)
            copy.attribute.extend(node.attribute)
            then_nodes.append(copy)
        value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
        then_graph = helper.make_graph(then_nodes, f"layer_{i}", [], [value(rename[o]) for o in leaving])
        skip = [helper.make_node("Identity", [passthrough[o]], [f"{o}__depth_skip"], name=f"{_IF}{i}_skip_{j}")
                for j, o in enumerate(leaving)]
        else_graph = helper.make_graph(skip, f"layer_{i}_skipped", [], [value(f"{o}__depth_skip") for o in leaving])
        index, cond = f"{_IF}{i}_index", f"{_IF}{i}_runs"
        ifs += [helper.make_node("Constant", [], [index], name=f"{index}_const",
                                 value=helper.make_tensor(index, TensorProto.INT64, [], [i])),
                helper.make_node("Less", [index, DEPTH], [cond], name=f"{_IF}{i}_less"),
                helper.make_node("If", [cond], leaving, name=f"{_IF}{i}", then_branch=then_graph, else_branch=else_graph)]
        kept.extend(body)
        hidden = nexts[0]
    gated = set(kept)
    rest = [n for k, n in enumerate(g.node) if k not in gated]
    order = _topological(rest + ifs)
    del g.node[:]
    g.node.extend(order)
    g.initializer.append(helper.make_tensor(DEPTH, TensorProto.INT64, [], [N]))
    g.input.append(helper.make_tensor_value_info(DEPTH, TensorProto.INT64, []))
    g.ClearField("value_info")
    if model.ir_version < 4:
        model.ir_version = 4  # initializers as overridable inputs need IR 4
    return N


def inline_layers(model) -> None:
    """Undo :func:`wrap_layers` in place: each layer's nodes back in the graph, no ``depth`` input."""
    g = model.graph
    if not is_wrapped(g):
        return
    nodes = []
    for n in g.node:
        if n.op_type == "If" and n.name.startswith(_IF):
            then = next(a.g for a in n.attribute if a.name == "then_branch")
            rename = {o.name: outer for o, outer in zip(then.output, n.output)}
            for inner in then.node:
                inner.input[:] = [rename.get(x, x) for x in inner.input]
                inner.output[:] = [rename.get(o, o) for o in inner.output]
                nodes.append(inner)
        elif not n.name.startswith(_IF):
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    for field in (g.input, g.initializer):
        keep = [x for x in field if x.name != DEPTH]
        del field[:]
        field.extend(keep)
