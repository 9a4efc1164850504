"""Bad input against `sharebert export`, the artifact runtime and `sharebert predict`, as tables.

Every CLI row runs the real command and asserts: exit status 2, one stderr line naming the problem, no
traceback, and every file of the user's still there, byte-identical, with nothing new left beside them.
The export table (and the overwrite) calls ``sharebert_runtime.main.main`` in this process (``_main``: torch loads
once; an exception escaping it fails the row); rows about the process itself (a file size limit, bytes in argv,
stdin) and the predict rows run ``python -m sharebert`` in a subprocess. Runtime rows rewrite one manifest field (or
file) of a copied artifact and assert the refusal names the manifest or the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharebert.export.exporter import ParityError, export_model
from sharebert.formats.build import build_model
from sharebert_runtime import ArtifactError, Runtime

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=8, runs=2, progress=False)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "model"
    build_model("sharebert-tiny", folder, TINY, seed=0)
    return folder


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, model_dir):
    folder = tmp_path_factory.mktemp("artifact") / "artifact"
    export_model(model_dir, folder, **QUICK)
    return folder


def _cli(*argv, cwd, preexec=None):
    """``sharebert ARGV`` in a fresh process, started as the installed console script starts it
    (``sharebert_runtime.main:main``): ``predict`` and ``serve`` never import torch (``-m sharebert`` would import
    the library and transformers first, ~6 s of CPU a process, for nothing these refusals depend on)."""
    return subprocess.run(
        [sys.executable, "-m", "sharebert_runtime", *map(str, argv)],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        preexec_fn=preexec,
        timeout=600,
    )


def _main(*argv, cwd, capfd, monkeypatch) -> subprocess.CompletedProcess:
    """``sharebert ARGV`` run in this process from ``cwd`` (``sharebert_runtime.main.main``, as the console script calls
    it), with what reached fds 1 and 2."""
    from sharebert_runtime.main import main

    capfd.readouterr()
    with monkeypatch.context() as m:
        m.chdir(cwd)
        rc = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, rc, out, err)


def _snapshot(root: Path) -> dict:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _assert_refused(proc, *fragments):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _set_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _small_vocab_model(folder: Path) -> None:
    """A model with a 1024-id embedding beside the 30,522-token tokenizer."""
    import sharebert

    config = sharebert.ShareBertConfig.from_preset("sharebert-tiny", vocab_size=1024, **TINY)
    sharebert.ShareBertForMaskedLM(config).save_pretrained(folder)


# (id, preparation of the user's folder U (holding the model folder U/P/model, U/P/notes.txt, an artifact
#  U/art and a file U/notes.txt), export arguments, fragments the one-line message must hold)
EXPORT_CASES = [
    ("out-is-parent-of-model", None, ["--out", "P", "--overwrite"], ["--out P", "is, or holds, the input"]),
    ("out-is-model", None, ["--out", "P/model", "--overwrite"], ["--out P/model", "is, or holds, the input"]),
    ("out-inside-model", None, ["--out", "P/model/onnx"], ["--out P/model/onnx", "lies inside the input"]),
    ("out-deep-inside-model", None, ["--out", "P/model/a/b"], ["--out P/model/a/b", "lies inside the input"]),
    ("out-is-a-file", None, ["--out", "notes.txt", "--overwrite"], ["notes.txt is a file"]),
    ("out-under-a-file", None, ["--out", "notes.txt/art"], ["notes.txt is a file, not a folder"]),
    ("out-not-ours", None, ["--out", "P/..", "--overwrite"], ["is, or holds, the input"]),
    (
        "out-nonempty-not-ours",
        lambda u: (u / "mine").mkdir() or _write(u / "mine" / "a.txt", b"mine"),
        ["--out", "mine", "--overwrite"],
        ["mine is a non-empty folder that is not a sharebert artifact"],
    ),
    (
        "out-artifact-without-overwrite",
        None,
        ["--out", "art"],
        ["art already holds a sharebert artifact", "--overwrite"],
    ),
    ("model-is-an-artifact", None, ["--model", "art", "--out", "new"], ["art is an exported ONNX artifact"]),
    ("check-limit-zero", None, ["--out", "new", "--check-limit", "0"], ["--check-limit", "got 0"]),
    ("check-limit-negative", None, ["--out", "new", "--check-limit", "-5"], ["--check-limit", "got -5"]),
    (
        "calibration-binary",
        lambda u: _write(u / "cal.tsv", bytes(range(256)) * 8),
        ["--out", "new", "--quantize", "int8-static", "--calibration", "cal.tsv"],
        ["cal.tsv is not a UTF-8 text file"],
    ),
    (
        "calibration-latin1",
        lambda u: _write(u / "cal.txt", "caf\xe9 au lait\n".encode("latin-1")),
        ["--out", "new", "--quantize", "int8-static", "--calibration", "cal.txt"],
        ["cal.txt is not a UTF-8 text file"],
    ),
    (
        "calibration-dev-zero",
        None,
        ["--out", "new", "--quantize", "int8-static", "--calibration", "/dev/zero"],
        ["sentence file /dev/zero: a character device, not a regular file"],
    ),
    (
        "calibration-line-over-1MiB",
        lambda u: _write(u / "cal.txt", b"x " * (1 << 20)),
        ["--out", "new", "--quantize", "int8-static", "--calibration", "cal.txt"],
        ["cal.txt line 1: longer than 1048576 bytes"],
    ),
    (
        "calibration-empty",
        lambda u: _write(u / "cal.txt", b""),
        ["--out", "new", "--quantize", "int8-static", "--calibration", "cal.txt"],
        ["cal.txt holds no sentences"],
    ),
    (
        "check-file-binary",
        lambda u: _write(u / "check.txt", b"\x00\x01\x02abc\n"),
        ["--out", "new", "--check-file", "check.txt"],
        ["check.txt is not a UTF-8 text file"],
    ),
    (
        "config-truncated",
        lambda u: _half(u / "P/model/config.json"),
        ["--out", "new"],
        ["config.json is not valid JSON"],
    ),
    (
        "config-a-list",
        lambda u: _write(u / "P/model/config.json", b"[1, 2]"),
        ["--out", "new"],
        ["config.json is not a JSON object"],
    ),
    (
        "config-field-out-of-range",
        lambda u: _set_config(u / "P/model", hidden_size="abc"),
        ["--out", "new"],
        ["config.json is not a valid model config", "hidden_size"],
    ),
    (
        "safetensors-missing",
        lambda u: (u / "P/model/model.safetensors").unlink(),
        ["--out", "new"],
        ["cannot load the weights"],
    ),
    (
        "safetensors-truncated",
        lambda u: _half(u / "P/model/model.safetensors"),
        ["--out", "new"],
        ["model.safetensors", "cannot load the weights"],
    ),
    (
        "tokenizer-truncated",
        lambda u: _half(u / "P/model/tokenizer.json"),
        ["--out", "new"],
        ["tokenizer.json cannot be read"],
    ),
    (
        "tokenizer-larger-than-vocab",
        lambda u: _small_vocab_model(u / "P/model"),
        ["--out", "new"],
        ["30522 tokens but config.vocab_size is 1024"],
    ),
    (
        "mlm-exported-as-causal-lm",
        None,
        ["--out", "new", "--task", "causal-lm"],
        ["holds a fill-mask model", "not a causal-lm one", "--task fill-mask"],
    ),
    (
        "mlm-exported-as-classifier",
        None,
        ["--out", "new", "--task", "text-classification"],
        ["no trained weights", "classifier.weight", "--task fill-mask"],
    ),
]


@pytest.fixture
def user(tmp_path, model_dir, artifact):
    """The user's folder: U/P/model (a model), U/P/notes.txt, U/art (an artifact), U/notes.txt."""
    shutil.copytree(model_dir, tmp_path / "P" / "model")
    (tmp_path / "P" / "notes.txt").write_text("my notes\n")
    shutil.copytree(artifact, tmp_path / "art")
    (tmp_path / "notes.txt").write_text("keep me\n")
    return tmp_path


