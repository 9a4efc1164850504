"""int8 matrix products give the same answers on every CPU: ONNX Runtime's integer kernels, fed the weights this
project makes (``|w| <= INT8_WEIGHT_MAX``), return the exact integer sums, whatever instruction set they run on.

Why it can differ: on x86 CPUs without VNNI, ORT's u8 x s8 kernels multiply with ``vpmaddubsw``, which adds two
u8 * s8 products into a saturating int16. With 8-bit weights a pair reaches 255 * 127 * 2 = 64,770 and is cut to
32,767; VNNI and ARM's dot products accumulate in int32 and do not cut. With ``|w| <= 64`` a pair is at most
32,640, so no kernel saturates: the results below are exact (up to the final fp32 scaling) on every CPU. The inputs
are the worst case for a pair: activations quantized to 255 beside weights of one sign at the limit.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from sharebert_runtime.artifact import INT8_WEIGHT_MAX, quantize_per_channel

M, K, N = 4, 256, 32


def _session(node, inputs, output_type=TensorProto.FLOAT):
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", output_type, None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _worst_case(rng, limit: int):
    """Activations in [0, 1] that quantize mostly to 255, weights at +-limit with both of each pair of rows of one
    sign (the pair ``vpmaddubsw`` adds), so each int16 pair sum is 255 * limit * 2."""
    x = np.where(rng.random((M, K)) < 0.9, 1.0, rng.random((M, K))).astype(np.float32)
    signs = np.repeat(rng.choice([-1, 1], size=(K // 2, N)), 2, axis=0)
    return x, (signs * limit).astype(np.int8)


def _uint8_activations(x):
    """ONNX's DynamicQuantizeLinear: uint8, the range widened to hold 0, zero point rounded."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((hi - lo) / 255)
    zero = np.clip(np.rint(-lo / scale), 0, 255)
    return np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.int64), scale, int(zero)


def _exact(xq, zero, wq):
    return (xq - zero) @ wq.astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1])
def test_dynamic_quantize_matmul_is_exact_at_the_weight_limit(seed):
    """The RAM-int8 mode's operator, with the weights and scales the runtime makes (``quantize_per_channel``)."""
    rng = np.random.default_rng(seed)
    x, _ = _worst_case(rng, INT8_WEIGHT_MAX)
    signs = np.repeat(rng.choice([-1.0, 1.0], size=(K // 2, N)), 2, axis=0).astype(np.float32)
    w = signs * rng.uniform(0.5, 1.0, size=(K, N)).astype(np.float32)
    w[0] = signs[0]  # each channel's largest |w| in its first pair: quantized to +-64
    q, scale = quantize_per_channel(w.copy(), "kn")
    node = helper.make_node("DynamicQuantizeMatMul", ["x", "b", "s"], ["y"], domain="com.microsoft")
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K]),
        helper.make_tensor_value_info("b", TensorProto.INT8, [K, N]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, [N]),
    ]
    y = _session(node, inputs).run(None, {"x": x, "b": q, "s": scale})[0]
    xq, x_scale, zero = _uint8_activations(x)
    exact = _exact(xq, zero, q) * x_scale * scale
    # fp32 scaling of exact integer sums: a few ulp; a saturated pair is off by >= 255 * 64 of ~K * 255 * 64
    assert np.allclose(y, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max()), np.abs(y - exact).max()


def test_matmul_integer_is_exact_at_the_weight_limit():
    """int8-dynamic's operator (``quantize_dynamic`` writes DynamicQuantizeLinear -> MatMulInteger)."""
    rng = np.random.default_rng(2)
    x, wq = _worst_case(rng, INT8_WEIGHT_MAX)
    xq, _, zero = _uint8_activations(x)
    node = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.UINT8, [M, K]),
        helper.make_tensor_value_info("b", TensorProto.INT8, [K, N]),
        helper.make_tensor_value_info("za", TensorProto.UINT8, []),
    ]
    feeds = {"a": xq.astype(np.uint8), "b": wq, "za": np.array(zero, np.uint8)}
    y = _session(node, inputs, TensorProto.INT32).run(None, feeds)[0]
    assert np.array_equal(y, _exact(xq, zero, wq))  # integer in, integer out: equal, not close


def test_qlinear_matmul_is_exact_at_the_weight_limit():
    """int8-static's operator (ORT fuses the QDQ pairs around a MatMul into QLinearMatMul). Its output is uint8
    again, so the check is the rounding of the exact sums: a saturated pair would move an output by many steps."""
    rng = np.random.default_rng(3)
    x, wq = _worst_case(rng, INT8_WEIGHT_MAX)
    xq, _, zero = _uint8_activations(x)
    exact = _exact(xq, zero, wq)
    out_scale = np.float32(np.abs(exact).max() / 127.0)
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.UINT8, [M, K]),
        helper.make_tensor_value_info("sa", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("za", TensorProto.UINT8, []),
        helper.make_tensor_value_info("b", TensorProto.INT8, [K, N]),
        helper.make_tensor_value_info("sb", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("zb", TensorProto.INT8, []),
        helper.make_tensor_value_info("sy", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("zy", TensorProto.UINT8, []),
    ]
    feeds = {
        "a": xq.astype(np.uint8),
        "sa": np.array(1.0, np.float32),
        "za": np.array(zero, np.uint8),
        "b": wq,
        "sb": np.array(1.0, np.float32),
        "zb": np.array(0, np.int8),
        "sy": np.array(out_scale, np.float32),
        "zy": np.array(128, np.uint8),
    }
    y = _session(node, inputs, TensorProto.UINT8).run(None, feeds)[0].astype(np.int64)
    expected = np.clip(np.rint(exact / out_scale) + 128, 0, 255)
    assert np.abs(y - expected).max() <= 1  # the kernel's own fp32 requantization may round a tie the other way


def test_auto_holds_weights_int8_only_where_the_export_measured_that_it_keeps_parity():
    """``ram="auto"``: int8 for an int8-stored compact artifact whose RAM-int8 parity, measured at export, holds
    the int8 thresholds; fp32 where it falls below them (a 6-layer BERT teacher's activations round to ~1% cosine)
    or was never measured."""
    from sharebert_runtime.runtime import resolved_ram

    def manifest(parity):
        entry = {"weights": [{"int8": "w"}], **({} if parity is None else {"parity": parity})}
        return {"quantization": "int8", "ram_int8": entry}

    assert resolved_ram(manifest({"cosine_mean": 0.9999, "below_thresholds": []})) == "int8"
    assert resolved_ram(manifest({"cosine_mean": 0.986, "below_thresholds": ["cosine_mean 0.986 < 0.99"]})) == "fp32"
    assert resolved_ram(manifest(None)) == "fp32"
    assert resolved_ram({**manifest({"below_thresholds": []}), "quantization": "none"}) == "fp32"
    assert resolved_ram(manifest(None), "int8") == "int8"  # asked for: the user's choice
