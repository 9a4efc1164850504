"""RAM-int8 loading a few rows at a time: the same int8 weights as quantizing each whole weight, bounded fp32."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import Runtime
from sharebert_runtime import artifact as contract
from sharebert_runtime import runtime as runtime_module

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)


@pytest.mark.parametrize(
    "width, offset, K, N, chunk",
    [(7, 0, 5, 9, 1), (7, 3, 5, 9, 2), (16, 5, 16, 4, 1), (10, 11, 3, 30, 4), (1000, 17, 64, 8, 32)],
)
def test_quantize_rows_equals_quantizing_the_whole_weight(width, offset, K, N, chunk):
    """Channels straddle product rows; every chunk size gives exactly the whole weight's int8 and scales."""
    rng = np.random.default_rng(width + offset)
    height = -(-(offset + K * N) // width) + 1
    product = rng.normal(size=(height, width)).astype(np.float32)
    product.reshape(-1)[offset + 2 * K : offset + 3 * K] = 0.0  # an all-zero channel: scale 1, not a division by 0
    calls = []

    def rows(start, end):
        calls.append(end - start)
        return product[start:end].copy()

    q, scale = contract.quantize_rows(rows, width, offset, [K, N], chunk_rows=chunk)
    W = product.reshape(-1)[offset : offset + K * N].reshape(N, K)  # (N, K): row n is output channel n
    ref_q, ref_scale = contract.quantize_per_channel(np.ascontiguousarray(W.T), "kn")
    assert np.array_equal(q, ref_q) and np.array_equal(scale, ref_scale)
    assert scale[2] == 1.0 and not q[:, 2].any()
    assert max(calls) <= max(chunk, K // width + 1) + 1  # never much more than a chunk of rows in fp32


def test_product_rows_made_in_column_slices_and_kept_equal_the_product():
    """The rows graph's runner: any rows asked for, in any order, equal the product's; the buffer is filled
    once for a product that fits it, and by column slices where the graph takes them."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(3, 11)).astype(np.float32)
    axis = numpy_helper.from_array(np.array([0], np.int64), "zero")
    axis1 = numpy_helper.from_array(np.array([1], np.int64), "one")
    nodes = [
        helper.make_node("Slice", ["a", "rows.start", "rows.end", "zero"], ["ra"]),
        helper.make_node("Slice", ["b", "cols.start", "cols.end", "one"], ["cb"]),
        helper.make_node("MatMul", ["ra", "cb"], ["rows"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rows",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, [1])
            for n in ("rows.start", "rows.end", "cols.start", "cols.end")
        ],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, None])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b"), axis, axis1],
    )
    session = ort.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    calls = []
    real = session.run_with_iobinding
    session.run_with_iobinding = lambda binding: calls.append(1) or real(binding)
    product = a @ b
    for cols in (4, 11, 64):
        calls.clear()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(contract, "COLUMNS_PER_CALL", cols)
            rows = contract.product_rows(session, 11, 5)
        for start, end in [(3, 5), (0, 2), (1, 4), (4, 5)]:
            np.testing.assert_allclose(rows(start, end), product[start:end], rtol=1e-6)
        assert len(calls) == -(-11 // min(cols, 11))  # the whole product once, one run per column slice


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_generated_weight_is_refused(bad):
    """A NaN or inf must not become a finite-looking int8 weight: loading stops with one line."""
    w = np.ones((4, 3), np.float32)
    w[1, 2] = bad
    with pytest.raises(contract.ArtifactError, match="not finite"):
        contract.quantize_per_channel(w.copy(), "kn")
    with pytest.raises(contract.ArtifactError, match="not finite"):
        contract.quantize_rows(lambda a, b: w.T.reshape(1, -1).copy(), 12, 0, [4, 3])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("ram")
    build_model("sharebert-tiny", root / "model", TINY, seed=5)
    export_model(root / "model", root / "artifact", task="fill-mask", check_limit=8, runs=2, progress=False)
    return root / "artifact"


def test_load_makes_generated_weights_in_bounded_row_chunks(artifact, monkeypatch):
    manifest = json.loads((artifact / "manifest.json").read_text())["ram_int8"]
    cut = [w for w in manifest["weights"] if "offset" in w]
    assert cut and manifest["rows"] == contract.RAM_INT8_ROWS  # every encoder weight comes from rows
    assert all("output" not in w for w in cut)
    spans = []
    real = runtime_module.quantize_rows

    def spy(rows, *args, **kwargs):
        def counted(start, end):
            spans.append(end - start)
            return rows(start, end)

        return real(counted, *args, **kwargs)

    monkeypatch.setattr(runtime_module, "quantize_rows", spy)
    rt = Runtime(artifact, ram="int8", threads=1)
    assert spans and max(spans) <= contract.ROWS_PER_CALL + 1
    assert rt.metadata()["int8_generated_weights"] == len(manifest["weights"])
    fp32 = Runtime(artifact, ram="fp32", threads=1).fill_mask("the [MASK] was good .")[0][0]
    int8 = rt.fill_mask("the [MASK] was good .")[0][0]
    assert abs(fp32[0]["score"] - int8[0]["score"]) <= 0.05


def test_gather_before_dequantize_gives_the_same_numbers():
    """A per-row int8 table: gathering rows first, then scaling them, equals dequantizing the table first."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from sharebert.export.graph import gather_before_dequantize

    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (50, 6)).astype(np.int8)
    scale = rng.uniform(0.001, 0.1, 50).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["q", "scale"], ["table"], axis=0),
            helper.make_node("Gather", ["table", "ids"], ["out"]),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None, 6])],
        [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ids = rng.integers(0, 50, (3, 7))
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids}
    )[0]
    assert gather_before_dequantize(model) == 1
    assert "DequantizeLinear" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model)
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[
        0
    ]
    assert np.array_equal(before, after)


