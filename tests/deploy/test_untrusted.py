"""Files a model folder or artifact names are untrusted input; output files are written through one atomic writer;
pairs are recognised by content and the model's task; the service's per-client cap answers a readable 503; options
that cannot apply are refused; the Hub path as a user writes it. One table per root cause."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from sharebert.formats.model_folder import _check_tokenizer_files, check_convert, read_config
from sharebert.formats.paths import default_vocab
from sharebert.formats.recipe import DenseLayer, EmbeddingRecipe, read_recipe, write_recipe
from sharebert_runtime.artifact import ArtifactError, verify_artifact
from sharebert_runtime.outdir import atomic_output, write_json
from sharebert_runtime.serve import BadRequest, parse_request
from sharebert_runtime.untrusted import JSON_BYTES

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=8, runs=1, shapes=("1x8",), progress=False)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TANH = "torch.nn.modules.activation.Tanh"


def _bounded(call, seconds: float = 20):
    """``call()``'s exception (None when it returned), failing the test when it blocks (a FIFO opened for reading)."""
    box = []

    def run():
        try:
            call()
            box.append(None)
        except BaseException as e:  # noqa: BLE001  (whatever it raised is what the row asserts on)
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds} s (a FIFO waited on, or a device read whole)"
    return box[0]


# -- one reader for every file a folder names: each kind of non-file, at each name --------------------------------


def _fifo(p: Path):
    os.mkfifo(p)


def _huge(p: Path):
    with open(p, "wb") as f:  # sparse: 4 GiB on no disk
        f.truncate(4 << 30)


NOT_FILES = {  # what stands under a listed name -> the words of its refusal
    "fifo": (_fifo, "FIFO"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "character device"),
    "dev-urandom": (lambda p: p.symlink_to("/dev/urandom"), "character device"),
    "folder": (lambda p: p.mkdir(), "a folder"),
    "dangling-link": (lambda p: p.symlink_to(p.parent / "nowhere"), "link to a missing file"),
    "huge": (_huge, "more than"),
}
BAD_JSON = {
    "syntax": (b'{"a": 1,', "not valid JSON"),
    "nan": (b'{"a": NaN}', "NaN is not a JSON number"),
    "infinity": (b'{"a": -Infinity}', "Infinity is not a JSON number"),
    "duplicate-key": (b'{"a": 1, "a": 2}', "appears twice"),
    "not-utf8": (b'{"a": "\xff"}', "not valid JSON"),
    "deep": (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
}
RECIPE_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "2_Dense/config.json",
    "config.json",
)


@pytest.fixture(scope="module")
def recipe_folder(tmp_path_factory):
    """A sentence-transformers folder: config.json (hidden 32), mean pooling, a Dense 32 -> 16, Normalize,
    max_seq_length 20, lower case."""
    folder = tmp_path_factory.mktemp("recipe") / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    recipe = EmbeddingRecipe("mean", True, (DenseLayer("", 32, 16, True, TANH),), 20, True)
    write_recipe(folder, recipe, [(np.ones((16, 32), np.float32), np.zeros(16, np.float32))])
    assert read_recipe(folder).dense[0].out_features == 16
    return folder


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest, symlinks=True)
    return dest


@pytest.mark.parametrize("kind", list(NOT_FILES))
@pytest.mark.parametrize("name", [*RECIPE_FILES, "2_Dense/model.safetensors"])
def test_a_recipe_file_that_is_not_a_regular_file_is_refused_naming_it(recipe_folder, tmp_path, name, kind):
    folder = _copy(recipe_folder, tmp_path / "m")
    (folder / name).unlink()
    NOT_FILES[kind][0](folder / name)
    error = _bounded(lambda: read_recipe(folder))
    assert isinstance(error, ValueError), error  # never "absent": the default [CLS] recipe is never returned
    assert str(folder / name) in str(error) and NOT_FILES[kind][1] in str(error), str(error)


