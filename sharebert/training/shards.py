"""Prepared pre-training data: text tokenized once into memory-mapped token shards (``sharebert prepare``).

A data folder holds::

    manifest.json          written last (temp file + rename): without it the folder is not complete
    tokenizer/             the tokenizer the ids come from (``save_pretrained``)
    train/00000.bin ...    raw little-endian token ids, uint16 when the vocabulary fits, else uint32
    valid/00000.bin ...    (only with --valid)
    .progress.json         while preparing: finished shards and how far each source was read (resume)
    .lock                  an flock held by the preparing process (a second ``prepare`` is refused)
    .verified.json         shards already checked against the manifest (size, mtime, sha256): a second run is cheap

Each split is one token stream: the shards of its sources in order, blank lines skipped, exactly the
stream :func:`~sharebert.training.corpus.encode_sources` gives in memory. Shards are written whole
(temp + fsync + rename) and only then recorded in ``.progress.json``, so an interrupted or killed
``prepare`` continues from the last recorded shard when run again with the same arguments.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sharebert_runtime import token_ids
from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import OutLock, check_out_dir, read_json, write_json
from sharebert_runtime.textlines import resolve_sources

from ..formats.bars import bar as progress_bar
from .corpus import iter_lines, sniff_text

FORMAT = "sharebert-tokens"
VERSION = 1
MANIFEST = "manifest.json"
PROGRESS = ".progress.json"
STAMP = ".verified.json"  # shards whose sha256 and ids were checked: {file: {bytes, mtime_ns, sha256, vocab_size}}
SHARD_TOKENS = 1 << 24  # 16M tokens (32 MB as uint16) per shard at most: a kill -9 loses at most that much work
CHUNK_CHARS = 1 << 20  # text handed to a worker at once (~0.2 s of tokenizing)
SPLITS = ("train", "valid")


# -- tokenizers ---------------------------------------------------------------------------------
def vocab_sha256(tokenizer) -> str:
    """SHA-256 of the token -> id map: equal hashes mean the same ids for the same tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def resolve_tokenizer(spec: str | Path):
    """A fast tokenizer from a model folder (its tokenizer) or a preset name (the default WordPiece vocab)."""
    from transformers import AutoTokenizer

    from ..formats.paths import default_vocab
    from ..formats.tokenization import hf_tokenizer
    from ..model.shape import PRESETS

    path = Path(spec)
    if path.is_dir():
        if not (path / "tokenizer.json").is_file() and not (path / "vocab.txt").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer (tokenizer.json or vocab.txt)")
        try:
            tok = AutoTokenizer.from_pretrained(path)
        except Exception as e:  # a corrupt tokenizer.json surfaces as many exception types
            raise ValueError(f"cannot load the tokenizer in {path}: {first_line(e)}") from e
        if not tok.is_fast:
            raise ValueError(f"{path}: a fast tokenizer (tokenizer.json) is needed")
        return tok
    if str(spec) in PRESETS:
        return hf_tokenizer(default_vocab())
    raise FileNotFoundError(f"--tokenizer {spec} is neither a model folder nor a preset ({', '.join(PRESETS)})")