def test_int8_stored_file_keeps_its_embedding_table_int8_in_ram(tmp_path):
    import onnx

    build_model("sharebert-tiny", tmp_path / "model", TINY, seed=6)
    export_model(
        tmp_path / "model", tmp_path / "art", task="fill-mask", quantize="int8", check_limit=8, runs=2, progress=False
    )
    compute = onnx.load(str(tmp_path / "art" / contract.RAM_INT8_COMPUTE), load_external_data=False)
    producer = {o: n for n in compute.graph.node for o in n.output}
    gathers = [n for n in compute.graph.node if n.op_type == "Gather" and n.input[0] in producer]
    assert not any(producer[n.input[0]].op_type == "DequantizeLinear" for n in gathers)
    # the load-time rows graph dequantizes a slice of the int8 table per call, never the whole table
    rows = onnx.load(str(tmp_path / "art" / contract.RAM_INT8_ROWS), load_external_data=False)
    producer = {o: n for n in rows.graph.node for o in n.output}
    gemm = next(n for n in rows.graph.node if n.op_type == "Gemm")
    dq = producer[gemm.input[1]]
    assert dq.op_type == "DequantizeLinear" and producer[dq.input[0]].op_type == "Slice"
    assert {"cols.start", "cols.end"} <= {i.name for i in rows.graph.input}
    text = "the [MASK] was good , and the [MASK] too ."
    fp32 = Runtime(tmp_path / "art", ram="fp32", threads=1).fill_mask(text)
    int8 = Runtime(tmp_path / "art", ram="int8", threads=1).fill_mask(text)
    for a, b in zip(fp32[0], int8[0]):
        assert abs(a[0]["score"] - b[0]["score"]) <= 0.05


SENTENCES = [
    "the capital of france is paris .",
    "he went to the shop to buy some bread .",
    "",
    "a gripping movie , and a moving one .",
    "it 's a charming and often affecting journey .",
]


@pytest.mark.parametrize("quantize, default", [("int8", "int8"), ("none", "fp32")])
def test_every_memory_setting_answers_within_the_artifacts_parity_tolerance(tmp_path, quantize, default):
    """``ram="auto"`` (the default) holds an int8-stored compact artifact's generated weights as int8 and leaves
    an fp32 file in fp32; every setting's sentence vectors agree with fp32's within the int8 parity threshold."""
    from sharebert.export.parity import THRESHOLDS

    build_model("sharebert-tiny", tmp_path / "model", TINY, seed=7)
    export_model(
        tmp_path / "model",
        tmp_path / "art",
        task="feature-extraction",
        quantize=quantize,
        check_limit=8,
        runs=2,
        progress=False,
    )
    measured = json.loads((tmp_path / "art" / "manifest.json").read_text())["ram_int8"]["parity"]
    assert measured["below_thresholds"] == [] and measured["cosine_mean"] >= THRESHOLDS["int8"]["cosine"]
    vectors = {}
    for ram in runtime_module.RAM_MODES:
        rt = Runtime(tmp_path / "art", ram=ram, threads=1)
        assert rt.ram == (default if ram == "auto" else ram)
        vectors[ram] = np.stack(rt.embed(SENTENCES))
    assert np.array_equal(vectors["auto"], vectors[default])
    a, b = vectors["fp32"], vectors["int8"]
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert np.isfinite(cosine).all() and cosine.min() >= THRESHOLDS["int8"]["cosine"], cosine