@pytest.mark.parametrize("kind", list(BAD_JSON))
@pytest.mark.parametrize("name", RECIPE_FILES)
def test_a_recipe_file_of_bad_json_is_refused_naming_it(recipe_folder, tmp_path, name, kind):
    folder = _copy(recipe_folder, tmp_path / "m")
    (folder / name).write_bytes(BAD_JSON[kind][0])
    error = _bounded(lambda: read_recipe(folder))
    assert isinstance(error, ValueError) and str(folder / name) in str(error) and BAD_JSON[kind][1] in str(error), error


WRONG_TYPES = [  # (file, field, value): each refused naming file and field
    ("1_Pooling/config.json", "word_embedding_dimension", "32"),
    ("1_Pooling/config.json", "pooling_mode_mean_tokens", "yes"),
    ("2_Dense/config.json", "in_features", "thirty-two"),
    ("2_Dense/config.json", "out_features", 16.0),
    ("2_Dense/config.json", "bias", 1),
    ("sentence_bert_config.json", "max_seq_length", "20"),
    ("sentence_bert_config.json", "do_lower_case", "true"),
]


@pytest.mark.parametrize("name, field, value", WRONG_TYPES)
def test_a_wrong_typed_recipe_field_is_refused_naming_file_and_field(recipe_folder, tmp_path, name, field, value):
    folder = _copy(recipe_folder, tmp_path / "m")
    path = folder / name
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(ValueError) as e:
        read_recipe(folder)
    assert str(path) in str(e.value) and field in str(e.value), str(e.value)


CONFIG_FIELDS = [
    ("hidden_size", "sixty-four"),
    ("num_hidden_layers", 2.5),
    ("vocab_size", True),
    ("hidden_dropout_prob", "0.1"),
    ("layer_norm_eps", [1e-12]),
    ("sharing", 3),
    ("is_decoder", "no"),
    ("embedding_size", "16"),
]


@pytest.mark.parametrize("model_type", ["sharebert", "bert"])
@pytest.mark.parametrize("field, value", CONFIG_FIELDS)
def test_a_wrong_typed_config_field_is_refused_naming_file_and_field(tmp_path, model_type, field, value):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 64, field: value}))
    with pytest.raises(ValueError) as e:
        read_config(tmp_path)
    message = str(e.value)
    assert str(tmp_path / "config.json") in message and field in message and "invalid literal" not in message, message


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tokenizer")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    BertTokenizerFast(str(default_vocab())).save_pretrained(folder)
    # transformers 5 saves a fast tokenizer as tokenizer.json + tokenizer_config.json only; a folder saved by
    # transformers 4 (most of the hub's) also holds vocab.txt and special_tokens_map.json, which the check guards too.
    shutil.copyfile(default_vocab(), folder / "vocab.txt")
    (folder / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "mask_token": "[MASK]",
            }
        )
    )
    _check_tokenizer_files(folder)
    return folder


@pytest.mark.parametrize("kind", list(NOT_FILES))
@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"]
)
def test_a_model_folder_file_that_is_not_a_regular_file_is_refused_naming_it(tokenizer_folder, tmp_path, name, kind):
    if kind == "huge" and name in ("tokenizer.json", "vocab.txt"):
        pytest.skip("their cap (TOKENIZER_BYTES) is above the sparse file's size only for JSON")
    folder = _copy(tokenizer_folder, tmp_path / "m")
    (folder / name).unlink()
    NOT_FILES[kind][0](folder / name)
    error = _bounded(lambda: (read_config(folder), _check_tokenizer_files(folder)))
    assert isinstance(error, (ValueError, FileNotFoundError)), error
    assert str(folder / name) in str(error) and NOT_FILES[kind][1] in str(error), str(error)


