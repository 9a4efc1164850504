"""Depth chosen at inference: an exported encoder runs its first ``depth`` layers only.

Every layer of a layer-shared model runs the same generated weights, so running ``k < N`` layers
needs nothing new on disk or in RAM. :func:`wrap_layers` rewrites an exported graph so that each
layer ``i`` runs inside an ONNX ``If(i < depth)``: the then-branch holds the layer's nodes that
depend on its input hidden states, the else-branch passes them (and a causal LM's cache) through.
``depth`` is an optional graph input (an overridable initializer holding ``N``), so a caller that
does not feed it gets the full model (``1 <= depth <= N``; the runtimes refuse other values). Constant
work inside a layer's scope (transposed generated weights, shape constants) stays in the outer graph,
so ONNX Runtime still folds it once at load. :func:`inline_layers` is the inverse (a flat graph for
the passes that derive other graphs from ``model.onnx``).

The gated graph is built so that ONNX Runtime's transformer optimizer (``optimize_model``, which
prunes by explicit node inputs and fuses patterns across the whole model, subgraphs included) writes a
valid model from it:

* every layer is gated, layer 0 too (its ``If`` is true for any valid depth), so every hidden state
  that crosses a layer boundary is an ``If`` output: no fusion pattern (a residual ``Add`` with the
  next layer's LayerNorm as ``SkipLayerNormalization``) spans two graphs;
* each ``If`` outputs the next one's condition (``i + 1 < depth`` where the layer ran, its own false
  condition where it did not), which the next ``If`` reads as its explicit input: the chain of ``If``
  nodes is joined by explicit edges, so no pruning that follows explicit inputs drops a layer whose
  output only the next layer's branches read (from the outer scope);
* a branch output is never a ``Constant`` node's (the optimizer drops a Constant that no node reads).

Layers are found by the exporter's node-name scopes (``.../layers.{i}/...``; a transformers BERT's
``.../encoder/layer.{i}/...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from onnx import TensorProto, helper

from sharebert_runtime.artifact import DEPTH, PAST, PRESENT

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
    """Gate each layer ``i`` of ``model`` (an ``onnx.ModelProto``, changed in place) by a ``depth`` input.

    Layer ``i`` runs inside ``If(i < depth)`` (the else-branch passes its input hidden states, and a causal LM's
    cache, through). Each ``If`` also outputs the next layer's condition (``i + 1 < depth`` when the layer ran,
    false when it did not), and that is the next ``If``'s explicit input; so every value that crosses a layer
    boundary is an ``If`` output, and the chain of ``If`` nodes is joined by explicit edges as well as by the
    hidden states the branches read from the outer scope (see the module docstring: why ONNX Runtime's
    transformer optimizer needs both). Returns ``N`` (0 when the graph has fewer than two layers or is wrapped
    already: nothing changed). Raises :class:`DepthError` when a layer's dynamic values reach anything but the
    next layer's hidden states and the cache outputs.
    """
    g = model.graph
    N = layer_count(g)
    if N < 2 or is_wrapped(g):
        return 0
    dynamic = _dynamic_values(g)
    layer_of = _layer_of(g, dynamic)
    bodies = [[k for k in sorted(layer_of) if layer_of[k] == i] for i in range(N)]
    hidden = _embeddings(g, bodies, dynamic)  # the hidden states entering the current layer
    readers: dict[str, set[int]] = {}
    for k, n in enumerate(g.node):
        for name in node_inputs(n):
            readers.setdefault(name, set()).add(k)
    wrapping = _Wrapping(g, N, dynamic, {o.name for o in g.output}, readers)
    ifs = _condition(0, f"{_IF}0_runs")
    for i in range(N):
        gate, hidden = _gate_layer(wrapping, i, bodies[i], hidden)
        ifs.append(gate)
    rest = [n for k, n in enumerate(g.node) if k not in layer_of]
    order = _topological(rest + ifs)
    del g.node[:]
    g.node.extend(order)
    g.initializer.append(helper.make_tensor(DEPTH, TensorProto.INT64, [], [N]))
    g.input.append(helper.make_tensor_value_info(DEPTH, TensorProto.INT64, []))
    g.ClearField("value_info")
    if model.ir_version < 4:
        model.ir_version = 4  # initializers as overridable inputs need IR 4
    return N


def _dynamic_values(g) -> set[str]:
    """The names of the values that depend on the graph's inputs (initializers do not)."""
    stored = {t.name for t in g.initializer}
    dynamic = {i.name for i in g.input if i.name not in stored}
    for n in g.node:
        if node_inputs(n) & dynamic:
            dynamic.update(n.output)
    return dynamic


