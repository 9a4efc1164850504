"""The artifact's own check: ``sharebert verify`` / ``Runtime.verify()`` replay the inputs the manifest stores and
compare with PyTorch's answers at export; a damaged reference or damaged weights fail, naming the output."""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import shutil

import numpy as np
import pytest

from sharebert_runtime import ArtifactError, Runtime, artifact
from sharebert_runtime import reference as ref
from sharebert_runtime.cpu import cpu_info, describe
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
LABELS = ("neg", "neu", "pos")
QUICK = dict(check_limit=16, runs=3, progress=False)  # a short parity check and footprint timing


def _classifier(root, quantize: str):
    """A tiny ShareBERT classifier (three labels, a head large enough that its classes differ clearly) exported
    compact with ``quantize``: the artifact folder (RAM-int8 graphs included)."""
    import torch

    from sharebert import ShareBertForSequenceClassification
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import config_for_vocab
    from sharebert.formats.paths import default_vocab
    from sharebert.formats.tokenization import hf_tokenizer

    tokenizer = hf_tokenizer(default_vocab())
    config = config_for_vocab(
        "sharebert-tiny",
        {
            **TINY,
            "num_labels": len(LABELS),
            "id2label": dict(enumerate(LABELS)),
            "label2id": {x: i for i, x in enumerate(LABELS)},
        },
        len(tokenizer),
    )
    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    export_model(root / "model", root / "artifact", task="text-classification", quantize=quantize, **QUICK)
    return root / "artifact"


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return _classifier(tmp_path_factory.mktemp("fp32"), "none")


@pytest.fixture(scope="module")
def int8(tmp_path_factory):
    return _classifier(tmp_path_factory.mktemp("int8"), "int8")


def _manifest(folder) -> dict:
    return json.loads((folder / artifact.MANIFEST).read_text())


def _write_manifest(folder, manifest: dict) -> None:
    (folder / artifact.MANIFEST).write_text(json.dumps(manifest, indent=2))


def _verify_cli(folder, capsys, *options) -> tuple[int, str, str]:
    code = main(["verify", str(folder), *options])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_a_good_artifact_passes_in_both_ram_modes_and_the_manifest_stays_small(fp32, capsys):
    manifest = _manifest(fp32)
    entry = manifest[ref.KEY]
    assert len(json.dumps(entry)) < 6000  # a few KB: ids, mask, 16 rows of 3 logits
    assert manifest["cpu"]["machine"] == platform.machine()
    assert set(entry["thresholds"]) == {"fp32", "int8"}  # the artifact has RAM-int8 graphs
    assert entry["thresholds"]["fp32"] == {"max_abs_diff": 1e-3}
    for ram in ("fp32", "int8"):
        result = Runtime(fp32, threads=1, ram=ram).verify()
        assert result["passed"] and result["ram"] == ram, result
        logits = result["outputs"]["logits"]
        assert logits["rows"] == result["inputs"] == ref.SENTENCES and logits["below"] == []
        assert logits["cosine_mean"] >= entry["thresholds"][ram].get("cosine", 0.999)
        assert logits["top1_agreement"] == 1.0
        assert logits["at_export"] == entry[ref.AT_EXPORT[ram]]["logits"]  # the same mode's figures at export
        assert result["cpu"]["machine"] == platform.machine() and result["export_cpu"] == manifest["cpu"]
    fp32_result = Runtime(fp32, threads=1, ram="fp32").verify()["outputs"]["logits"]
    assert fp32_result["max_abs_diff"] <= 1e-3  # ONNX Runtime's fp32 against PyTorch: the export's own tolerance
    assert fp32_result["at_export"]["max_abs_diff"] <= 1e-3
    from sharebert.export.exporter import format_report

    assert f"measured on     {describe(manifest['cpu'])}" in format_report(manifest)  # export's printed footprint
    code, out, err = _verify_cli(fp32, capsys, "--ram", "int8")
    assert code == 0 and err == "", err
    assert "PASS" in out and f"this CPU    {describe(cpu_info())}" in out and "logits (16 rows)" in out


