"""Row-int8 compute for the teacher's pass: the artifact's graph with each MatMul by a constant weight run as an int8
product whose activations are quantized per row (per token), for the teacher's sentence vectors on a CPU.

The artifact's own RAM int8 (``ram="int8"``: ``DynamicQuantizeMatMul``) quantizes a call's activations with one scale
for the whole batch: a token of large activations coarsens every other token's, and all-MiniLM-L6-v2's vectors fell to
mean cosine 0.9825 to fp32 (below the teacher's 0.99 bar). Here each row of ``x`` (one token, ``K`` numbers) gets its
own scale, ``s = max|x_row| / 127``, quantized by ``QuantizeLinear`` along the rows to uint8 with zero point 128; the
product is ``MatMulIntegerToFloat`` (the int8 weights' per-column scales folded in) times ``s``. Weights are int8 per
output channel in ``[-INT8_WEIGHT_MAX, INT8_WEIGHT_MAX]`` (``quantize_per_channel``), so a pair of uint8 x int8
products fits int16 on every CPU's kernel (docs/DEVICE.md, "int8 on every CPU"): CPU-independent by construction.
Attention's value projections stay fp32 (:func:`value_products`): their rounding was most of the loss on real
activations (all-MiniLM-L6-v2 grown to 768 wide, ``benchmarks/real_teachers.py``'s mpnet-109m: bound 0.9878 with
them, refused; 0.9920 without, kept).

The graph is written beside the artifact's files, in ``row_int8/`` (``model.onnx`` stays the artifact's one top-level
graph, and its manifest is unchanged); whether the pass may use it is measured by ``pipelines.teacher_pass``
and recorded in ``row_int8/parity.json``. On the 2-core x86-64 box with AVX2 (no VNNI), measured side by side
(``benchmarks/teacher_pass.md``): a 768-wide teacher's pass runs ~1.5x faster than in fp32; a 384-wide one
(all-MiniLM-L6-v2) ~1.1x, the per-row quantization's extra passes over the activations eating most of the gain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sharebert.training.teacher_vectors import ROW_INT8_GRAPH, ROW_INT8_RECORD
from sharebert_runtime.artifact import quantize_per_channel

MIN_WIDTH = 768  # narrower teachers gain ~1.1x (all-MiniLM-L6-v2, 384): not worth the check's cost
MIN_WEIGHT_NUMEL = 4096  # smaller weights stay fp32 (as ram_int8's)
ROW_LEVELS = 127  # |x_row| / max|x_row| * 127, zero point 128: uint8 in [1, 255]


def graph_path(artifact) -> Path:
    return Path(artifact).joinpath(*ROW_INT8_GRAPH)


def record_path(artifact) -> Path:
    """Where ``pipelines.teacher_pass`` records the check of the graph's vectors against the artifact's fp32 compute."""
    return Path(artifact).joinpath(*ROW_INT8_RECORD)


def constant_weight(name: str, producers: dict, initializers: dict) -> np.ndarray | None:
    """The fp32 ``(K, N)`` value of a MatMul's ``B`` when it is constant: an initializer, or ``Transpose`` of
    ``DequantizeLinear`` of initializers (how an int8-stored artifact holds a ``Linear``'s weight); else None."""
    from onnx import numpy_helper

    if name in initializers:
        return numpy_helper.to_array(initializers[name]).astype(np.float32)
    transpose = producers.get(name)
    if transpose is None or transpose.op_type != "Transpose":
        return None
    dq = producers.get(transpose.input[0])
    if dq is None or dq.op_type != "DequantizeLinear" or not all(i in initializers for i in dq.input if i):
        return None
    q, scale, *zero = (numpy_helper.to_array(initializers[i]).astype(np.float32) for i in dq.input if i)
    zero = zero[0] if zero else np.float32(0)
    if scale.ndim == 1 and scale.size > 1:  # per-axis: broadcast along the attribute's axis
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape) if np.ndim(zero) else zero
    weight = (q - zero) * scale
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
    return np.ascontiguousarray(weight.transpose(perm) if perm else weight.T)


