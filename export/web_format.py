"""Web artifacts (``sharebert export --format web``): a folder transformers.js loads as it loads a Hub model.

Layout (transformers.js' own): ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and one graph
in ``onnx/`` named by transformers.js' dtype suffixes (``model.onnx`` fp32, ``model_quantized.onnx`` for
``--quantize int8``, weight-only); ``config.json``'s ``transformers.js_config.dtype`` names it, so
``from_pretrained`` picks it without a ``dtype`` option. ``manifest.json`` stays, so ``sharebert_runtime``
opens the same folder (``model_format: web``).

The graph is the checked ONNX artifact's, with four changes, each for onnxruntime-web:

* no ``depth`` input (``depth.inline_layers``): transformers.js feeds only the inputs it knows;
* int8 weights dequantized by ``Cast`` and ``Mul`` instead of ``DequantizeLinear`` (the same numbers, bit for
  bit): ONNX Runtime's constant folding skips ``DequantizeLinear`` unless the session sets
  ``session.disable_quant_qdq``, which transformers.js does not, so a compact graph would recompute its
  generated weights on every call; ``Cast`` and ``Mul`` of constants fold at load under any options;
* float64 constants and casts become float32 (:func:`doubles_as_floats`: the WASM build lacks some float64
  kernels);
* a sharebert model is declared ``model_type: bert`` in ``config.json`` (transformers.js knows no ``sharebert``;
  the graph is opaque to it and takes BERT's inputs), the original kept as ``sharebert_model_type``.

A feature-extraction graph keeps its ``sentence_embedding`` output (the recipe's pooling and Dense layers as
nodes), and a recipe's Normalize, which ``sharebert_runtime`` applies in numpy, becomes nodes too: that output is
the recipe's embedding whatever the pipeline's pooling options (``model(inputs).sentence_embedding``). The vector
before that Normalize stays an output as well (``sentence_embedding_unnormalized``, named by the manifest's
``web.unnormalized_output``): what ``Runtime.embed(normalize=False)`` returns.
"""

from __future__ import annotations

from pathlib import Path

from sharebert_runtime.artifact import MODEL, WEB_DIR, ArtifactError, session_options
from sharebert_runtime.outdir import read_json, write_json

# transformers.js' dtype for each --quantize, and the file name its suffix gives in onnx/
DTYPES = {"none": "fp32", "int8": "q8"}
FILES = {"fp32": "model.onnx", "q8": "model_quantized.onnx"}
PARITY_SENTENCES = 16
PARITY_TOLERANCE = 1e-5
UNNORMALIZED = "_unnormalized"  # the recipe's vector before the in-graph Normalize: <output>_unnormalized


def web_model_name(quantize: str) -> str:
    """The graph's path in a web folder for ``--quantize quantize`` (``onnx/model_quantized.onnx``, ...)."""
    return f"{WEB_DIR}/{FILES[DTYPES[quantize]]}"


def dequantize_by_cast(model) -> int:
    """Replace each ``DequantizeLinear`` of a stored int8 tensor without zero point (``quantize.weight_only``'s)
    by ``Cast`` to float and ``Mul`` by its scale (reshaped to broadcast along ``axis``), in place; returns
    how many. ``(q - 0) * scale`` in float32 either way."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    stored = {t.name: t for t in g.initializer}
    nodes, done = [], 0
    for n in g.node:
        if n.op_type != "DequantizeLinear" or len(n.input) != 2 or not all(i in stored for i in n.input):
            nodes.append(n)
            continue
        q, scale = stored[n.input[0]], stored[n.input[1]]
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if len(scale.dims) == 1 and len(q.dims) > 1:  # per channel: [C] -> C at axis, 1 elsewhere
            shape = [1] * len(q.dims)
            shape[axis] = int(scale.dims[0])
            values = numpy_helper.to_array(scale).reshape(shape)
            scale.CopyFrom(numpy_helper.from_array(values, scale.name))
        cast = n.output[0] + "_float"
        nodes.append(helper.make_node("Cast", [q.name], [cast], to=TensorProto.FLOAT, name=n.name + "_cast"))
        nodes.append(helper.make_node("Mul", [cast, scale.name], [n.output[0]], name=n.name + "_scale"))
        done += 1
    del g.node[:]
    g.node.extend(nodes)
    return done


def doubles_as_floats(model) -> int:
    """Compute in float32 what the graph computes in float64, in place; returns how many tensors and casts changed.
    onnxruntime-web's WASM build has no float64 kernel for some ops (``Sqrt(13)``: the exporter's attention scale,
    ``sqrt(head_dim)`` of a constant); those are small constants whose float32 value the parity check confirms."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    changed = 0

    def as_float(tensor) -> None:
        nonlocal changed
        if tensor.data_type == TensorProto.DOUBLE:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
            changed += 1

    g = model.graph
    for t in g.initializer:
        as_float(t)
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.name == "value":
                as_float(a.t)
            elif n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.DOUBLE:
                a.i = TensorProto.FLOAT
                changed += 1
    return changed