@pytest.mark.parametrize("kind", [*NOT_FILES, *BAD_JSON])
def test_a_manifest_that_is_not_a_regular_file_of_json_is_refused_naming_it(tmp_path, kind):
    path = tmp_path / "manifest.json"
    if kind in NOT_FILES:
        NOT_FILES[kind][0](path)
    else:
        path.write_bytes(BAD_JSON[kind][0])
    words = NOT_FILES[kind][1] if kind in NOT_FILES else BAD_JSON[kind][1]
    error = _bounded(lambda: verify_artifact(tmp_path))  # a link to a device also leads outside the artifact
    assert isinstance(error, ArtifactError) and str(path) in str(error), error
    assert words in str(error) or (kind.startswith("dev-") and "leads outside" in str(error)), error


def test_a_large_tokenizer_json_is_refused_by_its_size_before_it_is_read(tokenizer_folder, tmp_path):
    """A valid tokenizer.json padded to 400 MB was read whole (2.1 GB while the tokenizers library parsed it) and
    then called damaged: MemoryError. Refused by its size, unread (a sparse file: no disk, no time)."""
    from sharebert_runtime.untrusted import TOKENIZER_BYTES

    folder = _copy(tokenizer_folder, tmp_path / "m")
    with open(folder / "tokenizer.json", "r+b") as f:
        f.truncate(400 << 20)
    with pytest.raises(ValueError, match=r"tokenizer.json \(the tokenizer\) has 400.0 MB, more than the 64.0 MB"):
        _check_tokenizer_files(folder)
    assert 20 << 20 < TOKENIZER_BYTES < 400 << 20  # a 250k-token vocabulary (~20 MB) fits


def test_a_config_whose_vocab_size_is_not_the_weights_rows_is_refused_naming_both(tmp_path):
    """config.json's vocab_size 40000 beside 30,522-row weights: refused by read_config (torch-free, before any
    work), naming both numbers; it was "no quantization keeps the teacher ... ignore_mismatched_sizes"."""
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"bert.embeddings.word_embeddings.weight": np.zeros((30, 4), np.float32)}, folder / "model.safetensors")
    config = {"model_type": "bert", "vocab_size": 40, "hidden_size": 4, "num_hidden_layers": 1}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"vocab_size 40, but the word embeddings in .*model.safetensors .* 30 rows"):
        read_config(folder, model_types=None)
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 30}))
    assert read_config(folder, model_types=None)["vocab_size"] == 30
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)  # no readable header: the weights' own checks say so
    assert read_config(folder, model_types=None)["vocab_size"] == 30


def test_json_files_have_a_cap_and_it_is_named():
    import sharebert_runtime.untrusted as u

    assert 1 << 20 <= JSON_BYTES < u.RESULT_JSON_BYTES and JSON_BYTES < u.TOKENIZER_BYTES


# -- --convert-to-sharebert: refused where it cannot apply, never ignored ------------------------------------------


def _config_folder(path: Path, model_type: str, finished: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 64}))
    if finished:
        (path / "metrics.json").write_text(json.dumps({"task": "sst2", "steps": 4}))
    return path


CONVERT = [  # (--model kind, --out holds a finished run of kind, convert, resume) -> refusal words or None
    ("bert", None, True, False, None),
    ("sharebert", None, True, False, "is already a ShareBERT folder"),
    ("bert", "bert", True, True, "saved a BERT folder"),  # the case: a BERT run resumed with the option
    ("bert", "sharebert", False, True, "saved a ShareBERT folder"),
    ("bert", "sharebert", True, True, None),
    ("bert", "bert", False, True, None),
    ("sharebert", "sharebert", False, True, None),
    ("bert", None, True, True, None),  # nothing finished yet: the resumed run saves as asked
]


@pytest.mark.parametrize("model_kind, out_kind, convert, resume, refusal", CONVERT)
def test_convert_to_sharebert_is_refused_where_it_cannot_apply(
    tmp_path, model_kind, out_kind, convert, resume, refusal
):
    model = _config_folder(tmp_path / "model", model_kind)
    out = _config_folder(tmp_path / "out", out_kind, finished=True) if out_kind else tmp_path / "out"
    if refusal is None:
        check_convert(model, out, convert, resume)
        return
    with pytest.raises(ValueError, match=refusal):
        check_convert(model, out, convert, resume)