class _Rewrite:
    """The new node list, the initializers it adds, and each activation's quantization (made once: Q, K and V share
    the one of their input)."""

    def __init__(self):
        from onnx import helper

        self.helper, self.nodes, self.initializers, self.rows = helper, [], [], {}
        for name, value in (
            ("ri8_inverse_levels", np.float32(1 / ROW_LEVELS)),
            ("ri8_tiny", np.float32(1e-30)),  # an all-zero row: scale stays positive
            ("ri8_zero_point", np.uint8(128)),
            ("ri8_one", np.float32(1)),
            ("ri8_start", np.array([0], np.int64)),
            ("ri8_last", np.array([-1], np.int64)),
            ("ri8_unit", np.array([1], np.int64)),
        ):
            self.constant(name, value)

    def constant(self, name: str, value) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        domain = "com.microsoft" if op == "MatMulIntegerToFloat" else ""
        self.nodes.append(self.helper.make_node(op, inputs, [output], domain=domain, **attrs))
        return output

    def quantized_rows(self, x: str, width: int) -> tuple[str, str, str]:
        """``(uint8 rows (M, K), their scales (..., 1), the leading shape of x)`` for activation ``x``."""
        if x not in self.rows:
            from onnx import numpy_helper

            p, n = f"ri8_{len(self.rows)}_", self.node
            flat = n("Reshape", [x, self.constant(p + "flat_shape", np.array([-1, width], np.int64))], p + "flat")
            high = n("ReduceMax", [flat], p + "high", axes=[1], keepdims=0)
            low = n("Neg", [n("ReduceMin", [flat], p + "low", axes=[1], keepdims=0)], p + "neg_low")
            scale = n("Mul", [n("Max", [high, low, "ri8_tiny"], p + "absmax"), "ri8_inverse_levels"], p + "scale")
            zero = numpy_helper.from_array(np.array([128], np.uint8))
            points = n("ConstantOfShape", [n("Shape", [scale], p + "rows")], p + "zero_points", value=zero)
            q = n("QuantizeLinear", [flat, scale, points], p + "q", axis=0)
            lead = n("Slice", [n("Shape", [x], p + "shape"), "ri8_start", "ri8_last"], p + "lead")
            scale_shape = n("Concat", [lead, "ri8_unit"], p + "scale_shape", axis=0)
            self.rows[x] = (q, n("Reshape", [scale, scale_shape], p + "row_scale"), lead)
        return self.rows[x]

    def product(self, matmul, weight: np.ndarray) -> None:
        """``matmul``'s output as the row-int8 product of its input and ``weight`` ``(K, N)``."""
        q, row_scale, lead = self.quantized_rows(matmul.input[0], weight.shape[0])
        p, n = f"ri8_p{len(self.nodes)}_", self.node
        w8, w_scale = quantize_per_channel(weight, "kn")
        out = n(
            "MatMulIntegerToFloat",
            [q, self.constant(p + "w", w8), "ri8_one", self.constant(p + "w_scale", w_scale), "ri8_zero_point"],
            p + "flat_out",
        )
        width = self.constant(p + "width", np.array([weight.shape[1]], np.int64))
        shape = n("Concat", [lead, width], p + "shape", axis=0)
        # reshaped before the row scale's Mul, so the Mul writes the output once (after it, ORT copied it: 7% more)
        n("Mul", [n("Reshape", [out, shape], p + "out"), row_scale], matmul.output[0])