@pytest.mark.parametrize("prepare, args, fragments", [c[1:] for c in EXPORT_CASES], ids=[c[0] for c in EXPORT_CASES])
def test_export_refuses_bad_input_and_keeps_every_file(user, prepare, args, fragments, capfd, monkeypatch):
    if prepare:
        prepare(user)
    before = _snapshot(user)
    argv = ["export", *(["--model", "P/model"] if "--model" not in args else []), *args]
    argv += ["--check-limit", "4"] if "--check-limit" not in args else []
    _assert_refused(_main(*argv, cwd=user, capfd=capfd, monkeypatch=monkeypatch), *fragments)
    assert _snapshot(user) == before  # nothing lost, changed, or left behind (no empty --out, no temporary folder)


def test_export_disk_full_leaves_nothing(user):
    """A file size limit (as a full disk) met while writing: one line, and no --out or temporary folder."""

    def limit():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    before = _snapshot(user)
    proc = _cli("export", "--model", "P/model", "--out", "deep/new", "--check-limit", "4", cwd=user, preexec=limit)
    _assert_refused(proc, "no space left", "deep/new")
    assert _snapshot(user) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_export_refuses_unwritable_out(user):
    (user / "ro").mkdir(mode=0o555)
    _assert_refused(_cli("export", "--model", "P/model", "--out", "ro/new", cwd=user), "is not writable")