def save_tokenizer(tok, folder: Path) -> None:
    """``save_pretrained`` plus, for WordPiece, a ``vocab.txt`` (ids in order) that ``--preset`` builds from."""
    from tokenizers.models import WordPiece

    tok.save_pretrained(folder)
    if isinstance(tok.backend_tokenizer.model, WordPiece) and not (folder / "vocab.txt").exists():
        tokens = [
            t for t, _ in sorted(tok.backend_tokenizer.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
        ]
        (folder / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")


# -- sources ------------------------------------------------------------------------------------
def source_record(src: Path | str) -> dict:
    """``{"path", "bytes", "sha256"}`` of a source file (``hf:`` names: the name only)."""
    if isinstance(src, str):
        return {"path": src, "bytes": None, "sha256": None}
    h = hashlib.sha256()
    with open(src, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return {"path": str(Path(src).resolve()), "bytes": src.stat().st_size, "sha256": h.hexdigest()}


# -- the output folder ---------------------------------------------------------------------------
def _checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# -- tokenizing, here or in worker processes (sharebert_runtime.token_ids: a worker's import stays light) ----
def _chunks(lines, skip: int):
    """``(n_lines, lines)`` chunks of about CHUNK_CHARS characters, after skipping ``skip`` lines."""
    for _ in zip(range(skip), lines):
        pass
    batch, size = [], 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= CHUNK_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class Interrupted(Exception):
    """``prepare`` stopped on a signal after saving its progress; ``signum`` names the signal."""

    def __init__(self, signum: int, done: int, total: int):
        self.signum = signum
        super().__init__(f"stopped with {done} of {total} sources done; run the same command again to continue")


# -- prepare --------------------------------------------------------------------------------------
def prepare(  # 7: the public call, one keyword per `sharebert prepare` option, and the stop poll
    train,
    out,
    tokenizer="sharebert-tiny",
    valid=None,
    workers: int = 1,
    progress: bool = True,
    stop: Callable[[], int | None] = lambda: None,
) -> dict:
    """Tokenize ``train`` (and ``valid``) sources into ``out`` and return its manifest.

    ``stop()`` is polled between chunks; when it returns a signal number the finished part is saved and
    :class:`Interrupted` is raised. Running again with the same arguments continues; a complete folder
    for the same sources and tokenizer is returned as is.
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    out = Path(out)
    tok = resolve_tokenizer(tokenizer)
    sources = {"train": resolve_sources(train), "valid": resolve_sources(valid) if valid else []}
    inputs = [src for srcs in sources.values() for src in srcs if not isinstance(src, str)]
    check_out_dir(
        out,
        "prepared data folder",
        lambda p: any((p / n).exists() for n in (MANIFEST, PROGRESS, ".lock")),
        overwrite=True,
        inputs=inputs,
    )  # our own folder: continued or returned as it is
    for src in sources["train"] + sources["valid"]:
        if not isinstance(src, str):
            sniff_text(src)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with OutLock(out, "prepare"):
            return _prepare_locked(_Prepare(out, tok, sources, workers, progress, stop))
    except (ValueError, FileNotFoundError):
        if created and not (out / PROGRESS).exists():
            shutil.rmtree(out, ignore_errors=True)  # nothing of ours in it yet: leave no empty --out
        raise


@dataclass
class _Prepare:
    """One :func:`prepare` as its steps read it: the folder, the tokenizer, the sources by split, the worker count,
    progress bars or not, the stop poll; ``state`` (what ``.progress.json`` keeps) once read or made."""

    out: Path
    tok: object
    sources: dict
    workers: int
    progress: bool
    stop: Callable[[], int | None]
    state: dict | None = None


def _prepare_locked(job: _Prepare) -> dict:
    out, tok, sources = job.out, job.tok, job.sources
    records = {split: [source_record(s) for s in srcs] for split, srcs in sources.items()}
    ident = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": token_dtype(len(tok)).name,
        "tokenizer": {"vocab_size": len(tok), "vocab_sha256": vocab_sha256(tok)},
        "sources": records,
    }
    if (out / MANIFEST).exists():
        return _same_prepared(out, ident)
    state = job.state = _saved_state(out, ident)
    save_tokenizer(tok, out / "tokenizer")
    started = time.perf_counter()
    _tokenize_sources(job)
    for split in SPLITS:
        if sources[split] and sum(r["tokens"] for r in state["splits"][split]) == 0:
            raise ValueError(f"the {split} sources hold no text")
    manifest = {
        **ident,
        "splits": {
            split: {
                "tokens": sum(r["tokens"] for r in shards),
                "shards": [{k: r[k] for k in ("file", "tokens", "sha256")} for r in shards],
            }
            for split, shards in state["splits"].items()
            if shards
        },
        "seconds": round(time.perf_counter() - started, 2),
    }
    manifest["checksum"] = _checksum(manifest)
    write_json(out / MANIFEST, manifest)
    (out / PROGRESS).unlink()
    return manifest


def _same_prepared(out: Path, ident: dict) -> dict:
    """The manifest of the finished folder ``out`` when it was prepared from the same sources and tokenizer."""
    done = read_manifest(out)
    if {k: done.get(k) for k in ident} == ident:
        return done
    raise ValueError(f"{out} already holds prepared data of other sources or another tokenizer; choose another --out")


def _saved_state(out: Path, ident: dict) -> dict:
    """The progress of an interrupted prepare of the same sources and tokenizer, or a fresh one."""
    if not (out / PROGRESS).exists():
        return {**ident, "splits": {s: [] for s in SPLITS}, "finished": {s: [] for s in SPLITS}}
    try:
        saved = read_json(out / PROGRESS)
    except ValueError as e:
        raise ValueError(f"{e}; remove {out} and prepare again") from None
    if {k: saved.get(k) for k in ident} != ident:
        raise ValueError(
            f"{out} holds an unfinished prepare of other sources or another tokenizer; "
            f"rerun that command or choose another --out"
        )
    return saved


def _tokenize_sources(job: _Prepare) -> None:
    """Every source not yet finished in ``job.state``, tokenized into shards (by ``job.workers`` processes when more
    than one); ``Interrupted`` when ``job.stop()`` names a signal."""
    out, tok, sources, state, workers = job.out, job.tok, job.sources, job.state, job.workers
    dtype = np.dtype(state["dtype"])
    pool = None
    if workers > 1:  # spawn: fork may deadlock on locks held by threads (torch, tokenizers)
        pool = ProcessPoolExecutor(
            workers,
            multiprocessing.get_context("spawn"),
            token_ids.init_worker,
            (tok.backend_tokenizer.to_str(), dtype.name, os.getpid()),
        )
    if pool is None:
        token_ids.use_here(tok.backend_tokenizer, dtype)
    total = sum(len(v) for v in sources.values())
    bar = progress_bar(desc="prepare", unit="B", unit_scale=True, progress=job.progress)
    try:
        for split in SPLITS:
            (out / split).mkdir(exist_ok=True)
            for i, src in enumerate(sources[split]):
                if i in state["finished"][split]:
                    continue
                _prepare_source(job, split, i, src, pool, bar)
    except _Stopped as s:
        done = sum(len(v) for v in state["finished"].values())
        raise Interrupted(s.signum, done, total) from None
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class _Stopped(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _prepare_source(job: _Prepare, split: str, i: int, src, pool, bar) -> None:
    """Tokenize source ``i`` of ``split`` from where its last saved shard ended, saving shards as they fill
    (``pool``: the worker processes, None to tokenize here; ``bar``: the characters done)."""
    out, state, workers, stop = job.out, job.state, job.workers, job.stop
    mine = [r for r in state["splits"][split] if r["source"] == i]
    lines_end = mine[-1]["lines_end"] if mine else 0
    buffer: list[np.ndarray] = []
    pending: deque = deque()  # (lines, characters, result) in source order

    def take() -> None:
        nonlocal lines_end
        n, chars, res = pending.popleft()
        buffer.append(res.result() if pool is not None else res)
        lines_end += n
        bar.update(chars)
        if sum(b.size for b in buffer) >= SHARD_TOKENS:  # after whole chunks only: the same shards for any --workers
            flush()

    def flush() -> None:
        if buffer and sum(b.size for b in buffer):
            _save_shard(out, split, i, np.concatenate(buffer), lines_end, state)
        buffer.clear()

    for chunk in _chunks(iter_lines(src), lines_end):
        signum = stop()
        if signum:
            while pending:  # keep what the workers already finished
                take()
            flush()
            raise _Stopped(signum)
        chars = sum(map(len, chunk))
        res = pool.submit(token_ids.encode_chunk, chunk) if pool is not None else token_ids.encode_chunk(chunk)
        pending.append((len(chunk), chars, res))
        while len(pending) > (2 * workers if pool is not None else 0):
            take()
    while pending:
        take()
    flush()
    if not any(r["source"] == i for r in state["splits"][split]):
        raise ValueError(f"corpus file {src} holds no text")
    state["finished"][split].append(i)
    write_json(out / PROGRESS, state)


def _save_shard(out: Path, split: str, source: int, ids: np.ndarray, lines_end: int, state: dict) -> None:
    """Write one shard whole (temp, fsync, rename), then record it in the progress file."""
    name = f"{split}/{len(state['splits'][split]):05d}.bin"
    data = ids.tobytes()
    tmp = out / f"{name}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / name)
    state["splits"][split].append(
        {
            "file": name,
            "tokens": int(ids.size),
            "sha256": hashlib.sha256(data).hexdigest(),
            "source": source,
            "lines_end": lines_end,
        }
    )
    write_json(out / PROGRESS, state)


# -- reading --------------------------------------------------------------------------------------
def read_manifest(data_dir: str | Path) -> dict:
    """The manifest of a complete data folder, checked against its own checksum and its files: sizes, sha256
    (streamed, cached in :data:`STAMP`) and token ids below the tokenizer's vocabulary size."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not path.is_file():
        if (data_dir / PROGRESS).is_file():
            raise ValueError(
                f"{data_dir} is not complete (prepare was interrupted); run the same `sharebert prepare` again"
            )
        if data_dir.exists() and not data_dir.is_dir():
            raise ValueError(
                f"--data {data_dir} is a file, not a prepared data folder; make one with `sharebert prepare`"
            )
        if not data_dir.is_dir():
            raise FileNotFoundError(f"--data {data_dir} not found")
        raise ValueError(
            f"--data {data_dir} is not a prepared data folder (no {MANIFEST}); make one with `sharebert prepare`"
        )
    try:
        m = read_json(path)
        ok = m.get("format") == FORMAT and m.get("version") == VERSION and m.get("checksum") == _checksum(m)
        shards = [
            (split, shard["file"], int(shard["tokens"]), str(shard["sha256"]))
            for split, info in m["splits"].items()
            for shard in info["shards"]
        ]
        vocab_size, dtype = int(m["tokenizer"]["vocab_size"]), m["dtype"]
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a valid manifest ({first_line(e)})") from None
    if not ok:
        raise ValueError(
            f"{path} does not match its checksum (edited by hand?); run `sharebert prepare` into a new folder"
        )
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"{path}: dtype {dtype!r} is not uint16 or uint32")
    itemsize = np.dtype(dtype).itemsize
    for _split, file, tokens, _ in shards:
        f = (data_dir / file).resolve()
        if data_dir.resolve() not in f.parents:
            raise ValueError(f"{path}: shard {file} lies outside {data_dir}")
        size = f.stat().st_size if f.is_file() else None
        if size != tokens * itemsize:
            raise ValueError(
                f"{f} is missing, truncated or altered ({size} bytes, the manifest says "
                f"{tokens * itemsize}); prepare the data again"
            )
    _verify_shards(data_dir, [(file, sha) for _, file, _, sha in shards], np.dtype(dtype), vocab_size)
    return m


def _verify_shards(data_dir: Path, shards: list[tuple[str, str]], dtype: np.dtype, vocab_size: int) -> None:
    """Each shard's sha256 against the manifest and its ids against the vocabulary, streamed in 16 MB blocks;
    a shard whose size, mtime and hash match :data:`STAMP` (written after a full check) is not read again."""
    try:
        stamp = read_json(data_dir / STAMP)
    except (OSError, ValueError):
        stamp = {}
    checked = {}
    for file, sha in shards:
        f = data_dir / file
        st = f.stat()
        key = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha, "vocab_size": vocab_size}
        if isinstance(stamp, dict) and stamp.get(file) == key:
            checked[file] = key
            continue
        h, top = hashlib.sha256(), -1
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):  # a multiple of the item size
                h.update(block)
                top = max(top, int(np.frombuffer(block, dtype).max()))
        if h.hexdigest() != sha:
            raise ValueError(
                f"{f} does not match the sha256 its manifest records (altered or corrupt); prepare the data again"
            )
        if top >= vocab_size:
            raise ValueError(
                f"{f} holds token id {top}, beyond the tokenizer's {vocab_size} tokens; prepare the data again"
            )
        checked[file] = key
    if checked != stamp:
        try:
            write_json(data_dir / STAMP, checked)
        except OSError:  # a read-only data folder is checked on every run
            pass


