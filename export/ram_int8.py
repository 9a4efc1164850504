"""Export-side preparation of the device runtime's RAM-int8 mode (``Runtime(..., ram="int8")``).

A compact ``model.onnx`` stores only learned tensors; ONNX Runtime folds the generated weights to
dense fp32 at load, four bytes per generated number. The device has no ``onnx`` package, so the
graphs that let it hold them at one byte each are cut from ``model.onnx`` here, at export time:

* ``ram_int8/generator.onnx``: the constant subgraph of ``model.onnx``; its outputs are the distinct
  generated weights (each ``B`` of a ``MatMul``, ``(K, N)``, or of a ``Gemm`` with ``transB``, ``(N, K)``)
  that are not cut from ``ram_int8/rows.onnx``'s product; past ``GENERATOR_BYTES`` of them, further graphs
  ``generator.1.onnx``, ... (named by their weights' ``generator``).
* ``ram_int8/compute.onnx``: ``model.onnx`` with each of those products replaced by
  ``com.microsoft.DynamicQuantizeMatMul(x, B_int8, B_scale[, bias])`` whose int8 weight ``(K, N)`` and
  per-output-channel scale ``(N,)`` are graph inputs; the generator nodes are gone.

Neither graph stores a tensor: every initializer of at least ``MIN_REFERENCE_BYTES`` is an ONNX
external-data reference to the byte range of ``model.onnx`` that already holds it, so the learned
tensors are on disk once; the location is relative to the artifact folder, since ONNX Runtime refuses
``../`` (``artifact.EXTERNAL_DATA_FOLDER``). The runtime runs the generator once, quantizes in numpy and
binds the int8 arrays for every run (``deploy/runtime.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sharebert_runtime.artifact import (
    MODEL,
    RAM_INT8_RECORD,
    product_rows,
    quantize_per_channel,
    quantize_rows,
    session_options,
    weights_record,
)
from sharebert_runtime.artifact import (
    RAM_INT8_COMPUTE as COMPUTE,
)
from sharebert_runtime.artifact import (
    RAM_INT8_GENERATOR as GENERATOR,
)
from sharebert_runtime.artifact import (
    RAM_INT8_ROWS as ROWS,
)

from .depth import inline_layers, is_wrapped, wrap_layers
from .graph import computed_products, constant_keys, gather_before_dequantize, node_inputs, prune, replace_all

MIN_WEIGHT_NUMEL = 4096  # smaller computed weights stay fp32 (ORT folds them in the compute graph)
MIN_REFERENCE_BYTES = 256  # smaller initializers (shapes, scalars) are repeated in the small graphs
# fp32 outputs of one generator graph: the most a load holds in fp32 at once for the weights it makes whole (a
# dense teacher's 36 weights, 42 MB in fp32, are 13 graphs: its load peaks 68 -> 19 MB above the imports)
GENERATOR_BYTES = 4 << 20


def _reference_initializers(graph, blob: bytes, used: set[str]) -> None:
    """Keep the initializers in ``used``; point each large one at its bytes inside ``model.onnx``."""
    from onnx import TensorProto

    kept = []
    for t in graph.initializer:
        if t.name not in used:
            continue
        if t.data_location != TensorProto.EXTERNAL and len(t.raw_data) >= MIN_REFERENCE_BYTES:
            offset = blob.find(t.raw_data)
            if offset < 0:  # raw_data is stored verbatim by protobuf, so this cannot happen for a valid file
                raise RuntimeError(f"initializer {t.name!r} not found in {MODEL}")
            length = len(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", MODEL), ("offset", str(offset)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = k, v
        kept.append(t)
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _save(model, path: Path, blob: bytes) -> None:
    graph = model.graph
    used = {i for n in graph.node for i in node_inputs(n)} | {o.name for o in graph.output}  # If branches too
    _reference_initializers(graph, blob, used)
    model.graph.ClearField("value_info")
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(model.SerializeToString())


def _row_offsets(graph, weights: list[dict]) -> tuple[object, dict[str, int]]:
    """The product the generated weights are cut from, and each such weight's offset in it (row-major).

    A weight ``(K, N)`` qualifies when its chain is ``Gemm -> Reshape(-1) -> Split -> Reshape(N, K)`` then
    ``Transpose`` (a MatMul's ``B``, layout ``kn``) or nothing (a Gemm's ``B`` with ``transB``, ``nk``): its
    output channels are then consecutive runs of ``K`` numbers of the product. Returns ``(None, {})`` when
    no weight qualifies (the generator graph then yields them whole).
    """
    producer = {o: n for n in graph.node for o in n.output}
    consts = _constants(graph)
    product, offsets = None, {}
    for w in weights:
        found = _row_offset(w, producer, consts)
        if found is None or (product is not None and found[0] is not product):
            continue
        product, offsets[w["int8"]] = found
    return product, offsets


def _constants(graph) -> dict:
    """The graph's initializers and ``Constant`` node values, as numpy arrays by name."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _produced_by(producer: dict, name: str, op_type: str):
    """The node making ``name`` when it is an ``op_type`` node, else None."""
    node = producer.get(name)
    return node if node is not None and node.op_type == op_type else None