@pytest.mark.slow
def test_convert_to_sharebert_refusal_comes_from_the_command_before_torch(tmp_path):
    model = _config_folder(tmp_path / "model", "sharebert")
    code = (
        "import sys; sys.modules.update(torch=None, transformers=None); "  # a device install: refused without torch
        "from sharebert_runtime.main import main; rc = main(sys.argv[1:]); sys.exit(rc)"
    )
    for command in (["finetune", "--task", "sst2"], ["pretrain", "--train", str(model / "config.json")]):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                *command,
                "--model",
                str(model),
                "--out",
                str(tmp_path / "o"),
                "--convert-to-sharebert",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )
        assert proc.returncode == 2 and "is already a ShareBERT folder" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


DISTILL_IGNORED = [  # an option the objective does not read -> refused in one line, before torch
    (["--objective", "glue", "--task", "sst2", "--loss", "mse"], "--loss is for --objective embedding"),
    (["--objective", "embedding", "--data-dir", "."], "--data-dir is for --objective glue"),
    (["--objective", "mlm", "--train", "x.txt", "--cache-teacher", "c"], "--cache-teacher is for --objective glue"),
    (["--objective", "glue", "--task", "sst2", "--data", "d"], "--data is for --objective mlm and embedding"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, refusal", DISTILL_IGNORED)
def test_distill_refuses_an_option_its_objective_does_not_read(tmp_path, argv, refusal):
    code = (
        "import sys; sys.modules.update(torch=None, transformers=None); "  # a device install: refused without torch
        "from sharebert_runtime.main import main; rc = main(sys.argv[1:]); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "distill", "--teacher", "t", "--student", "sharebert-tiny", "--out", "o", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 2 and refusal in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert list(tmp_path.iterdir()) == []


# -- output files: one atomic writer ------------------------------------------------------------------------------


def test_output_through_a_symlink_is_written_through(tmp_path):
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old")
    target.chmod(0o640)
    link.symlink_to(target.name)
    with atomic_output(link) as f:
        f.write("new")
    assert link.is_symlink() and target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    write_json(link, {"a": float("nan")})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "target.txt"]


@pytest.mark.parametrize("through_link", [False, True])
def test_output_to_a_full_device_is_an_error(tmp_path, through_link):
    path = Path("/dev/full")
    if through_link:
        (tmp_path / "full.jsonl").symlink_to(path)
        path = tmp_path / "full.jsonl"
    with pytest.raises(OSError) as e, atomic_output(path) as f:
        f.write("x" * 100)
    assert e.value.errno == 28  # ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == (["full.jsonl"] if through_link else [])


def test_output_that_fails_midway_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(path) as f:
        f.write("half")
        raise RuntimeError("stopped")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


WRITER = """
import sys, time
from sharebert_runtime.outdir import atomic_output
with atomic_output(sys.argv[1]) as f:
    f.write("half")
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
"""


def _default_signals():
    """The child's stopping signals at their default action. A suite started from ``nohup ... &`` hands its
    children SIGINT and SIGHUP ignored, and a process told to ignore a signal rightly keeps ignoring it."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_every_stopping_signal_removes_the_partial_file(tmp_path, sig):
    path = tmp_path / "out.jsonl"
    path.write_text("old")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=_default_signals,
    )
    assert proc.stdout.readline() == "writing\n"
    assert any(p.name.endswith(".partial") for p in tmp_path.iterdir())
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode != 0 and path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def _writer(path: Path) -> subprocess.Popen:
    """A process inside ``atomic_output(path)``, its partial file written and held (it has said "writing")."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )
    assert proc.stdout.readline() == "writing\n", proc.stderr.read() if proc.poll() is not None else ""
    return proc


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_a_partial_file_left_by_kill_9_is_removed_by_the_next_write_not_a_live_one(tmp_path):
    """SIGKILL leaves the partial file (nothing can remove it then); the next writer of the same output removes it,
    but never the partial file of a writer still running (its flock), nor another output's."""
    path, other = tmp_path / "out.jsonl", tmp_path / "out.jsonl.x"
    path.write_text("old")
    killed = _writer(path)
    killed.kill()
    killed.communicate(timeout=30)
    (left,) = _partials(tmp_path)
    with atomic_output(other) as f:  # another output's write leaves it
        f.write("x")
    assert _partials(tmp_path) == [left]
    live = _writer(path)  # removes the stale one as it starts, then holds its own
    try:
        (own,) = _partials(tmp_path)
        assert own != left
        with atomic_output(path) as f:  # a write beside a live writer: its partial file stays
            f.write("new")
        assert _partials(tmp_path) == [own] and path.read_text() == "new"
    finally:
        live.kill()
        live.communicate(timeout=30)
    write_json(path, {"n": 1})  # now stale too: gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.x"]


# -- the artifacts the CLI rows run: a fill-mask model, a pair classifier, a single-text classifier ----------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """``{"mlm", "pairs" (MRPC), "single" (SST-2), "unsaid" (the MRPC artifact whose manifest does not say)}``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model

    root = tmp_path_factory.mktemp("artifacts")
    build_model("sharebert-tiny", root / "mlm_model", TINY, seed=0)
    export_model(root / "mlm_model", root / "mlm", **QUICK)
    out = {"mlm": root / "mlm"}
    for name, task, labels in (
        ("pairs", "mrpc", ["not_paraphrase", "paraphrase"]),
        ("single", "sst2", ["negative", "positive"]),
    ):
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
        )
        model = root / f"{name}_model"
        BertForSequenceClassification(config).save_pretrained(model)
        BertTokenizerFast(str(default_vocab())).save_pretrained(model)
        (model / "metrics.json").write_text(json.dumps({"task": task}))  # as finetune records it
        export_model(model, root / name, task="text-classification", **QUICK)
        out[name] = root / name
    unsaid = _copy(out["pairs"], root / "unsaid")
    manifest = json.loads((unsaid / "manifest.json").read_text())
    del manifest["pairs"]  # an artifact exported before the manifest said it
    (unsaid / "manifest.json").write_text(json.dumps(manifest))
    out["unsaid"] = unsaid
    return out


def _predict(*argv, stdin=None, cwd=None):
    """``sharebert predict ARGV`` started as the console script starts it (``sharebert_runtime.main:main``: torch
    never imported; ``-m sharebert`` would import the library and transformers first)."""
    return subprocess.run(
        [sys.executable, "-m", "sharebert_runtime", "predict", *map(str, argv)],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


@pytest.mark.slow
def test_manifest_records_whether_the_model_takes_pairs(artifacts):
    assert [
        json.loads((artifacts[k] / "manifest.json").read_text()).get("pairs") for k in ("pairs", "single", "mlm")
    ] == [True, False, None]


PAIRS_TSV = "a cat sat on the mat\ta cat was sitting\nthe dog ran\tno dog ran\n"
SINGLE = "a cat sat on the mat\nthe dog ran\n"
# (artifact, input text) -> (exit status, results with text_pair, words on stderr or None)
PAIR_ROWS = [
    ("pairs", PAIRS_TSV, 0, 2, None),
    ("pairs", SINGLE, 1, 0, "classifies sentence pairs"),
    ("pairs", "a\tb\tc\n", 1, 0, "3 TAB-separated columns"),
    ("pairs", json.dumps({"text": "a", "text_pair": "b"}) + "\n", 0, 1, None),
    ("single", PAIRS_TSV, 0, 0, "holds a TAB, read as part of one text"),
    ("single", SINGLE, 0, 0, None),
    ("single", json.dumps({"text": "a", "text_pair": "b"}) + "\n", 1, 0, "takes single texts"),
    ("unsaid", PAIRS_TSV, 0, 2, "does not record whether its model was trained on pairs"),
    ("mlm", PAIRS_TSV, 0, 0, "holds a TAB"),
]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["txt-link", "stdin", "tsv-name"])
@pytest.mark.parametrize("kind, text, status, paired, words", PAIR_ROWS)
def test_pairs_are_recognised_by_content_and_the_model_never_by_file_name(
    artifacts, tmp_path, how, kind, text, status, paired, words
):
    (tmp_path / "data.tsv").write_text(text)
    (tmp_path / "input.txt").symlink_to("data.tsv")
    source = {"txt-link": "input.txt", "stdin": "-", "tsv-name": "data.tsv"}[how]
    proc = _predict(artifacts[kind], "--input", source, stdin=text if how == "stdin" else None, cwd=tmp_path)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == status and sum("text_pair" in r for r in rows) == paired, proc.stderr
    assert (words is None and "line" not in proc.stderr.split("results")[0]) or (words and words in proc.stderr), (
        proc.stderr
    )


@pytest.mark.slow
def test_pair_text_arguments_follow_the_same_rule(artifacts):
    ok = _predict(artifacts["pairs"], "a cat\ta dog", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["text_pair"] == "a dog", ok.stderr
    bad = _predict(artifacts["pairs"], "just one text")
    assert bad.returncode == 2 and "TEXT argument 1" in bad.stderr and "sentence pairs" in bad.stderr


@pytest.mark.slow
def test_predict_output_is_written_through_a_symlink_and_a_full_disk_fails(artifacts, tmp_path):
    (tmp_path / "in.txt").write_text("the [MASK] sat\n")
    (tmp_path / "target.jsonl").write_text("old\n")
    (tmp_path / "link.jsonl").symlink_to("target.jsonl")
    (tmp_path / "full.jsonl").symlink_to("/dev/full")
    proc = _predict(artifacts["mlm"], "--input", "in.txt", "--output", "link.jsonl", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "link.jsonl").is_symlink(), proc.stderr
    assert json.loads((tmp_path / "target.jsonl").read_text())["line"] == 1
    for output in ("full.jsonl", "/dev/full"):
        proc = _predict(artifacts["mlm"], "--input", "in.txt", "--output", output, cwd=tmp_path)
        assert proc.returncode == 2 and "no space left" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.jsonl", "in.txt", "link.jsonl", "target.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_predict_stopped_by_a_signal_leaves_no_partial_file(artifacts, tmp_path, sig):
    (tmp_path / "in.txt").write_text("".join(f"the [MASK] sat on mat {i}\n" for i in range(200000)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sharebert_runtime",  # the console script's module: predict imports no torch
            "predict",
            str(artifacts["mlm"]),
            "--input",
            "in.txt",
            "--output",
            "out.jsonl",
        ],
        cwd=tmp_path,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 300  # a hang guard: starting takes long on a loaded machine
    while not any(p.name.endswith(".partial") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (128 + sig, -sig), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"], err


@pytest.mark.slow
def test_predict_after_a_kill_9_removes_the_partial_file_it_left(artifacts, tmp_path):
    (tmp_path / "in.txt").write_text("".join(f"the [MASK] sat on mat {i}\n" for i in range(200000)))
    (tmp_path / "short.txt").write_text("the [MASK] sat\n")
    argv = [sys.executable, "-m", "sharebert_runtime", "predict", str(artifacts["mlm"]), "--output", "out.jsonl"]
    proc = subprocess.Popen([*argv, "--input", "in.txt"], cwd=tmp_path, env=ENV, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300  # a hang guard: starting takes long on a loaded machine
    while not _partials(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and len(_partials(tmp_path)) == 1
    again = _predict(artifacts["mlm"], "--input", "short.txt", "--output", "out.jsonl", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl", "short.txt"]
    assert json.loads((tmp_path / "out.jsonl").read_text())["line"] == 1


class _Finalized:
    def __init__(self, sig):
        self.sig = sig

    def __del__(self):
        os.kill(os.getpid(), self.sig)  # handled here, inside the finalizer, before it returns


def _finalizer(sig):
    return _Finalized(sig)


_REFS = []  # weak references that outlive their referents, so the collector calls their callbacks


def _weakref_callback(sig):
    class Referent:
        pass

    referent = Referent()
    referent.cycle = referent  # freed by the collector, not at once
    _REFS.append(weakref.ref(referent, lambda _: os.kill(os.getpid(), sig)))


@pytest.mark.parametrize("sig, raised", [(signal.SIGTERM, "Stopped"), (signal.SIGINT, "KeyboardInterrupt")])
@pytest.mark.parametrize("where", [_finalizer, _weakref_callback])
def test_a_stop_signal_inside_a_finalizer_is_sent_again_not_lost(sig, raised, where):
    """Python prints and drops an exception raised in a ``__del__`` or a weakref callback: a stop signal that lands
    there comes again, and stops the block."""
    import gc

    from sharebert_runtime.outdir import Stopped, atomic_output

    # A fresh process's handlers, whatever an earlier test in this one (or a launcher ignoring SIGINT) left:
    # atomic_output takes over only SIGTERM's default and Python's own SIGINT handler, by design.
    fresh = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    before = {s: signal.signal(s, handler) for s, handler in fresh.items()}
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            with atomic_output(os.devnull) as f:
                where(sig)
                gc.collect()
                for _ in range(1000):  # the signal sent again (0.05 s later) stops the block
                    f.write("x")
                    time.sleep(0.01)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert type(stopped.value).__name__ == raised and (raised == "KeyboardInterrupt") != isinstance(
        stopped.value, Stopped
    )


# -- export never publishes the default recipe when a listed recipe file is unreadable ----------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("modules.json", "fifo"),
        ("sentence_bert_config.json", "dev-zero"),
        ("1_Pooling/config.json", "dev-urandom"),
        ("2_Dense/config.json", "folder"),
        ("2_Dense/model.safetensors", "huge"),
    ],
)
def test_export_refuses_an_unreadable_recipe_file(tmp_path, name, kind, capsys):
    from sharebert.formats.build import build_model
    from sharebert_runtime.main import main

    model = tmp_path / "model"
    build_model("sharebert-tiny", model, TINY, seed=0)
    write_recipe(
        model,
        EmbeddingRecipe("mean", True, (DenseLayer("", 64, 16, True, TANH),), 20, True),
        [(np.ones((16, 64), np.float32), np.zeros(16, np.float32))],
    )
    (model / name).unlink()
    NOT_FILES[kind][0](model / name)
    argv = ["export", "--model", str(model), "--out", str(tmp_path / "art"), "--task", "feature-extraction"]
    status = []
    assert _bounded(lambda: status.append(main([*argv, "--check-limit", "4"])), seconds=120) is None
    err = capsys.readouterr().err
    assert status == [2] and name in err and NOT_FILES[kind][1] in err, err
    assert not (tmp_path / "art").exists()


# -- the service: pairs as the model takes them; the per-client cap answers a readable 503 ------------------------

SERVE_PAIRS = [  # (manifest pairs, body) -> (status or texts, text_pair)
    (True, {"texts": ["a\tb", "c\td"]}, (["a", "c"], ["b", "d"])),
    (True, {"texts": ["a"], "text_pair": ["b"]}, (["a"], ["b"])),
    (True, {"texts": ["a", "c\td"]}, 400),
    (False, {"texts": ["a"], "text_pair": ["b"]}, 400),
    (False, {"texts": ["a\tb"]}, (["a\tb"], None)),
    (None, {"texts": ["a\tb"]}, (["a\tb"], None)),
    (None, {"text": "a", "text_pair": "b"}, (["a"], ["b"])),
]


@pytest.mark.parametrize("pairs, body, want", SERVE_PAIRS)
def test_serve_reads_pairs_as_the_model_takes_them(pairs, body, want):
    raw = json.dumps(body).encode()
    if isinstance(want, int):
        with pytest.raises(BadRequest) as e:
            parse_request(raw, "text-classification", 8, pairs=pairs)
        assert e.value.status == want
        return
    texts, kwargs = parse_request(raw, "text-classification", 8, pairs=pairs)
    assert (texts, kwargs.get("text_pair")) == want


def _exchange(port: int, body: bytes) -> bytes:
    """One keep-alive client: two POSTs on one connection (the second only if the first kept it); every answer
    read whole. A reset or broken pipe fails the test (the cap must answer in HTTP, never by dropping)."""
    replies = b""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        for _ in range(2):
            s.sendall(
                b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)
            )
            time.sleep(0.05)  # the body after the head, as http.client sends them: a refusal must not close in between
            s.sendall(body)
            reply = b""
            while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
            replies += reply
            if b"Connection: close" in reply:
                break
    return replies


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.mark.slow
def test_per_client_cap_answers_a_readable_503_never_a_dropped_connection(artifacts):
    from concurrent.futures import ThreadPoolExecutor

    from sharebert_runtime import Runtime
    from sharebert_runtime.serve import make_server

    server = make_server(
        Runtime(artifacts["mlm"], threads=1),
        "127.0.0.1",
        0,
        quiet=True,
        max_client_connections=4,
        workers=1,
        max_queue=64,
        timeout=10,
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    small = json.dumps({"texts": ["the [MASK] sat on the mat"] * 4}).encode()
    large = json.dumps({"texts": ["the [MASK] sat"], "padding": "x" * 40000}).encode()  # 400: an unknown field
    try:  # a body still being sent when a refusal closed the connection unread made the kernel reset it
        with ThreadPoolExecutor(48) as pool:
            replies = list(
                pool.map(lambda i: _exchange(server.server_address[1], (small, large)[i % 2]), range(4 * 48))
            )
    finally:
        server.shutdown()
        server.server_close()
    statuses = [r.split(b" ", 2)[1] for r in replies]
    refused = [r for r in replies if r.startswith(b"HTTP/1.1 503")]
    assert set(statuses) <= {b"200", b"400", b"503"} and refused and b"200" in statuses, set(statuses)
    assert all(b"Retry-After: 1" in r and b"connections from 127.0.0.1" in r for r in refused)


# -- the Hub path, exactly as a user writes it --------------------------------------------------------------------


@pytest.mark.slow
def test_register_for_auto_class_then_save_pretrained_loads_without_sharebert(tmp_path):
    import torch
    from transformers import AutoModelForMaskedLM

    from sharebert.formats.build import build_model

    build_model("sharebert-tiny", tmp_path / "src", TINY, seed=0)
    m = AutoModelForMaskedLM.from_pretrained(tmp_path / "src").eval()
    DIR = tmp_path / "hub"
    try:
        type(m.config).register_for_auto_class()
        type(m).register_for_auto_class("AutoModelForMaskedLM")
        m.save_pretrained(DIR)
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "configuration_sharebert.py").write_text("# the user's own file\n")
        with pytest.raises(ValueError, match="is not code sharebert generated"):
            m.save_pretrained(tmp_path / "mine")
    finally:
        type(m)._auto_class = type(m.config)._auto_class = None
    assert (tmp_path / "mine" / "configuration_sharebert.py").read_text() == "# the user's own file\n"
    ids = np.array([[101, 2023, 2003, 1037, 102]])
    from conftest import _load_without_sharebert

    name, logits = _load_without_sharebert(DIR, "AutoModelForMaskedLM", {"input_ids": ids}, trust_remote_code=True)
    with torch.no_grad():
        want = m(input_ids=torch.tensor(ids)).logits.numpy()
    assert name == "ShareBertForMaskedLM" and np.abs(logits - want).max() <= 1e-5