@pytest.mark.slow
def test_an_int8_artifact_passes_in_its_default_mode(int8, capsys):
    from sharebert.export.parity import THRESHOLDS

    rt = Runtime(int8, threads=1)
    assert rt.ram == "int8"  # auto: a compact int8 artifact loads as RAM int8, as predict and serve do
    result = rt.verify()
    assert result["passed"], result
    assert result["thresholds"] == THRESHOLDS["int8"]
    assert Runtime(int8, threads=1, ram="fp32").verify()["passed"]
    code, out, _ = _verify_cli(int8, capsys, "--json")
    printed = json.loads(out)
    assert code == 0 and printed["passed"] and printed["ram"] == "int8"
    assert printed["outputs"]["logits"]["top1_agreement"] == result["outputs"]["logits"]["top1_agreement"]


def _edited(values: dict, change) -> dict:
    data = np.frombuffer(base64.b64decode(values["base64"]), "<f4").copy()
    return {**values, "base64": base64.b64encode(change(data).astype("<f4").tobytes()).decode()}


@pytest.mark.slow
def test_edited_reference_outputs_fail_naming_the_output(fp32, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(fp32, bad)
    manifest = _manifest(bad)
    logits = manifest[ref.KEY]["outputs"]["logits"]
    logits["values"] = _edited(logits["values"], lambda x: x + 0.01)  # past the fp32 tolerance, same classes
    _write_manifest(bad, manifest)  # the manifest is not itself hashed: the artifact still loads
    result = Runtime(bad, threads=1, ram="fp32").verify()
    assert not result["passed"]
    assert result["outputs"]["logits"]["below"] == [
        f"max_abs_diff {result['outputs']['logits']['max_abs_diff']:.4g} > 0.001"
    ]
    assert 0.0099 < result["outputs"]["logits"]["max_abs_diff"] < 0.0101
    code, out, _ = _verify_cli(bad, capsys, "--ram", "fp32")
    assert code == 1 and "FAIL" in out and "logits: max_abs_diff" in out
    pin = hashlib.sha256((fp32 / artifact.MANIFEST).read_bytes()).hexdigest()
    assert _verify_cli(fp32, capsys, "--pin", pin)[0] == 0
    code, out, err = _verify_cli(bad, capsys, "--pin", pin)  # pinned, the edited manifest is refused outright
    assert code == 2 and out == "" and "does not match the pinned sha256" in err

    logits["values"] = _edited(logits["values"], lambda x: -x)  # other classes: fails the int8 thresholds too
    _write_manifest(bad, manifest)
    result = Runtime(bad, threads=1, ram="int8").verify()
    below = result["outputs"]["logits"]["below"]
    assert not result["passed"] and below[0].startswith("top1_agreement") and below[1].startswith("cosine_mean")
    assert _verify_cli(bad, capsys, "--ram", "int8")[0] == 1


def _perturb_largest_weight(folder) -> None:
    """Add noise the size of its own spread to the largest float initializer of model.onnx, in place (the same
    bytes' length and offset: the RAM-int8 graphs read model.onnx's bytes), then re-hash the file in the
    manifest so that the checksum passes and only verify can tell."""
    import onnx
    from onnx import numpy_helper

    path = folder / artifact.MODEL
    proto = onnx.load(str(path))
    floats = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    weight = max(floats, key=lambda a: a.size)
    data = path.read_bytes()
    at = data.find(weight.tobytes())
    assert at > 0 and data.count(weight.tobytes()) == 1
    noisy = weight + np.random.default_rng(0).normal(0, weight.std(), weight.shape).astype(np.float32)
    path.write_bytes(data[:at] + noisy.astype(np.float32).tobytes() + data[at + weight.nbytes :])
    manifest = _manifest(folder)
    manifest["files"][artifact.MODEL] = {"sha256": artifact.sha256(path), "bytes": path.stat().st_size}
    _write_manifest(folder, manifest)


@pytest.mark.slow
def test_perturbed_weights_with_a_matching_checksum_fail(fp32, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(fp32, bad)
    _perturb_largest_weight(bad)
    for ram in ("fp32", "int8"):
        result = Runtime(bad, threads=1, ram=ram).verify()  # loads: the checksum matches
        assert not result["passed"] and result["outputs"]["logits"]["below"], (ram, result)
        code, out, _ = _verify_cli(bad, capsys, "--ram", ram)
        assert code == 1 and "FAIL" in out and "logits:" in out


@pytest.mark.slow
def test_an_artifact_without_a_reference_or_with_a_broken_one_is_exit_2_in_one_line(fp32, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(fp32, old)
    manifest = _manifest(old)
    entry = manifest.pop(ref.KEY)
    _write_manifest(old, manifest)  # as an artifact exported before the field
    with pytest.raises(ArtifactError, match=r"carries no reference outputs \(export it again\)"):
        Runtime(old, threads=1).verify()
    code, out, err = _verify_cli(old, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == f"sharebert verify: error: {old} carries no reference outputs (export it again)\n"
    broken = {
        "base64": {**entry, "input_ids": {**entry["input_ids"], "base64": "not base64!"}},
        "shape": {**entry, "attention_mask": {**entry["attention_mask"], "shape": [3, 3]}},
        "thresholds": {**entry, "thresholds": {"fp32": {"cosine": "high"}}},
        "output": {**entry, "outputs": {"no_such_output": entry["outputs"]["logits"]}},
    }
    for what, damaged in broken.items():
        _write_manifest(old, {**manifest, ref.KEY: damaged})
        code, out, err = _verify_cli(old, capsys, "--ram", "fp32")
        assert code == 2 and err.count("\n") == 1 and "reference" in err and "Traceback" not in err, (what, err)


def test_a_missing_or_garbage_artifact_is_one_line_and_exit_2(tmp_path, capsys):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / artifact.MANIFEST).write_bytes(b"\x00\xff not json")
    (tmp_path / "file").write_text("hello")
    for path in (tmp_path / "missing", garbage, tmp_path / "file"):
        code, out, err = _verify_cli(path, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("sharebert verify: error: "), err


def test_stored_arrays_round_trip_and_damage_is_refused():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    packed = ref.pack(a, "float32")
    np.testing.assert_array_equal(ref.unpack(packed, "x", "m"), a)
    for bad in ({**packed, "shape": [4, 4]}, {**packed, "dtype": "float64"}, {**packed, "shape": [-3, -4]}, None):
        with pytest.raises(ArtifactError, match="reference x is not a stored array"):
            ref.unpack(bad, "x", "m")


def test_figures_and_thresholds_follow_from_the_arrays():
    want = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    got = np.array([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]], np.float32)  # row 2: orthogonal, another class
    f = ref._figures(want, got, (want.argmax(-1), got.argmax(-1)))
    assert f == {"rows": 2, "max_abs_diff": 2.0, "cosine_min": 0.0, "cosine_mean": 0.5, "top1_agreement": 0.5}
    assert ref.below(f, {"top1": 0.5, "cosine": 0.5}) == []
    assert ref.below(f, {"top1": 0.9, "cosine": 0.99, "max_abs_diff": 1e-3}) == [
        "top1_agreement 0.5 < 0.9",
        "cosine_mean 0.5 < 0.99",
        "max_abs_diff 2 > 0.001",
    ]
    assert ref.below({**f, "cosine_mean": float("nan")}, {"cosine": 0.0}) == ["cosine_mean nan < 0"]


@pytest.mark.parametrize(
    "machine, text, features, missing",
    [
        ("x86_64", "model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n", ["avx2"], 5),
        ("aarch64", "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU part\t: 0xd0c\n", ["asimd", "asimddp"], 1),
        ("x86_64", None, None, None),  # no /proc/cpuinfo (macOS, Windows): unknown, not guessed
    ],
)
def test_cpu_info_reads_the_int8_features(machine, text, features, missing, tmp_path, monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    path = tmp_path / "cpuinfo"
    if text is not None:
        path.write_text(text)
    info = cpu_info(str(path))
    assert info["machine"] == machine and info["int8_features"] == features
    assert (info["int8_missing"] if missing is None else len(info["int8_missing"])) == missing
    line = describe(info)
    assert line.startswith(machine) and ("int8 features unknown" if text is None else f"int8: {features[0]}") in line


def test_the_stored_sentences_are_the_first_short_ones_then_long_ones_cut():
    assert ref.choose([2, 5, 50, 7, 100, 3], 1) == [1, 3, 5, 2, 4]  # 2 tokens: no word; 50 and 100: cut to 40, last
    assert ref.choose([10] * 40, 1) == list(range(ref.SENTENCES))
    assert ref.choose([10] * 40, 384) == list(range(ref.VECTOR_VALUES // 384))  # all-MiniLM-L6-v2's vectors: 5
    assert ref.choose([10] * 40, 4096) == list(range(4))  # at least 4, however wide