def test_a_dense_teachers_weights_come_from_small_generator_graphs_with_the_same_numbers(tmp_path, monkeypatch):
    """A dense teacher's weights are all made whole: the export cuts its generator into graphs of at most
    ``GENERATOR_BYTES`` of fp32 outputs (ONNX Runtime runs every node of a graph), each listed in the manifest, and
    the load quantizes exactly the same int8 weights as from one graph."""

    from sharebert.export import ram_int8

    clf = _tiny_bert_classifier(tmp_path / "bert")  # weights of 64 x 64 and up
    export_model(
        clf, tmp_path / "one", task="text-classification", quantize="int8", check_limit=8, runs=1, progress=False
    )
    monkeypatch.setattr(ram_int8, "GENERATOR_BYTES", 1)  # one weight per graph
    export_model(
        clf, tmp_path / "split", task="text-classification", quantize="int8", check_limit=8, runs=1, progress=False
    )
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    graphs = {w.get("generator", manifest["ram_int8"]["generator"]) for w in manifest["ram_int8"]["weights"]}
    assert len(graphs) == len(manifest["ram_int8"]["weights"]) > 1 and graphs <= set(manifest["files"])
    one, split = (Runtime(tmp_path / name, ram="int8", threads=1) for name in ("one", "split"))
    assert one._int8_inputs.keys() == split._int8_inputs.keys()
    for name, value in one._int8_inputs.items():
        assert np.array_equal(value.numpy(), split._int8_inputs[name].numpy()), name
    assert one.classify(SENTENCES) == split.classify(SENTENCES)
    (tmp_path / "split" / sorted(graphs)[-1]).unlink()  # a listed graph missing: refused by name
    with pytest.raises(contract.ArtifactError, match="generator"):
        Runtime(tmp_path / "split", ram="int8")


def test_releasing_library_code_pages_keeps_every_answer(artifact, monkeypatch):
    """``release_code`` unmaps the resident pages of onnxruntime's and tokenizers' libraries (Linux): the next
    request maps back what it runs and answers the same; where madvise is missing it does nothing."""
    from sharebert_runtime import memory

    rt = Runtime(artifact, threads=1)
    text = "the capital of france is [MASK] ."
    before = rt.fill_mask(text)
    folders = [str(Path(sys.modules[name].__file__).resolve().parent) + "/" for name in memory.CODE_PACKAGES]
    mapped = sum(kb for _, _, kb in memory._library_mappings(folders))
    released = memory.release_code()
    if sys.platform.startswith("linux"):
        assert released > 0 and sum(kb for _, _, kb in memory._library_mappings(folders)) < mapped
    assert rt.fill_mask(text) == before
    monkeypatch.setattr(memory, "MADVISE", None)
    assert memory.release_code() == 0 and rt.fill_mask(text) == before


# -- the manifest's fields the runtime acts on, cross-checked against the graphs (an edited manifest is refused) ------


def _edited(artifact: Path, folder: Path, edit) -> Path:
    """A copy of ``artifact`` whose manifest ``edit(manifest)`` changed (its files, hashed, untouched)."""
    import shutil

    shutil.copytree(artifact, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _generated(manifest: dict) -> dict:
    return next(w for w in manifest["ram_int8"]["weights"] if "offset" not in w)


def _square_layout(manifest: dict) -> None:
    w = next(w for w in manifest["ram_int8"]["weights"] if w["shape"][0] == w["shape"][1])
    w["layout"] = "nk"


def _second_record(manifest: dict) -> None:
    twin = dict(_generated(manifest), int8="twin.int8", scale="twin.scale")
    manifest["ram_int8"]["weights"].append(twin)


def _same_rows(manifest: dict) -> None:
    cut = [w for w in manifest["ram_int8"]["weights"] if "offset" in w]
    cut[1]["offset"] = cut[0]["offset"]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: _generated(m).update(layout="nk"), "weight .* layout nk with shape .* does not match its generator"),
        (_square_layout, "weights differ from the record in ram_int8/compute.onnx"),
        (_second_record, "two weight records take the generator output"),
        (_same_rows, "weights .* take overlapping rows of the product"),
    ],
    ids=["layout", "square-layout", "two-records", "same-rows"],
)
def test_an_edited_ram_int8_record_is_refused_naming_the_field(artifact, tmp_path, edit, message):
    """The manifest is not hashed (without --pin): a weight record edited by hand is refused at load, before any
    answer (it gave answers at cosine 0.77-0.98 to the true ones)."""
    with pytest.raises(contract.ArtifactError, match=f"manifest.json: ram_int8 {message}"):
        Runtime(_edited(artifact, tmp_path / "edited", edit), ram="int8", threads=1)
    assert Runtime(artifact, ram="int8", threads=1).metadata()["int8_generated_weights"] > 0  # the original loads