def _layer_of(g, dynamic: set[str]) -> dict[int, int]:
    """Node index -> layer index, for the nodes of a layer's scope that compute dynamic values (the constant
    work of a scope stays outside, for ONNX Runtime to fold once)."""
    layer_of = {}
    for k, n in enumerate(g.node):
        m = _LAYER.search(n.name)
        if m and set(n.output) & dynamic:
            layer_of[k] = int(m.group(1))
    return layer_of


def _embeddings(g, bodies: list[list[int]], dynamic: set[str]) -> str:
    """The hidden states entering layer 0: the one dynamic value from outside that layer 0 reads and layer 1
    does not."""
    produced = {o for n in g.node for o in n.output}

    def entering(body: list[int]) -> set[str]:  # dynamic values computed outside the layer that it reads
        inside = {o for k in body for o in g.node[k].output}
        return ({x for k in body for x in node_inputs(g.node[k])} - inside) & dynamic & produced

    first = entering(bodies[0]) - entering(bodies[1])
    if len(first) != 1:
        raise DepthError(f"cannot find the hidden states entering layer 0 (candidates: {sorted(first)})")
    return first.pop()


def _condition(i: int, out: str) -> list:
    """The nodes computing ``out = (i < depth)``."""
    index = f"{_IF}{i}_index"
    return [
        helper.make_node(
            "Constant", [], [index], name=f"{index}_const", value=helper.make_tensor(index, TensorProto.INT64, [], [i])
        ),
        helper.make_node("Less", [index, DEPTH], [out], name=f"{_IF}{i}_less"),
    ]


def _bool_value(name: str):
    return helper.make_tensor_value_info(name, TensorProto.BOOL, [])


def _value(name: str):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


@dataclass(frozen=True)
class _Wrapping:
    """What every layer's gating reads of the graph being wrapped: the graph, its layer count, the values that
    depend on its inputs, its output names and which nodes read each value."""

    g: object
    N: int
    dynamic: set[str]
    outputs: set[str]
    readers: dict[str, set[int]]


def _gate_layer(w: _Wrapping, i: int, body: list[int], hidden: str):
    """Layer ``i``'s ``If`` node (its nodes, ``body``, in the then-branch; the else-branch passes ``hidden`` and the
    cache through) and the hidden states it passes to the next layer."""
    g, N, dynamic, outputs, readers = w.g, w.N, w.dynamic, w.outputs, w.readers
    inside = {o for k in body for o in g.node[k].output}
    leaving = sorted({o for o in inside if o in outputs or any(r not in body for r in readers.get(o, ()))})
    passthrough = {o: PAST + o[len(PRESENT) :] if o.startswith(PRESENT) else hidden for o in leaving}
    nexts = [o for o in leaving if passthrough.get(o) == hidden]
    if len(nexts) != 1 or any(p not in dynamic for p in passthrough.values()):
        raise DepthError(f"layer {i} passes {leaving} on; expected one hidden-state tensor and the cache")
    rename = {o: f"{o}__depth_then" for o in leaving}
    then_nodes = [_renamed(g.node[k], rename) for k in body]
    skip = [
        helper.make_node("Identity", [passthrough[o]], [f"{o}__depth_skip"], name=f"{_IF}{i}_skip_{j}")
        for j, o in enumerate(leaving)
    ]
    then_out, skip_out = [_value(rename[o]) for o in leaving], [_value(f"{o}__depth_skip") for o in leaving]
    results = list(leaving)
    if i + 1 < N:  # the next layer runs when this one did and i + 1 < depth
        runs = f"{_IF}{i + 1}_runs"
        then_nodes += _condition(i + 1, f"{runs}__depth_then")
        skip.append(
            helper.make_node(
                "Identity",
                [f"{_IF}{i}_runs"],
                [f"{runs}__depth_skip"],  # false here
                name=f"{_IF}{i + 1}_never",
            )
        )
        then_out.append(_bool_value(f"{runs}__depth_then"))
        skip_out.append(_bool_value(f"{runs}__depth_skip"))
        results.append(runs)
    then_graph = helper.make_graph(then_nodes, f"layer_{i}", [], then_out)
    else_graph = helper.make_graph(skip, f"layer_{i}_skipped", [], skip_out)
    gate = helper.make_node(
        "If", [f"{_IF}{i}_runs"], results, name=f"{_IF}{i}", then_branch=then_graph, else_branch=else_graph
    )
    return gate, nexts[0]


def _renamed(node, rename: dict[str, str]):
    """A copy of ``node`` whose inputs and outputs named in ``rename`` are renamed."""
    copy = helper.make_node(
        node.op_type,
        [rename.get(x, x) for x in node.input],
        [rename.get(o, o) for o in node.output],
        name=node.name,
        domain=node.domain,
    )
    copy.attribute.extend(node.attribute)
    return copy


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
                if inner.name.startswith(_IF):  # the next layer's condition
                    continue
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