def _weight_reshape(w: dict, producer: dict):
    """The ``Reshape(N, K)`` at the end of weight ``w``'s chain (under its ``Transpose`` for layout ``kn``), or None."""
    from onnx import helper

    node = producer.get(w["output"])
    if node is None:
        return None
    if w["layout"] != "kn":
        return node if node.op_type == "Reshape" else None
    perm = [helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"]
    return (
        _produced_by(producer, node.input[0], "Reshape") if node.op_type == "Transpose" and perm == [[1, 0]] else None
    )


def _row_offset(w: dict, producer: dict, consts: dict):
    """``(gemm, offset)``: the product weight ``w`` is a run of, and where that run starts; None when its chain
    is not ``Gemm -> Reshape(-1) -> Split(axis 0, constant sizes) -> Reshape`` or its size differs."""
    node = _weight_reshape(w, producer)
    split = _produced_by(producer, node.input[0], "Split") if node is not None else None
    if (
        split is None
        or len(split.input) < 2
        or split.input[1] not in consts
        or any(a.name == "axis" and a.i != 0 for a in split.attribute)
    ):
        return None
    flat = _produced_by(producer, split.input[0], "Reshape")
    is_flat = flat is not None and consts.get(flat.input[1], [0]).tolist() == [-1]
    gemm = _produced_by(producer, flat.input[0], "Gemm") if is_flat else None
    sizes, j = consts[split.input[1]], list(split.output).index(node.input[0])
    if gemm is None or sizes[j] != w["shape"][0] * w["shape"][1]:
        return None
    return gemm, int(sizes[:j].sum())


def _rows_graph(generator, gemm):
    """``generator`` cut to rows ``[rows.start, rows.end)`` and columns ``[cols.start, cols.end)`` of ``gemm``'s
    output (slicing its A operand, its B operand and its bias): ``(model, height, width)``; None when the bias
    does not broadcast row by row.

    B is sliced where it is stored: a B dequantized from an int8 initializer (an int8-stored artifact's word
    embeddings) is sliced in int8 and only the slice dequantized, so the load never holds it whole in fp32."""
    import onnx
    from onnx import helper

    from .graph import evaluate

    a, b, c = (list(gemm.input) + [""])[:3]
    attrs = {x.name: helper.get_attribute_value(x) for x in gemm.attribute}
    shapes = {k: v.shape for k, v in evaluate(generator, [n for n in (a, b, c) if n]).items()}
    height = shapes[a][1] if attrs.get("transA", 0) else shapes[a][0]
    width = shapes[b][0] if attrs.get("transB", 0) else shapes[b][1]
    slice_c = bool(c) and len(shapes[c]) == 2 and shapes[c][0] == height > 1
    if c and not slice_c and len(shapes[c]) == 2 and shapes[c][0] != 1:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(generator)
    g = model.graph
    cut = _slicer(g)
    rows_a = cut(a, "rows", 1 if attrs.get("transA", 0) else 0, "rows.a")
    cols_b = _columns_of(g, b, 0 if attrs.get("transB", 0) else 1, cut)
    if c and len(shapes[c]) and shapes[c][-1] == width > 1:  # a bias per column: its columns too
        c = cut(c, "cols", len(shapes[c]) - 1, "cols.c")
    if slice_c:
        c = cut(c, "rows", 0, "rows.c")
    g.node.append(helper.make_node("Gemm", [rows_a, cols_b] + ([c] if c else []), ["rows"], **attrs))
    _rows_interface(g)
    prune(model)
    return model, int(height), int(width)


def _slicer(g):
    """``cut(tensor, bounds, axis, out)``: appends to ``g`` the node ``out = tensor[bounds.start:bounds.end]`` along
    ``axis`` (0 or 1; the axis constants are added here, once)."""
    from onnx import TensorProto, helper

    axes = {0: "rows.axis0", 1: "rows.axis1"}
    g.node.extend(
        helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [1], [axis]))
        for axis, name in axes.items()
    )

    def cut(tensor, bounds, axis, out):  # tensor[bounds] along axis
        g.node.append(helper.make_node("Slice", [tensor, f"{bounds}.start", f"{bounds}.end", axes[axis]], [out]))
        return out

    return cut


