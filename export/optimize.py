"""ONNX Runtime's transformer fusions on a sharebert graph (``sharebert export --optimize``).

``fuse(path, config)`` runs ``onnxruntime.transformers.optimizer.optimize_model`` (``model_type="bert"``,
the fusions only: ``opt_level=0``, so nothing is constant-folded into the file and the generated weights
stay graph nodes that ONNX Runtime folds at session creation) on ``path`` in place: LayerNormalization,
SkipLayerNormalization, (Bias)Gelu and, where the pattern matches, Attention. The depth gating survives:
ORT's graph pruning follows a node's explicit inputs only, so an ``If`` whose output is read nowhere but
inside the next layer's ``If`` branches (implicitly, from the outer scope) would be pruned and the model left
invalid, and its fusions see through ``If`` boundaries (a residual ``Add`` of one layer fused with the
next layer's LayerNorm inside a branch, the value the skip branch passes on gone). Every value the
branches read from the outer scope reaches them through an ``Identity`` in the main graph whose output is
a graph output while the optimizer runs (``_fence``): nothing prunes it, no fusion pattern spans it, and
ONNX Runtime removes the Identity at session creation.
"""
from __future__ import annotations

from pathlib import Path

from .graph import node_inputs


def _read_by_subgraphs(model) -> dict[str, int]:
    """Main-graph values that ``If`` branches read from the outer scope and that are not graph outputs, with
    their element types: ``{name: onnx.TensorProto dtype}``."""
    import onnx

    graph = model.graph
    explicit = {i for n in graph.node for i in n.input}
    implicit = {i for n in graph.node for i in node_inputs(n)} - explicit
    produced = {o for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    types = {v.name: v.type.tensor_type.elem_type for v in inferred}
    return {name: types.get(name) or onnx.TensorProto.FLOAT for name in sorted(implicit & produced - outputs)}


def _fence(model) -> list[str]:
    """Give each value the ``If`` branches read from the outer scope a main-graph reader and a graph output: the
    branches read ``name__outer = Identity(name)`` instead, a graph output while the optimizer runs, so no
    pruning removes it and no fusion reaches through the branch boundary. Returns the added output names."""
    from onnx import helper

    graph = model.graph
    values = _read_by_subgraphs(model)
    outer = {name: f"{name}__outer" for name in values}

    def rename(g):
        for node in g.node:
            node.input[:] = [outer.get(i, i) for i in node.input]
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == attr.GRAPH else list(attr.graphs)):
                    rename(sub)

    nodes = []
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == attr.GRAPH else list(attr.graphs)):
                rename(sub)
        nodes.append(node)
        nodes += [helper.make_node("Identity", [o], [outer[o]], name=f"{o}__fence") for o in node.output if o in outer]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.output.extend(helper.make_tensor_value_info(outer[name], dtype, None) for name, dtype in values.items())
    return list(outer.values())


def fuse(path: str | Path, config) -> dict[str, int]:
    """Apply ONNX Runtime's BERT fusions to the fp32 graph at ``path`` (rewritten in place) of a model with
    ``config`` (heads and hidden size); returns the fused operators' counts (those above 0)."""
    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    model = onnx.load(str(path))
    fenced = set(_fence(model))
    options = FusionOptions("bert")
    options.enable_shape_inference = False  # symbolic shapes do not follow values into If branches
    optimized = optimize_model(model, model_type="bert", num_heads=int(config.num_attention_heads),
                               hidden_size=int(config.hidden_size), opt_level=0, use_gpu=False,
                               optimization_options=options)
    graph = optimized.model.graph
    keep = [o for o in graph.output if o.name not in fenced]
    del graph.output[:]
    graph.output.extend(keep)
    onnx.save(optimized.model, str(path))
    return {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
