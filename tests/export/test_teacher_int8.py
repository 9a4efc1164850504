"""The teacher's row-int8 compute (export/teacher_int8.py): each product within the rounding its arithmetic allows on
every row, the saturating case included; and, on a tiny MPNet teacher (not BERT), the pass takes it where its check
holds the teacher's bar, and gives PyTorch's vectors within it."""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharebert.export import teacher_int8
from sharebert_runtime.artifact import INT8_WEIGHT_MAX

K, N = 96, 64


def _graph(weight: np.ndarray, stored_int8: bool):
    """``y = x @ weight`` with ``weight`` ``(K, N)`` an initializer, or held as an int8 export holds a Linear's:
    ``Transpose(DequantizeLinear(int8 (N, K), per-row scale))``; plus a small product (under MIN_WEIGHT_NUMEL)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 4])
    small = numpy_helper.from_array(np.full((N, 4), 0.5, np.float32), "small")
    if stored_int8:
        scale = np.abs(weight).max(0) / 127
        q = np.rint(weight / scale).T.astype(np.int8)
        inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale.astype(np.float32), "s"), small]
        inits.append(numpy_helper.from_array(np.zeros(N, np.int8), "z"))
        nodes = [
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w_nk"], axis=0),
            helper.make_node("Transpose", ["w_nk"], ["w"], perm=[1, 0]),
        ]
        weight = (q.astype(np.float32) * scale[:, None].astype(np.float32)).T
    else:
        inits, nodes = [numpy_helper.from_array(weight, "w"), small], []
    nodes += [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "small"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y, helper.make_tensor_value_info("h", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


def _inputs(rng):
    """Rows a product meets: ordinary ones, one token 50x the rest, an all-zero row, and the saturating case (every
    activation at its row's largest value, against a column of weights at the limit of one sign)."""
    x = rng.standard_normal((3, 5, K)).astype(np.float32)
    x[0, 1] *= 50
    x[1, 2] = 0
    x[2, 3] = 7.0
    return x


@pytest.mark.parametrize("stored_int8", [False, True])
def test_each_product_is_x_times_w_within_its_rounding(stored_int8):
    """Every output of the rewritten product lies within the bound its rounding allows: with the row's scale
    ``r = max|x_row| / 127`` and the column's ``c = max|w_col| / INT8_WEIGHT_MAX``, each rounded number is off by at
    most half its step, so ``|x.w - y| <= r/2 sum|w| + c/2 sum|x| + K r c / 4`` (plus fp32's accumulation, 1e-5
    relative). A kernel whose uint8 x int8 pairs saturate int16 misses it by far on the constant row; weights stay in
    ``[-INT8_WEIGHT_MAX, INT8_WEIGHT_MAX]``; the small product stays fp32; the fp32 weight's nodes are gone."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    weight[:, 0] = np.abs(weight[:, 0]).max()  # a column at the limit of one sign: the saturating case
    model, weight = _graph(weight, stored_int8)
    model, count = teacher_int8.row_int8_graph(model)
    assert count == 1 and {n.op_type for n in model.graph.node}.isdisjoint({"DequantizeLinear", "Transpose"})
    assert [n.op_type for n in model.graph.node].count("MatMul") == 1  # the 64 x 4 one
    int8 = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == TensorProto.INT8]
    assert len(int8) == 1 and np.abs(int8[0]).max() <= INT8_WEIGHT_MAX
    x = _inputs(rng)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = session.run(["h"], {"x": x})[0]
    exact = x.astype(np.float64) @ weight.astype(np.float64)
    r = np.abs(x).max(-1, keepdims=True) / 127
    c = np.abs(weight).max(0) / INT8_WEIGHT_MAX
    bound = r / 2 * np.abs(weight).sum(0) + c / 2 * np.abs(x).sum(-1, keepdims=True) + K * r * c / 4
    err = np.abs(got - exact)
    assert np.isfinite(got).all() and (err <= bound + 1e-5 * np.abs(exact) + 1e-6).all(), float((err - bound).max())
    assert (got[1, 2] == 0).all()  # an all-zero row: no division by its zero scale


@pytest.mark.slow  # a tiny MPNet teacher exported once: ~10 s of CPU
def test_a_non_bert_teachers_pass_runs_its_checked_row_int8_graph(tmp_path, monkeypatch):
    """A tiny MPNet teacher's int8 artifact gets its row-int8 graph and check (its widths under the real floors, which
    the test lowers), every product int8 but the value projections; the pass then runs it (not the artifact's fp32
    compute: the vectors differ) and its vectors keep PyTorch's as the recorded bound says: each sentence's angle to
    PyTorch within the artifact's worst parity angle plus its own to the fp32 compute (the triangle inequality the
    bound rests on), the mean cosine at or above the teacher's bar. A record below the bar, or of another model.onnx,
    leaves the pass in fp32."""
    from tiny_teachers import build, training_text

    from sharebert.export import export_model
    from sharebert.formats.recipe import read_recipe
    from sharebert.pipelines.teacher_pass import TEACHER_COSINE, _vectors, check_row_int8
    from sharebert.training.distill_embedding_model import load_encoder, recipe_head
    from sharebert.training.sentence_vectors import encode
    from sharebert.training.teacher import teacher_tokenizer
    from sharebert.training.teacher_vectors import TeacherPass

    folder, artifact = build(tmp_path, "mpnet")["embedding"], tmp_path / "artifact"
    export_model(folder, artifact, quantize="int8", check_limit=16, runs=1, progress=False)
    monkeypatch.setattr(teacher_int8, "MIN_WIDTH", 0)
    monkeypatch.setattr(teacher_int8, "MIN_WEIGHT_NUMEL", 0)
    record = check_row_int8(artifact, say=lambda *_: None)
    assert record["cosine_bound"] >= TEACHER_COSINE, record
    import onnx

    ops = [n.op_type for n in onnx.load(str(teacher_int8.graph_path(artifact))).graph.node]
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    # per layer: query, key, attention output and the FFN's two in int8; the value projection stays fp32
    # (teacher_int8.value_products), beside the attention's two products of activations
    assert ops.count("MatMulIntegerToFloat") == 5 * layers and ops.count("MatMul") == 3 * layers
    recipe, tokenizer, model = read_recipe(folder), teacher_tokenizer(folder), load_encoder(folder)
    kwargs = {"tokenizer": tokenizer, "pooling": recipe.pooling, "seq_len": 32}
    fast = TeacherPass(model, recipe_head(folder, recipe), **kwargs, artifact=artifact)
    assert fast.path == "onnx" and fast.row_int8 and "row-int8" in fast.describe()
    texts = training_text(24)
    ours, fp32 = fast(texts), _vectors(artifact, texts)
    theirs = encode(model, tokenizer, texts, recipe.pooling, fast.head, seq_len=32)

    def angle(a, b):
        return np.arccos(np.clip((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)), -1, 1))

    assert np.isfinite(ours).all() and not np.allclose(ours, fp32, atol=1e-6)
    assert (angle(ours, theirs) <= angle(fp32, theirs) + angle(ours, fp32) + 1e-6).all()
    assert np.cos(angle(ours, theirs)).mean() >= TEACHER_COSINE
    for edit in ({"cosine_bound": 0.5}, {"model_sha256": "0" * 64}):
        other = tmp_path / f"other{len(edit)}{next(iter(edit))}"
        shutil.copytree(artifact, other)
        path = teacher_int8.record_path(other)
        path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
        assert TeacherPass(model, None, **kwargs, artifact=other).row_int8 is False