def _rows_interface(g) -> None:
    """The rows graph's inputs (the row and column bounds) and its one output, ``rows``."""
    from onnx import TensorProto, helper

    del g.input[:], g.output[:]
    g.input.extend(
        helper.make_tensor_value_info(n, TensorProto.INT64, [1])
        for n in ("rows.start", "rows.end", "cols.start", "cols.end")
    )
    g.output.append(helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, None]))
    g.name = "sharebert_ram_int8_rows"


def _columns_of(g, b, axis: int, cut) -> str:
    """The name of ``b`` cut to columns ``[cols.start, cols.end)`` along ``axis``: the int8 slice dequantized when
    ``b`` is ``DequantizeLinear`` of stored tensors (its scale and zero point sliced where they run along ``axis``)."""
    from onnx import helper

    stored = {t.name: t for t in g.initializer}
    dq = next((n for n in g.node if b in n.output), None)
    if dq is None or dq.op_type != "DequantizeLinear" or not all(i in stored for i in dq.input if i):
        return cut(b, "cols", axis, "cols.b")
    q_dims = len(stored[dq.input[0]].dims)
    dq_axis = {x.name: helper.get_attribute_value(x) for x in dq.attribute}.get("axis", 1) % max(q_dims, 1)
    inputs = [cut(dq.input[0], "cols", axis, "cols.q")]
    for k, name in enumerate(dq.input[1:3]):  # scale, zero point: per tensor, or per channel of dq_axis
        along = bool(name) and len(stored[name].dims) == 1 and q_dims > 1 and dq_axis == axis
        inputs.append(cut(name, "cols", 0, f"cols.{('scale', 'zero')[k]}") if along else name)
    node = helper.make_node("DequantizeLinear", inputs, ["cols.b"])
    node.attribute.extend(dq.attribute)  # the same axis: the sliced dimension keeps its place
    g.node.append(node)
    return "cols.b"


def _check_rows(model, width: int, height: int, weights: list[dict], whole: dict) -> None:
    """The runtime's chunked quantization of each row weight equals quantizing the generator's whole weight
    (at most one int8 step apart where float rounding of a product row differs; scales within 1e-5)."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    rows = product_rows(session, width, height)
    for w in weights:
        q, scale = quantize_rows(rows, width, w["offset"], w["shape"])
        ref_q, ref_scale = quantize_per_channel(whole[w["output"]].copy(), w["layout"])
        if not (np.abs(q.astype(np.int16) - ref_q).max() <= 1 and np.allclose(scale, ref_scale, rtol=1e-5, atol=0)):
            raise RuntimeError(f"RAM-int8 rows of {w['output']} do not reproduce the generated weight")


def _generator_groups(weights: list[dict], shapes: dict) -> list[list[dict]]:
    """``weights`` in order, cut into groups whose fp32 outputs hold at most ``GENERATOR_BYTES`` (one weight at
    least): one generator graph each, since ONNX Runtime runs every node of a graph whatever outputs are asked."""
    groups, size = [], 0
    for w in weights:
        nbytes = 4 * int(np.prod(shapes[w["output"]]))
        if not groups or size + nbytes > GENERATOR_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(w)
        size += nbytes
    return groups


def build_int8_ram_graphs(out_dir: str | Path) -> dict:
    """Write the RAM-int8 graphs into ``out_dir/ram_int8/``, beside ``out_dir/model.onnx`` (already written,
    compact), derived from that file alone (whatever its storage dtype), with ``graph.py``'s passes.

    Returns the manifest's ``ram_int8`` entry: file names and, per weight, the generator output,
    the compute graph's int8/scale input names, its layout (``kn`` or ``nk``) and shape ``(K, N)``.
    Returns ``{}`` when the model has no computed weight large enough (nothing written).
    """
    import onnx

    out_dir = Path(out_dir)
    blob = (out_dir / MODEL).read_bytes()
    source = onnx.load_from_string(blob)
    gated = is_wrapped(source.graph)  # a sharebert graph; a transformers BERT's runs at full depth only
    inline_layers(source)  # derive from the flat graph; the compute graph is gated by depth again below
    keys = constant_keys(source.graph)
    products = [(node, layout) for node, layout in computed_products(source.graph, keys) if layout is not None]
    representative = {}  # structural key -> first tensor name with that value
    for node, _ in products:
        representative.setdefault(keys[node.input[1]], node.input[1])
    if not representative:
        return {}
    generator = _generator_of(source, list(representative.values()))
    whole = _run_generator(
        generator, list(representative.values())
    )  # shapes, and whether a weight is big enough to quantize
    shapes = {name: value.shape for name, value in whole.items()}
    layout_of = {keys[node.input[1]]: layout for node, layout in products}
    weights, chosen = _chosen_weights(representative, shapes, layout_of)
    if not weights:
        return {}
    ram = {"compute": COMPUTE, "weights": weights}
    ram.update(_save_rows(generator, weights, whole, out_dir / ROWS, blob))
    del whole
    whole_weights = [w for w in weights if "output" in w]
    if whole_weights:
        _save_generators(generator, whole_weights, shapes, out_dir, blob)
        ram["generator"] = GENERATOR
    _save(_compute_of(source, keys, chosen, weights, gated), out_dir / COMPUTE, blob)
    return {**ram, "generated_numel": int(sum(w["shape"][0] * w["shape"][1] for w in weights))}


def _generator_of(source, outputs: list[str]):
    """``source``'s constant subgraph, its outputs the generated weights named ``outputs``."""
    import onnx
    from onnx import TensorProto, helper

    generator = onnx.ModelProto()
    generator.CopyFrom(source)
    g = generator.graph
    del g.input[:], g.output[:]
    g.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs)
    prune(generator)
    g.name = "sharebert_ram_int8_generator"
    return generator