def normalize_output(model, output: str) -> str:
    """Divide the graph output ``output`` (``(B, D)``) by its L2 norm, at least 1e-12 (``pooling.l2_normalize``, torch's
    ``F.normalize``), in place: the recipe's Normalize, which sharebert_runtime applies in numpy, in the graph. The
    vector before it stays a graph output too (returned: its name), so ``Runtime.embed(normalize=False)`` can still
    give the recipe's pooled and projected vector unnormalised."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    raw = output + UNNORMALIZED
    for n in g.node:
        n.output[:] = [raw if o == output else o for o in n.output]
    axes, eps = output + "_axes", output + "_eps"
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], np.int64), axes),
            numpy_helper.from_array(np.array(1e-12, np.float32), eps),
        ]
    )
    steps = [
        ("Mul", [raw, raw], "squares", {}),
        ("ReduceSum", [output + "_squares", axes], "sum", {"keepdims": 1}),
        ("Sqrt", [output + "_sum"], "norm", {}),
        ("Max", [output + "_norm", eps], "norm_eps", {}),
    ]
    for op, inputs, name, attrs in steps:
        g.node.append(helper.make_node(op, inputs, [f"{output}_{name}"], name=f"{output}_{name}", **attrs))
    g.node.append(helper.make_node("Div", [raw, output + "_norm_eps"], [output], name=output + "_normalize"))
    kept = g.output.add()
    kept.name = raw
    kept.type.CopyFrom(next(o for o in g.output if o.name == output).type)
    return raw


def web_config(config: dict, quantize: str, sharebert: dict) -> dict:
    """``config.json`` for transformers.js: the model's own, ``model_type`` one it knows, the graph's dtype,
    and ``sharebert``: what the JavaScript helper (examples/web/sharebert.mjs) needs of the manifest (task,
    maximum length, the embedding recipe)."""
    config = dict(config, sharebert=sharebert)
    if config.get("model_type") == "sharebert":
        config["sharebert_model_type"] = config["model_type"]
        config["model_type"] = "bert"
    config["transformers.js_config"] = {"dtype": DTYPES[quantize]}
    return config


def to_web_format(out_dir: Path, session_config: dict, quantize: str, check, sharebert: dict) -> dict:
    """Turn the checked ONNX artifact being written in ``out_dir`` into a web folder: write ``onnx/<file>``,
    check it gives ``model.onnx``'s outputs (within ``PARITY_TOLERANCE``, finite) on the first sentences of
    ``check`` (:class:`parity.Check`: its tokenizer, sentences and maximum length), remove
    ``model.onnx``, rewrite ``config.json`` (:func:`web_config`, with ``sharebert``). Returns the manifest's
    ``web`` entry."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from sharebert_runtime.artifact import model_feeds

    from .depth import inline_layers
    from .parity import encode

    out_dir = Path(out_dir)
    proto = onnx.load(str(out_dir / MODEL))
    inline_layers(proto)
    dequantized = dequantize_by_cast(proto)
    doubles = doubles_as_floats(proto)
    embedding = sharebert.get("embedding")
    normalized = embedding["output"] if embedding and embedding["normalize"] else None
    raw = normalize_output(proto, normalized) if normalized else None
    name = web_model_name(quantize)
    (out_dir / WEB_DIR).mkdir()
    onnx.save(proto, str(out_dir / name))
    del proto
    reference = ort.InferenceSession(
        str(out_dir / MODEL), session_options(session_config), providers=["CPUExecutionProvider"]
    )
    web = ort.InferenceSession(str(out_dir / name), session_options(), providers=["CPUExecutionProvider"])
    reference_names = [o.name for o in reference.get_outputs()]
    if [*reference_names, *([raw] if raw else [])] != [o.name for o in web.get_outputs()]:
        raise ArtifactError(f"the web graph's outputs differ from model.onnx's ({reference_names})")
    # each web output beside the model.onnx output it must equal (the unnormalised one: the recipe's output as is)
    pairs = [(n, n) for n in reference_names] + ([(normalized, raw)] if raw else [])
    sentences = check.sentences
    worst, count = 0.0, min(len(sentences), PARITY_SENTENCES)
    for start in range(0, count, 4):
        batch = encode(check.tokenizer, sentences[start : min(start + 4, count)], check.max_length)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        want = dict(zip(reference_names, reference.run(None, model_feeds(reference.get_inputs(), ids, mask))))
        got = dict(zip([o.name for o in web.get_outputs()], web.run(None, model_feeds(web.get_inputs(), ids, mask))))
        for source, name_ in pairs:
            a, b = want[source], got[name_]
            if name_ == normalized:
                a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            if not (np.isfinite(b).all() and diff <= PARITY_TOLERANCE):
                raise ArtifactError(
                    f"the web graph differs from model.onnx by {diff:.3g} (> {PARITY_TOLERANCE}) or is not finite"
                )
            worst = max(worst, diff)
    del reference, web
    (out_dir / MODEL).unlink()
    write_json(out_dir / "config.json", web_config(read_json(out_dir / "config.json"), quantize, sharebert))
    return {
        "model": name,
        "dtype": DTYPES[quantize],
        "model_bytes": (out_dir / name).stat().st_size,
        "dequantize_by_cast": dequantized,
        "float64_as_float32": doubles,
        **({"unnormalized_output": raw} if raw else {}),
        "parity_vs_onnx": {"sentences": count, "max_abs_diff": worst},
    }