def test_overwrite_replaces_only_an_artifact(user, artifact, capfd, monkeypatch):
    before = (user / "art" / "manifest.json").read_bytes()
    proc = _main(
        "export",
        "--model",
        "P/model",
        "--out",
        "art",
        "--overwrite",
        "--check-limit",
        "4",
        "--quantize",
        "int8",
        cwd=user,
        capfd=capfd,
        monkeypatch=monkeypatch,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((user / "art" / "manifest.json").read_text())
    assert manifest["quantization"] == "int8" and (user / "art" / "manifest.json").read_bytes() != before
    assert sorted(p.name for p in user.iterdir()) == ["P", "art", "notes.txt"]
    assert (user / "P" / "notes.txt").read_text() == "my notes\n"


def test_artifact_is_published_with_the_umask_permissions(artifact):
    umask = os.umask(0)
    os.umask(umask)
    assert artifact.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
    for file in artifact.iterdir():
        assert file.stat().st_mode & 0o666 == 0o666 & ~umask


def _nan_model(model_dir: Path, folder: Path) -> Path:
    import torch

    from sharebert import ShareBertForMaskedLM

    shutil.copytree(model_dir, folder)
    model = ShareBertForMaskedLM.from_pretrained(folder)
    with torch.no_grad():
        model.sharebert.embeddings.LayerNorm.weight[0] = float("nan")
    model.save_pretrained(folder)
    return folder


def test_parity_fails_on_nan(tmp_path, model_dir):
    """A model whose outputs are NaN: `nan > 1e-3` is False, the check must still fail (and write nothing)."""
    folder = _nan_model(model_dir, tmp_path / "nan")
    for quantize in ("none", "int8"):
        with pytest.raises(ParityError, match="not finite"):
            export_model(folder, tmp_path / "out", quantize=quantize, **QUICK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan"]


def test_char_level_causal_lm_exports(tmp_path):
    """A 60-odd character vocabulary: the footprint's random ids must lie inside it."""
    from sharebert.formats.build import build_model
    from sharebert.training.corpus import char_tokenizer

    text = "the quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! 0123456789,;:?'"
    _, tokenizer = build_model(
        "charlm-tiny",
        tmp_path / "char",
        dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128),
        head="clm",
        tokenizer=char_tokenizer(text),
    )
    assert len(tokenizer) < 100
    manifest = export_model(tmp_path / "char", tmp_path / "art", **QUICK)
    assert manifest["task"] == "causal-lm" and manifest["parity"]["max_abs_diff"] <= 1e-3
    assert len(Runtime(tmp_path / "art").generate("the quick", max_new_tokens=5)[0]) > 0


# -- the runtime: the manifest is checked field by field ---------------------------------------------------------
def _rehash(folder: Path, manifest: dict, name: str) -> None:
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _outside_generator(folder: Path, manifest: dict) -> None:
    """``ram_int8.generator`` moved beside the artifact, named by ``..``, consistently hashed."""
    shutil.copy(folder / manifest["ram_int8"]["generator"], folder.parent / "gen.onnx")
    manifest["ram_int8"]["generator"] = "../gen.onnx"
    data = (folder.parent / "gen.onnx").read_bytes()
    manifest["files"]["../gen.onnx"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _unlisted_generator(folder: Path, manifest: dict) -> None:
    """``ram_int8.generator`` not listed in ``files`` (and then truncated: nothing would notice)."""
    name = manifest["ram_int8"]["generator"]
    del manifest["files"][name]
    _half(folder / name)


def _symlinked_tokenizer(folder: Path, manifest: dict) -> None:
    """tokenizer.json replaced by a link to an identical file outside the artifact."""
    shutil.copy(folder / "tokenizer.json", folder.parent / "tokenizer.json")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(folder.parent / "tokenizer.json")


def _field(**fields):
    return lambda folder, manifest: manifest.update(fields)


def _special(**ids):
    return lambda folder, manifest: manifest["special_tokens"].update(ids)


# (id, change to the copied artifact (folder, manifest dict; the manifest is written after), fragment of the message)
RUNTIME_CASES = [
    ("max-length-string", _field(max_length="128"), "max_length"),
    ("max-length-zero", _field(max_length=0), "max_length"),
    ("max-length-huge", _field(max_length=10**12), "max_length"),
    ("max-length-bool", _field(max_length=True), "max_length"),
    ("pad-negative", _special(pad=-1), "special_tokens"),
    ("pad-string", _special(pad="0"), "special_tokens"),
    ("mask-beyond-vocab", _special(mask=10**6), "special_tokens mask"),
    ("mask-beyond-32-bits", _special(mask=10**12), "special_tokens mask"),
    ("task-unknown", _field(task="translation"), "task"),
    ("labels-number", _field(labels=5), "labels"),
    ("labels-empty", _field(labels=[]), "labels"),
    ("problem-type-unknown", _field(problem_type="ranking"), "problem_type"),
    ("format-version-3", _field(format_version=3), "format_version"),
    ("session-config-not-allowed", _field(session_config={"session.load_model_format": "ORT"}), "session_config"),
    ("session-config-list", _field(session_config=["x"]), "session_config"),
    ("files-not-a-dict", _field(files=["model.onnx"]), "files"),
    ("model-not-listed", lambda f, m: m["files"].pop("model.onnx"), "does not list model.onnx"),
    ("sha256-missing", lambda f, m: m["files"]["model.onnx"].pop("sha256"), "'model.onnx'"),
    ("bytes-string", lambda f, m: m["files"]["tokenizer.json"].update(bytes="12"), "'tokenizer.json'"),
    ("absolute-file", lambda f, m: m["files"].update({"/etc/hostname": m["files"]["config.json"]}), "/etc/hostname"),
    ("generator-outside", _outside_generator, "../gen.onnx"),
    ("generator-unlisted", _unlisted_generator, "ram_int8/generator.onnx"),
    ("generator-not-a-string", lambda f, m: m["ram_int8"].update(generator=["a"]), "ram_int8"),
    ("ram-int8-layout", lambda f, m: m["ram_int8"]["weights"][0].update(layout="xx"), "ram_int8"),
    ("tokenizer-symlink-outside", _symlinked_tokenizer, "tokenizer.json leads outside"),
    (
        "rows-offset-past-the-product",
        lambda f, m: _row_weight(m).update(offset=m["ram_int8"]["width"] * m["ram_int8"]["height"]),
        "ram_int8",
    ),
    ("rows-offset-negative", lambda f, m: _row_weight(m).update(offset=-1), "ram_int8"),
    ("rows-shape-zero", lambda f, m: _row_weight(m).update(shape=[0, 4]), "ram_int8"),
    ("rows-width-missing", lambda f, m: m["ram_int8"].pop("width"), "ram_int8"),
    ("rows-unlisted", lambda f, m: m["files"].pop(m["ram_int8"]["rows"]), "ram_int8/rows.onnx"),
    ("weight-without-source", lambda f, m: _row_weight(m).pop("offset"), "names neither"),
    ("weight-not-an-object", lambda f, m: m["ram_int8"]["weights"].__setitem__(0, 1), "ram_int8"),
    ("rows-width-off-by-one", lambda f, m: m["ram_int8"].update(width=m["ram_int8"]["width"] + 1), "ram_int8"),
    ("rows-height-off-by-one", lambda f, m: m["ram_int8"].update(height=m["ram_int8"]["height"] + 1), "ram_int8"),
    (
        "rows-shape-reshaped",
        lambda f, m: _row_weight(m).update(shape=[2 * _row_weight(m)["shape"][0], _row_weight(m)["shape"][1] // 2]),
        "ram_int8",
    ),
    ("rows-file-is-the-compute-graph", lambda f, m: m["ram_int8"].update(rows=m["ram_int8"]["compute"]), "ram_int8"),
    (
        "generator-output-unknown",
        lambda f, m: next(w for w in m["ram_int8"]["weights"] if "output" in w).update(output="nope"),
        "ram_int8",
    ),
    (
        "weight-generator-unlisted",
        lambda f, m: _whole_weight(m).update(generator="ram_int8/generator.9.onnx"),
        "does not list ram_int8/generator.9.onnx",
    ),
    ("weight-generator-outside", lambda f, m: _whole_weight(m).update(generator="../gen.onnx"), "../gen.onnx"),
    ("weight-generator-not-a-string", lambda f, m: _whole_weight(m).update(generator=5), "ram_int8"),
    ("task-does-not-fit-the-output", _field(task="text-classification", labels=["a", "b"]), "does not fit"),
    ("max-length-over-the-positions", _field(max_length=4096), "max_length 4096 exceeds the model's"),
    ("max-depth-over-the-layers", _field(max_depth=3), "max_depth 3"),
    (
        "embedding-pooling-a-list",
        _field(embedding={"pooling": ["mean"], "normalize": True, "output": "logits"}),
        "pooling ['mean'] is not one of",
    ),
    ("embedding-not-an-object", _field(embedding="mean"), "embedding must be an object"),
]


def _whole_weight(manifest: dict) -> dict:
    """The first RAM-int8 weight the runtime makes whole, from a generator graph's output."""
    return next(w for w in manifest["ram_int8"]["weights"] if "output" in w)


def _row_weight(manifest: dict) -> dict:
    """The first RAM-int8 weight the runtime makes from rows of the generated product."""
    return next(w for w in manifest["ram_int8"]["weights"] if "offset" in w)


@pytest.mark.parametrize("change, fragment", [c[1:] for c in RUNTIME_CASES], ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_refuses_a_bad_manifest(tmp_path, artifact, change, fragment):
    folder = tmp_path / "art"
    shutil.copytree(artifact, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    change(folder, manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as e:
        Runtime(
            folder, ram="int8" if "generator" in fragment or "ram_int8" in fragment or "neither" in fragment else "fp32"
        )
    assert fragment in str(e.value) and str(folder) in str(e.value)


def test_runtime_names_a_graph_onnx_runtime_cannot_load(tmp_path, artifact):
    """A consistently re-hashed model.onnx that is not a graph: an ArtifactError naming it, not ORT's."""
    folder = tmp_path / "art"
    shutil.copytree(artifact, folder)
    (folder / "model.onnx").write_bytes(b"not a graph")
    manifest = json.loads((folder / "manifest.json").read_text())
    _rehash(folder, manifest, "model.onnx")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="model.onnx cannot be loaded by ONNX Runtime"):
        Runtime(folder)
    _assert_refused(_cli("predict", folder, "x", cwd=tmp_path), "model.onnx cannot be loaded")


@pytest.mark.parametrize("text", ["{", "[" * 100_000, "\xff", '{"format": "sharebert-onnx", "format_version": 1}'])
def test_runtime_refuses_an_unreadable_manifest(tmp_path, artifact, text):
    folder = tmp_path / "art"
    shutil.copytree(artifact, folder)
    (folder / "manifest.json").write_text(text, encoding="latin-1")
    with pytest.raises(ArtifactError, match="manifest.json"):
        Runtime(folder)


def test_pinning(artifact, tmp_path):
    """The manifest's sha256 pins the artifact, also against a consistently rewritten manifest."""
    pin = hashlib.sha256((artifact / "manifest.json").read_bytes()).hexdigest()
    assert Runtime(artifact, manifest_sha256=pin.upper()).task == "fill-mask"
    folder = tmp_path / "art"
    shutil.copytree(artifact, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["special_tokens"]["pad"] = manifest["special_tokens"]["unk"]  # valid, consistent, but not the same
    (folder / "manifest.json").write_text(json.dumps(manifest))
    Runtime(folder)  # the checksums alone cannot tell
    with pytest.raises(ArtifactError, match="pinned sha256"):
        Runtime(folder, manifest_sha256=pin)
    for command in ("predict", "serve"):
        proc = _cli(command, folder, *(["x"] if command == "predict" else []), "--pin", pin, cwd=tmp_path)
        _assert_refused(proc, "manifest.json does not match the pinned sha256")
    _assert_refused(_cli("predict", artifact, "x", "--pin", "abc", cwd=tmp_path), "64 hexadecimal digits")
    proc = _cli("predict", artifact, "a [MASK] .", "--pin", pin, "--json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["line"] == 1


# -- predict -------------------------------------------------------------------------------------------------------
PREDICT_CASES = [
    ("output-is-a-folder", ["--output", "."], "is a folder"),
    ("output-in-missing-folder", ["--output", "nope/out.jsonl"], "does not exist"),
    (
        "output-under-a-file",
        ["--output", "in.txt/out.jsonl"],
        "--output in.txt/out.jsonl: in.txt is a file, not a folder",
    ),
    ("output-is-the-input", ["--output", "in.txt"], "is the --input file"),
    ("top-k-zero", ["--top-k", "0"], "--top-k"),
    ("pooling-on-fill-mask", ["--pooling", "mean"], "--pooling and --normalize are for feature-extraction"),
    ("normalize-on-fill-mask", ["--no-normalize"], "--pooling and --normalize are for feature-extraction"),
]


def test_predict_refuses_a_text_argument_that_is_not_utf8(tmp_path, artifact):
    proc = subprocess.run(
        [sys.executable, "-m", "sharebert_runtime", "predict", str(artifact).encode(), b"ok", b"\xff [MASK]"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    _assert_refused(proc, "TEXT argument 2 is not valid UTF-8")


@pytest.mark.parametrize("args, fragment", [c[1:] for c in PREDICT_CASES], ids=[c[0] for c in PREDICT_CASES])
def test_predict_refuses_before_work(tmp_path, artifact, args, fragment):
    (tmp_path / "in.txt").write_text("a [MASK] .\n")
    before = _snapshot(tmp_path)
    _assert_refused(_cli("predict", artifact, "--input", "in.txt", *args, cwd=tmp_path), fragment)
    assert _snapshot(tmp_path) == before


# (id, --input, stdin, fragment): an input that is not one text per line is refused in bounded memory
PREDICT_INPUT_CASES = [
    ("input-dev-zero", "/dev/zero", None, "--input /dev/zero: a character device, not a regular file"),
    ("input-folder", ".", None, "--input .: a folder, not a regular file"),
    ("input-missing", "nope.txt", None, "--input nope.txt: not found"),
    ("input-line-over-1MiB", "long.txt", None, "--input long.txt line 2: longer than 1048576 bytes"),
    ("stdin-dev-zero", "-", "/dev/zero", "--input - line 1: longer than 1048576 bytes"),
]


@pytest.mark.parametrize(
    "path, stdin, fragment", [c[1:] for c in PREDICT_INPUT_CASES], ids=[c[0] for c in PREDICT_INPUT_CASES]
)
def test_predict_reads_input_lines_in_bounded_memory(tmp_path, artifact, path, stdin, fragment):
    (tmp_path / "long.txt").write_bytes(b"a [MASK] .\n" + b"word " * (1 << 18) + b"\n")
    with open(stdin or os.devnull, "rb") as f:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "sharebert_runtime",
                "predict",
                str(artifact),
                "--input",
                path,
                "--output",
                "out.jsonl",
            ],
            cwd=tmp_path,
            env=ENV,
            stdin=f,
            capture_output=True,
            text=True,
            timeout=600,
        )
    _assert_refused(proc, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.txt"]  # no output, no temporary file


def _file_size_limit():
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def _full_disk_predict(tmp_path, artifact, lines, limit):
    """``predict --input in.txt --output disk/out.jsonl`` with ``disk/out.jsonl`` the user's earlier results, the
    disk full at 4 KiB of new output: ``limit`` "rlimit" (a file size limit: EFBIG) or "tmpfs" (an 8 KiB tmpfs
    mounted on ``disk`` in a new user and mount namespace: a real ENOSPC). Returns the process, and ``disk``'s
    files and the earlier results as the command left them."""
    (tmp_path / "in.txt").write_text("".join(f"the [MASK] number {n} .\n" for n in range(lines)))
    disk = tmp_path / "disk"
    disk.mkdir()
    predict = [
        sys.executable,
        "-m",
        "sharebert_runtime",  # the console script's module (see _cli)
        "predict",
        str(artifact),
        "--input",
        "in.txt",
        "--output",
        "disk/out.jsonl",
        "--top-k",
        "5",
    ]
    if limit == "rlimit":
        (disk / "out.jsonl").write_text("earlier results\n")
        proc = subprocess.run(
            predict, cwd=tmp_path, env=ENV, capture_output=True, text=True, preexec_fn=_file_size_limit, timeout=600
        )
        return proc, sorted(p.name for p in disk.iterdir()), (disk / "out.jsonl").read_text()
    mount = f"mount -t tmpfs -o size=8k tmpfs {disk} && echo 'earlier results' > {disk}/out.jsonl"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "sh", "-c", mount]).returncode:
        pytest.skip("no tmpfs can be mounted here (unshare -Urm: user namespaces not allowed)")
    script = (
        f'{mount} && "$@" 2>{tmp_path}/err; code=$?; ls -A {disk} > {tmp_path}/left; '
        f"cat {disk}/out.jsonl > {tmp_path}/kept; exit $code"
    )
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, "sh", *predict],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    proc.stderr = (tmp_path / "err").read_text()
    return proc, (tmp_path / "left").read_text().split(), (tmp_path / "kept").read_text()


@pytest.mark.parametrize(
    "limit, lines", [("rlimit", 12), ("tmpfs", 300)], ids=["file-size-limit-at-the-end", "tmpfs-full-mid-run"]
)
def test_predict_output_on_a_full_disk_leaves_no_temporary_file(tmp_path, artifact, limit, lines):
    """A full disk while --output is written (at its last flush: 12 lines of output fit in the write buffer; or
    mid-run): one line naming the file, exit 2, no temporary file left, the user's earlier file as it was."""
    proc, left, kept = _full_disk_predict(tmp_path, artifact, lines, limit)
    _assert_refused(proc, "no space left on the device", "while writing disk/out.jsonl")
    assert left == ["out.jsonl"] and kept == "earlier results\n"


def test_predict_output_keeps_the_umask_permissions(tmp_path, artifact):
    (tmp_path / "in.txt").write_text("a [MASK] .\n")
    assert _cli("predict", artifact, "--input", "in.txt", "--output", "out.jsonl", cwd=tmp_path).returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def _nan_artifact(artifact: Path, folder: Path) -> Path:
    """The artifact with one LayerNorm gain set to NaN in model.onnx, consistently re-hashed (predicts NaN)."""
    import onnx
    from onnx import numpy_helper

    shutil.copytree(artifact, folder)
    proto = onnx.load(str(folder / "model.onnx"))
    init = next(i for i in proto.graph.initializer if "LayerNorm.weight" in i.name)
    values = numpy_helper.to_array(init).copy()
    values[:] = np.nan
    init.CopyFrom(numpy_helper.from_array(values, init.name))
    onnx.save(proto, str(folder / "model.onnx"))
    manifest = json.loads((folder / "manifest.json").read_text())
    _rehash(folder, manifest, "model.onnx")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_predict_never_writes_nan(tmp_path, artifact):
    folder = _nan_artifact(artifact, tmp_path / "nan")
    (tmp_path / "in.txt").write_text("a [MASK] .\nno mask here\n")
    proc = _cli("predict", folder, "--input", "in.txt", "--output", "out.jsonl", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "line 1: the result is not finite" in proc.stderr
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]  # strict JSON parses
    assert [r["line"] for r in records] == [2] and records[0]["result"] == []


def test_predict_goes_on_after_bad_lines(tmp_path, artifact):
    lines = [
        b"the [MASK] is red .",
        b"{not json [MASK]",
        b'{"txt": "x"}',
        b'{"text": 5}',
        b"\xff\xfe bad",
        b'{"text": "a \\ud800 [MASK]"}',
        b'{"text": "fine [MASK]", "id": 3}',
        b'["text"]',
        b'{"text": "mine [MASK]", "line": 99, "result": "my own", "id": 9}',
    ]
    (tmp_path / "in.txt").write_bytes(b"\n".join(lines) + b"\n")
    proc = _cli(
        "predict",
        artifact,
        "--input",
        "in.txt",
        "--output",
        "out.jsonl",
        "--batch-size",
        "3",
        "--top-k",
        "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 7, 8, 9]  # a record's own "line" never hides the line number
    assert records[1]["text"] == "{not json [MASK]" and records[2]["text"] == '{"txt": "x"}'  # text starting with {
    assert records[3]["id"] == 3 and records[4]["text"] == '["text"]'
    assert (
        records[5]["id"] == 9
        and len(records[5]["result"]) == 1
        and list(records[5]) == ["line", "text", "id", "result"]
    )
    assert "line 9: the record's own 'line', 'result' not copied to the output" in proc.stderr
    for number, message in (
        (4, '"text" must be a string'),
        (5, "not valid UTF-8"),
        (6, "the JSON holds a lone surrogate"),
    ):
        assert f"line {number}: {message}" in proc.stderr
    assert "3 line(s) skipped" in proc.stderr