class TokenStream:
    """The token stream of one split, memory-mapped: ``len`` tokens, ``read(start, stop)`` as int64."""

    def __init__(self, data_dir: str | Path, manifest: dict, split: str):
        info = manifest["splits"][split]
        self.files = [str(Path(data_dir) / s["file"]) for s in info["shards"]]
        self.ends = np.cumsum([s["tokens"] for s in info["shards"]])
        self.dtype = np.dtype(manifest["dtype"])
        self._maps: list | None = None

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getstate__(self):  # data loader workers map the files themselves
        return {**self.__dict__, "_maps": None}

    def _open(self) -> list:
        if self._maps is None:
            self._maps = [np.memmap(f, dtype=self.dtype, mode="r") for f in self.files]
        return self._maps

    def read(self, start: int, stop: int) -> np.ndarray:
        maps, parts = self._open(), []
        k = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop:
            first = int(self.ends[k - 1]) if k else 0
            end = min(stop, int(self.ends[k]))
            parts.append(maps[k][start - first : end - first])
            start, k = end, k + 1
        return np.concatenate(parts).astype(np.int64)


class StreamBlocks:
    """Sequences ``first .. first+count`` of a packed :class:`TokenStream` (the in-memory ``pack`` layout,
    ``[CLS] + body + [SEP]`` when wrapped), read on demand: ``blocks[i]`` is an int64 tensor."""

    def __init__(
        self,
        stream: TokenStream,
        seq_len: int,
        first: int = 0,
        count: int | None = None,
        cls_id: int | None = None,
        sep_id: int | None = None,
    ):
        self.stream, self.seq_len, self.first = stream, seq_len, first
        self.wrap = (cls_id, sep_id) if cls_id is not None and sep_id is not None else None
        self.body = seq_len - 2 if self.wrap else seq_len
        if self.body < 1:
            raise ValueError(f"seq_len {seq_len} is too short")
        total = len(stream) // self.body
        self.count = total - first if count is None else min(count, total - first)
        if self.count < 1:
            raise ValueError(f"the prepared data has {len(stream)} tokens, fewer than one sequence of {self.body}")

    @staticmethod
    def sequences(stream: TokenStream, seq_len: int, wrapped: bool) -> int:
        return len(stream) // (seq_len - 2 if wrapped else seq_len)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        import torch

        if not 0 <= i < self.count:
            raise IndexError(i)
        start = (self.first + i) * self.body
        ids = self.stream.read(start, start + self.body)
        if self.wrap:
            ids = np.concatenate([[self.wrap[0]], ids, [self.wrap[1]]])
        return torch.from_numpy(ids)