def _run_generator(generator, names: list[str]) -> dict:
    """The generator's outputs ``names`` by name (run once, at export)."""
    import onnxruntime as ort

    session = ort.InferenceSession(generator.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {})))


def _chosen_weights(representative: dict, shapes: dict, layout_of: dict) -> tuple[list[dict], dict]:
    """The weights held in int8 (2-D, at least ``MIN_WEIGHT_NUMEL`` numbers): their manifest entries, and the same
    entries by structural key."""
    weights, chosen = [], {}
    for key, name in representative.items():
        shape = shapes[name]
        if len(shape) != 2 or int(np.prod(shape)) < MIN_WEIGHT_NUMEL:
            continue
        layout = layout_of[key]
        K, N = shape if layout == "kn" else shape[::-1]
        entry = {
            "output": name,
            "int8": f"ram_int8.{len(weights)}.int8",
            "scale": f"ram_int8.{len(weights)}.scale",
            "layout": layout,
            "shape": [int(K), int(N)],
        }
        weights.append(entry)
        chosen[key] = entry
    return weights, chosen


def _save_rows(generator, weights: list[dict], whole: dict, path: Path, blob: bytes) -> dict:
    """Where weights are runs of one product's rows, the rows graph saved at ``path`` and each such weight given
    its ``offset`` (no ``output``: the runtime makes them a few rows at a time); the manifest's rows fields, or
    ``{}`` when no weight is cut from rows."""
    gemm, offsets = _row_offsets(generator.graph, weights)
    cut = _rows_graph(generator, gemm) if offsets else None
    if cut is None:
        return {}
    rows, height, width = cut
    for w in weights:
        if w["int8"] in offsets:
            w["offset"] = offsets[w["int8"]]
    _check_rows(rows, width, height, [w for w in weights if "offset" in w], whole)
    for w in weights:
        if "offset" in w:
            del w["output"]
    _save(rows, path, blob)
    return {"rows": ROWS, "height": height, "width": width}


def _save_generators(generator, whole_weights: list[dict], shapes: dict, out_dir: Path, blob: bytes) -> None:
    """The generator cut to the weights the runtime takes whole, one graph per group of ``_generator_groups``: the
    first at ``GENERATOR`` (the entry's own generator), the others beside it, named by their weights' ``generator``."""
    import onnx
    from onnx import TensorProto, helper

    for i, group in enumerate(_generator_groups(whole_weights, shapes)):
        part = onnx.ModelProto()  # the generator cut to this group's outputs
        part.CopyFrom(generator)
        del part.graph.output[:]
        part.graph.output.extend(
            helper.make_tensor_value_info(w["output"], TensorProto.FLOAT, shapes[w["output"]]) for w in group
        )
        prune(part)
        name = GENERATOR if i == 0 else GENERATOR.replace(".onnx", f".{i}.onnx")
        _save(part, out_dir / name, blob)
        for w in group:
            if i:  # the first graph is the entry's own generator
                w["generator"] = name


