"""`sharebert prepare`: the prepared stream is the in-memory stream, resumable, locked, tamper-evident; bad input."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sharebert.formats.paths import data_path, default_vocab
from sharebert.formats.tokenization import hf_tokenizer
from sharebert.training import shards
from sharebert.training.corpus import encode_sources, pack
from sharebert.training.shards import MANIFEST, PROGRESS, Interrupted, StreamBlocks, TokenStream, prepare, read_manifest
from sharebert_runtime.main import main
from sharebert_runtime.outdir import OutLock

REPO = Path(__file__).resolve().parents[2]
WIKI = data_path("wikitext-2-raw", "wiki.valid.raw")
ENWIKI = data_path("enwiki-sample")


@pytest.fixture(scope="module")
def tok():
    return hf_tokenizer(default_vocab())


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    root = tmp_path_factory.mktemp("texts")
    lines = WIKI.read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "a.txt").write_text("".join(lines[:400]), encoding="utf-8")
    (root / "b.txt").write_text("".join(lines[400:700]).replace("\n", "\r\n"), encoding="utf-8")
    (root / "v.txt").write_text("".join(lines[700:900]), encoding="utf-8")
    return root


def _stream(out, split="train"):
    m = read_manifest(out)
    s = TokenStream(out, m, split)
    return s.read(0, len(s))


def test_prepared_stream_is_the_in_memory_stream_across_shards(tmp_path, tok, texts, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 5000)  # several shards per source
    monkeypatch.setattr(shards, "CHUNK_CHARS", 4000)
    out = tmp_path / "data"
    train = [texts / "a.txt", texts / "b.txt"]
    m = prepare(train, out, "sharebert-tiny", valid=[texts / "v.txt"], workers=1, progress=False)
    ids = encode_sources(train, tok, progress=False)
    assert m["dtype"] == "uint16" and m["splits"]["train"]["tokens"] == ids.size > 20000
    assert len(m["splits"]["train"]["shards"]) >= 4
    assert all(s["tokens"] * 2 == (out / s["file"]).stat().st_size for s in m["splits"]["train"]["shards"])
    assert np.array_equal(_stream(out), ids)
    assert np.array_equal(_stream(out, "valid"), encode_sources([texts / "v.txt"], tok, progress=False))
    assert m["tokenizer"]["vocab_size"] == 30522 and not (out / PROGRESS).exists()
    # sequences read on demand are the packed in-memory sequences, across shard boundaries
    blocks = pack(ids, 32, tok.cls_token_id, tok.sep_token_id)
    lazy = StreamBlocks(TokenStream(out, m, "train"), 32, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)
    assert len(lazy) == blocks.shape[0] and all(torch.equal(lazy[i], blocks[i]) for i in range(len(lazy)))
    # two worker processes give the same shards
    again = prepare(train, tmp_path / "two", "sharebert-tiny", valid=[texts / "v.txt"], workers=2, progress=False)
    assert [s["sha256"] for s in again["splits"]["train"]["shards"]] == [
        s["sha256"] for s in m["splits"]["train"]["shards"]
    ]
    # the same command on a complete folder does nothing; other sources are refused
    assert prepare(train, out, "sharebert-tiny", valid=[texts / "v.txt"], progress=False) == m
    with pytest.raises(ValueError, match="other sources"):
        prepare([texts / "a.txt"], out, "sharebert-tiny", progress=False)


def test_interrupted_prepare_resumes_to_the_same_data(tmp_path, texts, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 4000)
    monkeypatch.setattr(shards, "CHUNK_CHARS", 4000)
    train = [texts / "a.txt", texts / "b.txt"]
    whole = prepare(train, tmp_path / "whole", "sharebert-tiny", progress=False)
    polls = []

    def stop():
        polls.append(1)
        return signal.SIGTERM if len(polls) == 6 else None

    out = tmp_path / "part"
    with pytest.raises(Interrupted, match="0 of 2 sources done"):
        prepare(train, out, "sharebert-tiny", progress=False, stop=stop)
    assert not (out / MANIFEST).exists()  # never looks complete
    done = json.loads((out / PROGRESS).read_text())["splits"]["train"]
    assert 1 <= len(done) < len(whole["splits"]["train"]["shards"])
    with pytest.raises(ValueError, match="not complete"):
        read_manifest(out)
    resumed = prepare(train, out, "sharebert-tiny", progress=False)
    assert [s["sha256"] for s in resumed["splits"]["train"]["shards"]] != []
    assert np.array_equal(_stream(out), _stream(tmp_path / "whole"))


def test_a_second_prepare_on_the_same_folder_is_refused(tmp_path, texts):
    out = tmp_path / "data"
    out.mkdir()
    with OutLock(out, "prepare"):
        with pytest.raises(ValueError, match=r"another `sharebert prepare` \(pid \d+\) is writing"):
            prepare([texts / "a.txt"], out, "sharebert-tiny", progress=False)
    prepare([texts / "a.txt"], out, "sharebert-tiny", progress=False)  # free again


def _tamper_truncate(out):
    f = out / "train" / "00000.bin"
    f.write_bytes(f.read_bytes()[:-2])


def _tamper_edit(out):
    m = json.loads((out / MANIFEST).read_text())
    m["splits"]["train"]["tokens"] += 1
    (out / MANIFEST).write_text(json.dumps(m))


def _tamper_garbage(out):
    (out / MANIFEST).write_text("{not json")


def _tamper_outside(out):
    m = json.loads((out / MANIFEST).read_text())
    m["splits"]["train"]["shards"][0]["file"] = "../../etc/passwd"
    m["checksum"] = shards._checksum(m)
    (out / MANIFEST).write_text(json.dumps(m))


def _tamper_swap(out):  # 400 bytes swapped, same size
    f = out / "train" / "00000.bin"
    data = f.read_bytes()
    f.write_bytes(data[400:800] + data[:400] + data[800:])


def _tamper_ids(out):  # ids beyond the vocabulary, the manifest re-hashed to match
    f = out / "train" / "00000.bin"
    ids = np.frombuffer(f.read_bytes(), np.uint16).copy()
    ids[7] = 65000
    f.write_bytes(ids.tobytes())
    m = json.loads((out / MANIFEST).read_text())
    m["splits"]["train"]["shards"][0]["sha256"] = hashlib.sha256(ids.tobytes()).hexdigest()
    m["checksum"] = shards._checksum(m)
    (out / MANIFEST).write_text(json.dumps(m))


def _tamper_nested(out):
    (out / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (_tamper_truncate, "00000.bin is missing, truncated or altered"),
        (_tamper_swap, "00000.bin does not match the sha256 its manifest records"),
        (_tamper_ids, "00000.bin holds token id 65000, beyond the tokenizer's 30522 tokens"),
        (_tamper_nested, "manifest.json is not valid JSON (nested too deeply)"),
        (_tamper_edit, "manifest.json does not match its checksum"),
        (_tamper_garbage, "manifest.json is not a valid manifest"),
        (_tamper_outside, "lies outside"),
    ],
)
def test_tampered_data_folders_are_refused(tmp_path, texts, tamper, message):
    out = tmp_path / "data"
    prepare([texts / "a.txt"], out, "sharebert-tiny", progress=False)
    read_manifest(out)  # checked once: the verification stamp records the shard as it was
    stamp = json.loads((out / shards.STAMP).read_text())["train/00000.bin"]
    assert stamp["sha256"] == read_manifest(out)["splits"]["train"]["shards"][0]["sha256"]
    time.sleep(0.01)  # a rewrite has a new mtime, so the stamp no longer vouches for the shard
    tamper(out)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_manifest(out)


def _binary(tmp):
    p = tmp / "model.bin"
    p.write_bytes(bytes(range(256)) * 64)
    return [str(p)]


def _empty(tmp):
    p = tmp / "empty.txt"
    p.write_text("\n  \n\n")
    return [str(p)]


@pytest.mark.parametrize(
    "make_train, out_kind, extra, message",
    [
        (_binary, "new", [], "model.bin is binary, not UTF-8 text"),
        (
            _empty,
            "new",
            ["--workers", "1"],
            "empty.txt holds no text",
        ),  # found after reading: no pool of processes to spawn
        (None, "file", [], "is a file, not a folder"),
        (None, "under_file", [], "is a file, not a folder"),
        (None, "foreign", [], "is a non-empty folder that is not a prepared data folder"),
        (None, "new", ["--workers", "0"], "--workers must be at least 1"),
        (None, "new", ["--tokenizer", "no-such-thing"], "neither a model folder nor a preset"),
        (lambda tmp: [str(tmp / "missing.txt")], "new", [], "not found"),
        (lambda tmp: ["/dev/zero"], "new", [], "/dev/zero: a character device, not a regular file"),
        (
            lambda tmp: os.mkfifo(tmp / "fifo") or [str(tmp / "fifo")],
            "new",
            [],
            "fifo: a FIFO (named pipe), not a regular file",
        ),
    ],
)
def test_bad_prepare_command_lines(tmp_path, capsys, make_train, out_kind, extra, message):
    train = make_train(tmp_path) if make_train else [str(WIKI)]
    out = {
        "new": tmp_path / "new",
        "file": tmp_path / "f.txt",
        "under_file": tmp_path / "f.txt" / "sub",
        "foreign": tmp_path / "foreign",
    }[out_kind]
    (tmp_path / "f.txt").write_text("mine\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    rc = main(["prepare", "--train", *train, "--out", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "new").exists()  # failed validation leaves no --out
    assert (tmp_path / "f.txt").read_text() == "mine\n" and (tmp_path / "foreign" / "notes.txt").read_text() == "mine\n"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux ``/proc/PID/stat``); 0 once it has gone."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sigterm_during_prepare_saves_progress_and_the_rerun_completes(tmp_path):
    corpus = tmp_path / "big.txt"
    corpus.write_text(WIKI.read_text(encoding="utf-8") * 10, encoding="utf-8")  # ~12 MB: several seconds of work
    out = tmp_path / "data"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "sharebert",
        "prepare",
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a hang guard: starting takes long on a loaded machine
    while not (out / "tokenizer" / "tokenizer.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "prepare did not start"
        time.sleep(0.05)
    # Stopped mid-source: after 1 s of the process's own CPU time past its tokenizer (of ~3 s of tokenizing), a
    # clock a loaded machine does not stretch, where a wall-clock wait could land before the first chunk.
    started = _cpu_seconds(proc.pid)
    while _cpu_seconds(proc.pid) < started + 1.0 and proc.poll() is None:
        assert time.monotonic() < deadline, "prepare did not tokenize"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "SIGTERM: stopped with 0 of 1 sources done; run the same command again" in err
    assert not (out / MANIFEST).exists()
    saved = json.loads((out / PROGRESS).read_text())["splits"]["train"]
    lines = corpus.read_text(encoding="utf-8").count("\n")
    assert len(saved) == 1 and 0 < saved[0]["lines_end"] < lines  # stopped mid-source; what was tokenized is kept
    assert main(cmd[3:]) == 0  # the rerun in this process: the stop above is the subprocess's to take
    m = read_manifest(out)
    assert len(m["splits"]["train"]["shards"]) == 2
    tok = hf_tokenizer(default_vocab())
    one = encode_sources([WIKI], tok, progress=False)
    assert np.array_equal(_stream(out), np.tile(one, 10))  # the whole corpus, once, in order