def row_int8_graph(model):
    """``(model rewritten, products replaced)``: ``model`` (an ``onnx.ModelProto``, top-level graph only: an ``If``
    branch's products stay fp32) with each MatMul by a constant weight of at least :data:`MIN_WEIGHT_NUMEL` numbers
    made a row-int8 product; unused initializers dropped."""
    from onnx import helper

    graph = model.graph
    producers = {o: node for node in graph.node for o in node.output}
    initializers = {i.name: i for i in graph.initializer}
    values = value_products(graph.node, producers, initializers)
    rewrite, count = _Rewrite(), 0
    for node in graph.node:
        product = node.op_type == "MatMul" and node.name not in values
        weight = constant_weight(node.input[1], producers, initializers) if product else None
        if weight is None or weight.ndim != 2 or weight.size < MIN_WEIGHT_NUMEL:
            rewrite.nodes.append(node)
            continue
        rewrite.product(node, weight)
        count += 1
    del graph.node[:]
    graph.node.extend(_live(rewrite.nodes, {o.name for o in graph.output}))
    graph.initializer.extend(rewrite.initializers)
    used = {i for node in graph.node for i in node.input} | _subgraph_inputs(graph)
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model, count


# What a value projection's output passes through on its way to the attention's probabilities x V (bias, heads'
# reshape and transpose), and what the probabilities pass through from their Softmax (a mask, a cast)
VALUE_PATH = ("Add", "Reshape", "Transpose", "Mul", "Identity", "Cast")
PROBABILITIES_PATH = ("Where", "Cast", "Identity", "Mul", "Dropout")


def value_products(nodes, producers: dict, initializers: dict) -> set[str]:
    """Names of the MatMuls that project attention's values: each constant-weight product whose output reaches, through
    :data:`VALUE_PATH`, the right operand of a MatMul whose left comes from a Softmax. They stay fp32: a value's
    rounding reaches the output linearly, where a query's or key's is damped by the Softmax (all-MiniLM-L6-v2, row
    int8 of one kind of product at a time, mean cosine to fp32 on 32 SST-2 sentences: value 0.9974, query 0.99996, key
    0.99993, attention output 0.99987, FFN in 0.9990; all but value 0.9971, all 0.9946)."""

    def reach(name: str, through: tuple, hops: int) -> list:
        """The nodes met first on each path back from ``name`` through ops in ``through`` (every input followed)."""
        node = producers.get(name)
        if node is None or node.op_type not in through or not hops:
            return [node] if node is not None else []
        return [far for i in node.input if i and i not in initializers for far in reach(i, through, hops - 1)]

    found = set()
    for node in nodes:
        if node.op_type != "MatMul" or node.input[1] in initializers:
            continue
        if any(n.op_type == "Softmax" for n in reach(node.input[0], PROBABILITIES_PATH, 4)):
            for right in reach(node.input[1], VALUE_PATH, 6):
                if right.op_type == "MatMul" and constant_weight(right.input[1], producers, initializers) is not None:
                    found.add(right.name)
    return found


def _live(nodes: list, outputs: set[str]) -> list:
    """``nodes`` (in topological order) less those no output depends on: the fp32 weights' Transpose and
    DequantizeLinear, whose int8 initializers would otherwise stay in the file beside the new ones."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output) or node.op_type == "If":
            kept.append(node)
            needed |= set(node.input) | _subgraph_inputs_of(node)
    return kept[::-1]


def _subgraph_inputs_of(node) -> set[str]:
    names = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            names |= {i for n in sub.node for i in n.input} | _subgraph_inputs(sub)
    return names


def _subgraph_inputs(graph) -> set[str]:
    """Names read inside any node's subgraph (an ``If`` branch may read an outer initializer)."""
    return set().union(*(_subgraph_inputs_of(node) for node in graph.node))


def write_row_int8(artifact) -> int:
    """The row-int8 graph of ``artifact``'s ``model.onnx`` written to ``row_int8/model.onnx`` (its weights inside it);
    returns the products made int8 (0: nothing written)."""
    import onnx

    model, count = row_int8_graph(onnx.load(str(Path(artifact) / "model.onnx")))
    if count:
        graph_path(artifact).parent.mkdir(exist_ok=True)
        onnx.save(model, str(graph_path(artifact)))
    return count