def _quantized_product(node, entry: dict):
    """``DynamicQuantizeMatMul`` in place of the ``MatMul``/``Gemm`` ``node``, its weight the inputs of ``entry``."""
    from onnx import helper

    inputs = [node.input[0], entry["int8"], entry["scale"]]
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        inputs += ["", node.input[2]]
    return helper.make_node(
        "DynamicQuantizeMatMul", inputs, list(node.output), name=f"{node.name}_int8", domain="com.microsoft"
    )


def _compute_of(source, keys: dict, chosen: dict, weights: list[dict], gated: bool):
    """``source`` with each chosen product quantized at run time from int8/scale graph inputs; the generator's
    nodes gone; gated by depth again when ``gated``."""
    import onnx
    from onnx import TensorProto, helper

    compute = onnx.ModelProto()
    compute.CopyFrom(source)
    c = compute.graph
    new_nodes = []
    for node in c.node:
        entry = (
            chosen.get(keys.get(node.input[1])) if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 else None
        )
        new_nodes.append(node if entry is None or node.input[0] in keys else _quantized_product(node, entry))
    replace_all(c.node, new_nodes)
    gather_before_dequantize(compute)  # an int8-stored embedding table stays int8 in RAM too
    prune(compute)
    for w in weights:
        c.input.append(helper.make_tensor_value_info(w["int8"], TensorProto.INT8, w["shape"]))
        c.input.append(helper.make_tensor_value_info(w["scale"], TensorProto.FLOAT, [w["shape"][1]]))
    c.name = "sharebert_ram_int8_compute"
    if gated:  # as model.onnx is
        wrap_layers(compute)
    if not any(o.domain == "com.microsoft" for o in compute.opset_import):
        compute.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    record = compute.metadata_props.add()  # the manifest's weight records, in a hashed file (checked at load)
    record.key, record.value = RAM_INT8_RECORD, weights_record(weights)
    return compute


class _Int8Session:
    """The RAM-int8 runtime of an artifact folder as the parity checks call an ONNX Runtime session: its compute
    graph, fed the int8 weights the runtime bound at load beside the caller's feeds."""

    def __init__(self, runtime):
        self.runtime = runtime

    def get_inputs(self):
        return self.runtime.inputs

    def get_outputs(self):
        return self.runtime.session.get_outputs()

    def run(self, names, feeds):
        import onnxruntime as ort

        values = {n: ort.OrtValue.ortvalue_from_numpy(v) for n, v in feeds.items()}
        values.update(self.runtime._int8_inputs)
        names = names or [o.name for o in self.get_outputs()]
        return [o.numpy() for o in self.runtime.session.run_with_ort_values(names, values)]


def measure_ram_int8(folder: Path, check, recipe):
    """The finished artifact at ``folder`` loaded once as ``Runtime(folder, ram="int8")`` (weights quantized at load,
    dynamic-int8 activations), as a device loads it: ``(parity, at_export)``. ``parity``: against PyTorch on the
    export's check sentences, with the figures below the ``int8`` thresholds; ``ram="auto"`` holds the weights as
    int8 only where none is (``resolved_ram``): the activations' rounding, one scale for a whole batch, costs a small
    model nothing measurable and a 6-layer BERT ~1% cosine. ``at_export``: the figures on the manifest's stored
    reference inputs (``sharebert verify --ram int8`` compares with them), None without a reference. ``check``:
    :class:`parity.Check` (the PyTorch side); ``recipe``: the embedding recipe and its Dense weights, or None."""
    from sharebert_runtime import Runtime
    from sharebert_runtime.reference import KEY, replay

    from .parity import below_thresholds, check_parity

    runtime = Runtime(folder, ram="int8", threads=1)
    session = _Int8Session(runtime)
    parity = check_parity(check, session, progress=False)
    below = below_thresholds(parity, "int8")
    if recipe is not None:
        from .sentence_embedding import embedding_parity

        parity["sentence_embedding"] = embedding_parity(check, session, *recipe)
        below += [f"sentence_embedding {b}" for b in below_thresholds(parity["sentence_embedding"], "int8")]
    keep = ("sentences", "max_abs_diff", "cosine_min", "cosine_mean", "top1_agreement", "agreement")
    figures = {k: v for k, v in parity.items() if k in keep}
    if "sentence_embedding" in parity:
        figures["sentence_embedding"] = {k: v for k, v in parity["sentence_embedding"].items() if k in keep}
    at_export = replay(runtime)[0] if KEY in runtime.manifest else None
    return {**figures, "below_thresholds": below}, at_export
