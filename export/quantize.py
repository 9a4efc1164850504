"""Quantized storage and compute for exported graphs.

* ``int8`` (weight-only): every learned float tensor of at least ``MIN_NUMEL`` numbers is stored as
  symmetric int8 (per row for matrices, per tensor for vectors) behind a ``DequantizeLinear`` whose
  output keeps the tensor's name. ONNX Runtime folds it, and the generated weights, back to dense
  fp32 at load, provided the session sets ``session.disable_quant_qdq=1`` (``INT8_SESSION_CONFIG``).
* ``fp16`` (weight-only): the same with float16 storage and a ``Cast`` to float32.
* ``int8-dynamic``: ONNX Runtime's ``quantize_dynamic`` on a materialized graph (int8 MatMuls).
* ``int8-static``: ONNX Runtime's ``quantize_static`` (QDQ, MinMax) of the matrix products only
  (``STATIC_OPS``) on a materialized graph, calibrated on tokenized sentences.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MODES = ("none", "int8", "int8-dynamic", "int8-static", "fp16")
HELP = {
    "none": "fp32 storage and compute",
    "int8": "learned tensors stored as int8 (weight-only, DequantizeLinear): ~1/4 of the fp32 file, "
    "ONNX Runtime folds them to fp32 at load, so fp32 speed and RAM",
    "int8-dynamic": "generated weights materialized, then ONNX Runtime dynamic int8 (int8 MatMuls): "
    "fastest compute, bigger file",
    "int8-static": "generated weights materialized, then static int8 QDQ calibrated on --calibration sentences",
    "fp16": "learned tensors stored as float16 (Cast to fp32 at load): half the fp32 file, fp32 compute",
}
MIN_NUMEL = 256  # smaller tensors (scalars, shape constants, short vectors) stay fp32


def _quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Symmetric int8: ``(q, scale, axis)``, per row for a matrix (axis 0), per tensor otherwise."""
    if w.ndim == 2:
        scale = np.abs(w).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.rint(w / scale[:, None])
        axis = 0
    else:
        scale = np.asarray(max(float(np.abs(w).max()) / 127.0, 1e-12), dtype=np.float32)
        q = np.rint(w / scale)
        axis = None
    return np.clip(q, -127, 127).astype(np.int8), scale.astype(np.float32), axis


def weight_only(model, mode: str) -> None:
    """Store float initializers of ``MIN_NUMEL``+ numbers as int8 (``mode='int8'``) or fp16 (in place)."""
    g = model.graph
    kept, nodes = [], []
    for t in g.initializer:
        if t.data_type != TensorProto.FLOAT or int(np.prod(t.dims)) < MIN_NUMEL:
            kept.append(t)
            continue
        w = numpy_helper.to_array(t)
        if mode == "fp16":
            kept.append(numpy_helper.from_array(w.astype(np.float16), t.name + "_fp16"))
            nodes.append(
                helper.make_node("Cast", [t.name + "_fp16"], [t.name], to=TensorProto.FLOAT, name=t.name + "_cast")
            )
        else:
            q, scale, axis = _quantize_int8(w)
            kept += [numpy_helper.from_array(q, t.name + "_int8"), numpy_helper.from_array(scale, t.name + "_scale")]
            attrs = {} if axis is None else {"axis": axis}
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [t.name + "_int8", t.name + "_scale"],
                    [t.name],
                    name=t.name + "_dequantize",
                    **attrs,
                )
            )
    rest = list(g.node)
    del g.initializer[:], g.node[:]
    g.initializer.extend(kept)
    g.node.extend(nodes + rest)


# Both ORT quantizers run with reduce_range: 7-bit weights in [-64, 64] (INT8_WEIGHT_MAX), so that the u8 x s8
# kernels of CPUs without VNNI cannot saturate and every CPU computes the same integer sums.


def dynamic_int8(src: Path, dst: Path) -> None:
    """``quantize_dynamic`` (7-bit int8 weights per channel, uint8 activations quantized per run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)


# int8-static quantizes the inputs of the matrix products, nothing else. Quantizing every op also put the
# graph's output through uint8: a 30k-word row of logits took ~160 distinct values, so the top candidates of a
# trained model tied and argmax answered the lowest id ("." where PyTorch answers "the": top-1 agreement 0.007).
# LayerNorm, Softmax, GELU, the attention mask's Add and the logits stay fp32, as in ONNX Runtime's
# transformer recipes.
STATIC_OPS = ("MatMul", "Gemm")


def static_int8(src: Path, dst: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    """``quantize_static`` in QDQ format (uint8 activations, 7-bit int8 per-channel weights, MinMax) of the
    ``STATIC_OPS`` on ``feeds``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(feeds)

        def get_next(self):
            return next(self.items, None)

    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        op_types_to_quantize=list(STATIC_OPS),
    )


def tensor_dtypes(model) -> dict:
    """Which stored tensors are int8 / fp16 / fp32 and which matrix products run in which precision.

    ``products``: counts of float ``MatMul``/``Gemm`` and of int8 ops; ``computed_fp32_weights``: the
    MatMul weights computed in-graph (generated or views of learned tensors) that run in fp32.
    """
    from .graph import computed_product_weights

    g = model.graph
    by_dtype: dict[str, list[str]] = {}
    for t in g.initializer:
        if int(np.prod(t.dims)) >= MIN_NUMEL:
            name = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).name
            by_dtype.setdefault(name, []).append(t.name)
    ops: dict[str, int] = {}
    for n in g.node:
        if n.op_type in (
            "MatMul",
            "Gemm",
            "MatMulInteger",
            "DynamicQuantizeMatMul",
            "QLinearMatMul",
            "MatMulIntegerToFloat",
            "DequantizeLinear",
            "QuantizeLinear",
            "DynamicQuantizeLinear",
            "Cast",
        ):
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {
        "stored": {k: sorted(v) for k, v in by_dtype.items()},
        "ops": ops,
        "computed_fp32_weights": sorted(set(computed_product_weights(g))),
    }