@pytest.mark.slow
def test_a_square_generated_weight_without_the_layout_record_is_refused_for_ram_int8(tmp_path):
    """A dense teacher's artifact (its 64 x 64 weights made whole by generator graphs) as exported before the
    compute graph recorded its weights (the record taken out, its hash in the manifest made right): the shapes tell
    no square weight's layout, so RAM int8 refuses it naming the re-export; fp32, which never reads the layouts,
    answers as the original does."""
    import hashlib
    import shutil

    import onnx

    clf = _tiny_bert_classifier(tmp_path / "bert")  # weights of 64 x 64 and up
    artifact = tmp_path / "artifact"
    export_model(clf, artifact, task="text-classification", quantize="int8", check_limit=8, runs=1, progress=False)
    old = tmp_path / "old"
    shutil.copytree(artifact, old)
    compute = old / contract.RAM_INT8_COMPUTE
    graph = onnx.load(compute, load_external_data=False)  # its external data stays where it is (model.onnx)
    kept = [p for p in graph.metadata_props if p.key != contract.RAM_INT8_RECORD]
    assert len(kept) < len(graph.metadata_props)
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    onnx.save(graph, compute)
    manifest = json.loads((old / "manifest.json").read_text())
    data = compute.read_bytes()
    manifest["files"][contract.RAM_INT8_COMPUTE] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (old / "manifest.json").write_text(json.dumps(manifest))
    square = next(w for w in manifest["ram_int8"]["weights"] if "offset" not in w and w["shape"][0] == w["shape"][1])
    with pytest.raises(contract.ArtifactError, match="holds no record of its layout") as e:
        Runtime(old, ram="int8", threads=1)
    assert f"weight {square['int8']!r} is square (64 x 64)" in str(e.value) and "export the model again" in str(e.value)
    answers = [Runtime(a, ram="fp32", threads=1).classify(SENTENCES) for a in (old, artifact)]
    assert answers[0] == answers[1]


def test_a_task_the_outputs_cannot_serve_is_refused(artifact, tmp_path):
    """task edited between fill-mask and feature-extraction: the graph's per-token width (vocabulary or hidden size,
    from config.json) says which it serves; either edit is refused in one line naming the task."""
    features = tmp_path / "features"
    export_model(artifact.parent / "model", features, task="feature-extraction", check_limit=8, runs=1, progress=False)
    for source, task in ((features, "fill-mask"), (artifact, "feature-extraction")):
        edited = _edited(source, tmp_path / task, lambda m, task=task: m.update(task=task))
        with pytest.raises(contract.ArtifactError, match=f"task '{task}' .* does not fit the model's output"):
            Runtime(edited, ram="fp32", threads=1)
    assert len(Runtime(features, threads=1).embed("a text")[0]) == TINY["hidden_size"]


def test_a_classifier_checked_on_more_sentences_than_ram_int8s_check_measures_both(tmp_path):
    """The export's parity runs on every labelled check sentence asked for (300 of SST-2 dev); the RAM-int8 parity on
    the first ``RAM_INT8_CHECK_SENTENCES`` with their own labels (it was handed all 300 labels and failed comparing
    256 predictions with them)."""

    from sharebert.export.exporter import RAM_INT8_CHECK_SENTENCES

    clf = _tiny_bert_classifier(tmp_path / "bert")  # weights of 64 x 64 and up
    limit = RAM_INT8_CHECK_SENTENCES + 44
    export_model(
        clf, tmp_path / "a", task="text-classification", quantize="int8", check_limit=limit, runs=1, progress=False
    )
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["parity"]["sentences"] == limit
    assert "accuracy_torch" in manifest["parity"]  # SST-2 dev's labels were read and compared
    ram = manifest["ram_int8"]["parity"]
    assert ram["sentences"] == RAM_INT8_CHECK_SENTENCES
    assert 0.0 <= ram["agreement"] <= 1.0


def _tiny_bert_classifier(folder: Path) -> Path:
    """A transformers BERT SST-2-shaped classifier (hidden 64: weights large enough for RAM-int8 graphs), seed 0,
    with a real WordPiece tokenizer, saved in ``folder``."""
    import torch
    import transformers
    from tiny_teachers import make_config, make_tokenizer

    tokenizer = make_tokenizer("wordpiece", "bert", True)
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(
        make_config("bert", tokenizer, hidden_size=64, intermediate_size=128, num_labels=2)
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
