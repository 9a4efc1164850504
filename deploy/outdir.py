"""Output folders and files (stdlib only): the one ``--out`` rule, checked before any work, and atomic JSON.

``check_out_file`` is the same for an output file option (``--json``, ``--plot``).
``check_out_dir`` refuses, with one line naming the path, an ``--out`` that is a file, lies under a
file, cannot be written, holds one of the command's inputs (or is one), or is a non-empty folder
that is not the command's own kind of output. ``--overwrite`` lets a command replace only its own
kind of folder (``owned(path)`` says which), never anything else. A command's own folder is told by the marker
file :data:`MARK` it writes there first thing after its checks (``mark_out``; ``made_by(command)`` is its
``owned``), never by the names of what the folder holds: a user's folder with a ``student/`` or a
``metrics.json`` is not ours. A folder that looks like the command's output without its marker (``legacy``
recognises one: written by hand, by another tool, or copied; no older format is served, since sharebert 0.1.0, the
first release, writes the marker) is refused in one line (move it away, or choose another ``--out``), neither
replaced nor resumed. The marker also holds the
run's fingerprint (teacher files, student shape, data, objective): ``check_same_run`` refuses a ``--resume`` of
another run. Nothing is created here: a
command that fails its validation leaves no empty ``--out`` behind. ``write_json`` / ``read_json``
write and read our JSON files (strict JSON; any malformed file, deep nesting included, is one ``ValueError``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from . import untrusted
from .options import symlink_loop


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path(".")


def _resolved(path: Path) -> Path:
    """``path`` with its nearest existing ancestor's links resolved (the rest does not exist yet)."""
    existing = _nearest_existing(path)
    return existing.resolve() / path.relative_to(existing) if existing != Path(".") else path.resolve()


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_out_dir(  # 7: the one --out rule of every command; the keywords are where the commands differ
    out: str | Path,
    kind: str,
    owned: Callable[[Path], bool],
    overwrite: bool = False,
    inputs: Iterable[str | Path] = (),
    legacy: Callable[[Path], bool] | None = None,
    stopped: Callable[[Path], str | None] | None = None,
) -> Path:
    """Validate ``out`` for a command writing ``kind`` (e.g. "model folder"); return it as an absolute path.

    Returns normally when ``out`` does not exist yet, is an empty folder, or is a folder ``owned``
    recognises and ``overwrite`` is set. Raises ``ValueError`` otherwise; messages name the paths as given.
    ``stopped(out)``: for a command that resumes, what a run stopped before its end left to resume (e.g. "a
    checkpoint at step 40"; None when nothing): the refusal then names ``--resume`` first.
    """
    given = out
    out = Path(out).expanduser().absolute()
    for source in inputs:
        try:
            resolved = Path(source).expanduser().resolve()
        except (RuntimeError, OSError):  # Python raises RuntimeError for a symlink loop
            raise ValueError(symlink_loop(source) or f"{source} cannot be opened: it is a symbolic link loop") from None
        if _inside(resolved, out.resolve()):
            raise ValueError(
                f"--out {given} is, or holds, the input {source}: writing there would destroy it; choose another folder"
            )
        if resolved.is_dir() and _inside(_resolved(out), resolved):
            raise ValueError(
                f"--out {given} lies inside the input {source}: writing there would change it; "
                "choose a folder outside it"
            )
    existing = _nearest_existing(out)
    if existing != out:  # out does not exist: its nearest existing ancestor must be a writable folder
        if not existing.is_dir():
            raise ValueError(f"--out {given}: {existing} {_no_folder(existing)}")
        _check_writable(existing, given)
        return out
    if not out.is_dir():
        raise ValueError(f"--out {given} {_no_folder(out)}")
    if any(p.name != OutLock.NAME for p in out.iterdir()):  # a folder holding only a run's lock file is empty
        mine = owned(out)  # once: for a copied run it hashes a checkpoint
        if not mine and legacy is not None and legacy(out):
            if os.path.lexists(out / MARK):  # a marker there that does not match the folder: edited, copied, by hand
                why = _mismatch(out)
                marker = f"whose {MARK} does not match what it holds ({why})"
            else:
                marker = (
                    f"without the {MARK} that sharebert writes in its own output folders (one written by hand, "
                    "by another tool, or copied)"
                )
            raise ValueError(
                f"--out {given} holds a {kind} {marker}: it is neither replaced nor resumed; move it away (or delete "
                "it) and run again, or choose another --out"
            )
        if not mine:
            raise ValueError(
                f"--out {given} is a non-empty folder that is not a {kind}; refusing to write into it "
                "(choose a new or empty folder)"
            )
        if not overwrite:
            left = stopped(out) if stopped is not None else None
            if left:
                raise ValueError(
                    f"{given} holds a {kind} that stopped before its end ({left}): pass --resume to continue "
                    "it, or --overwrite to start again"
                )
            raise ValueError(f"{given} already holds a {kind}; pass --overwrite to replace it")
    _check_writable(out, given)
    return out


def _no_folder(path: Path) -> str:
    """What ``path``, there but no folder, is: a file, or a link that leads nowhere (once called a file)."""
    if not path.is_symlink():
        return "is a file, not a folder"
    if symlink_loop(path):
        return "is a symbolic link loop, not a folder"
    return f"is a symbolic link to {os.readlink(path)}, which {'is no folder' if path.exists() else 'does not exist'}"


MARK = "sharebert_run.json"  # {"command", "fingerprint"}: the folder is that command's output (module docstring)


def _mismatch(out: Path) -> str:
    """Why the marker of ``out`` (present, checked by the caller) does not make it this command's folder."""
    mark = read_mark(out)
    if mark is None:
        return f"its {MARK} cannot be read: empty, truncated, or not sharebert's JSON"
    return vouched(out, mark) or f"its {MARK} says `sharebert {mark['command']}` wrote it"


def read_mark(out: str | Path) -> dict | None:
    """The marker :data:`MARK` of ``out`` (a dict naming its command), or None where there is none readable. A link
    is none: a copy made of links (``cp -rs``) is no run of its own, and a run there would write through them."""
    path = Path(out) / MARK
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:  # ours are a few kB
            return None
        mark = read_json(path)
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and isinstance(mark.get("command"), str) else None


def made_by(command: str) -> Callable[[Path], bool]:
    """``owned`` for :func:`check_out_dir`: the folder holds ``command``'s marker, and the marker matches what is
    there (:func:`vouched`): a marker anyone could write by hand (``{"command": "compress"}``) takes nothing."""

    def owned(path: Path) -> bool:
        mark = read_mark(path) or {}
        return mark.get("command") == command and vouched(path, mark) is None

    return owned


def _identity(out: str | Path) -> str:
    st = os.stat(out)
    return f"{st.st_dev}:{st.st_ino}"


def mark_out(out: str | Path, command: str, fingerprint: dict | None = None) -> None:
    """Mark ``out`` as ``command``'s output (atomic), with the run's ``fingerprint`` for ``check_same_run`` and the
    folder's identity (device and inode: a marker written in or copied from another folder is not vouched for).
    ``out`` is made first where it is not yet there (a distillation marks its folder before its first other write)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json(Path(out) / MARK, {"command": command, "fingerprint": fingerprint or {}, "folder": _identity(out)})


# A training run's own checkpoint folders at the top of its --out (pretrain's checkpoint-N and those set aside;
# the others' checkpoints/): rotated and mostly removed at the run's end, each vouched for by its own completion marker
CHECKPOINT_DIRS = re.compile(r"checkpoints|((incomplete|corrupt)-)?checkpoint-[0-9]+")


def _run_files(out: Path) -> dict[str, Path]:
    """Every regular file under ``out`` by its relative path, but the marker, the lock and a training run's own
    checkpoints (:data:`CHECKPOINT_DIRS`: hashing them would read gigabytes for nothing). Links are not followed.
    Compress's set-aside earlier result (``.replaced``) is counted: a run removes it before it seals its marker, so
    one in a sealed folder is the user's, which ``--overwrite`` took for its own aside and deleted."""
    found = {}
    for root, dirs, files in os.walk(out):
        if Path(root) == out:
            dirs[:] = [d for d in dirs if not CHECKPOINT_DIRS.fullmatch(d)]
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(out).as_posix()
            if rel not in (MARK, OutLock.NAME) and path.is_file() and not path.is_symlink():
                found[rel] = path
    return found


def seal_out(out: str | Path) -> None:
    """At the end of a finished run: the marker lists every file the run left in ``out`` with its fingerprint
    (:func:`file_fingerprint`), what :func:`vouched` compares and ``--overwrite`` may replace (:func:`unlisted`)."""
    out = Path(out)
    mark = read_mark(out)
    if mark is None:
        return
    files = {rel: file_fingerprint(path) for rel, path in sorted(_run_files(out).items())}
    write_json(out / MARK, {**mark, "files": files})


def vouched(out: str | Path, mark: dict) -> str | None:
    """None when ``mark`` (the marker of ``out``) matches what is there, else why not: a finished run's listed files
    unchanged (a missing one is no one's loss), an unfinished run's marker written in this very folder."""
    out = Path(out)
    files = mark.get("files")
    if isinstance(files, dict):
        for rel, digest in files.items():
            path = out / rel
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                return f"its {MARK} lists a file outside it ({rel})"
            if os.path.lexists(path) and (not path.is_file() or file_fingerprint(path) != digest):
                return f"{rel} is not the file the run wrote"
        return None
    if mark.get("folder") != _identity(out) and _intact_checkpoint(out) is None:
        return (
            f"its {MARK} was written in another folder and no complete checkpoint here vouches for it: a copy of a "
            "run stopped before its first checkpoint holds nothing to resume"
        )
    return None


CHECKPOINT_MARK = "sharebert_complete.json"  # a complete checkpoint's marker: {"step", "files": {name: {size, sha256}}}


def _intact_checkpoint(out: Path) -> Path | None:
    """A checkpoint of a stopped run in ``out`` (a ``checkpoint-N`` folder at most four levels down, links not
    followed) whose every file its completion marker lists is there with that size and sha256; None without one.
    What vouches for an unfinished run's marker in a folder it was not written in: a copy (``cp -r``) of the run's
    folder, the user's own data, resumes as the folder it copies would; a marker alone copied beside other files,
    or written by hand, does not make them a run's."""
    found = []
    for root, dirs, _ in os.walk(out):
        depth = len(Path(root).relative_to(out).parts)
        dirs[:] = [] if depth >= 4 else [d for d in dirs if not Path(root, d).is_symlink()]
        found += [Path(root, d) for d in dirs if re.fullmatch(r"checkpoint-[0-9]+", d)]
    for folder in sorted(found, key=lambda p: -int(p.name.removeprefix("checkpoint-"))):  # newest first
        if _checkpoint_intact(folder):
            return folder
    return None


def _checkpoint_intact(folder: Path) -> bool:
    try:
        files = read_json(folder / CHECKPOINT_MARK)["files"]
        for name, record in files.items():
            path = folder / name
            if Path(name).name != name or not path.is_file() or path.stat().st_size != record["size"]:
                return False
            if file_sha256(path) != record["sha256"]:
                return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(files)


def file_sha256(path: str | Path) -> str:
    """The sha256 (hex) of a file's bytes, read streaming (a checkpoint's completion marker records these)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def unlisted(out: str | Path) -> list[str]:
    """The files under ``out`` a finished run's marker does not list (the user's own, added since): ``--overwrite``
    keeps them, so the command refuses, naming them. An unfinished run's marker lists none: [] (nothing to tell)."""
    mark = read_mark(out) or {}
    files = mark.get("files")
    if not isinstance(files, dict):
        return []
    return sorted(set(_run_files(Path(out))) - set(files))


def check_unlisted(out: str | Path, given, kind: str) -> None:
    """``--overwrite`` of a finished result refused, naming them, while ``out`` holds files its run did not write."""
    extra = unlisted(out)
    if extra:
        raise ValueError(
            f"--out {given} holds files the earlier {kind} did not write ({', '.join(extra[:3])}"
            f"{' ...' if len(extra) > 3 else ''}): --overwrite would lose them; move them out of it and run again"
        )


FINGERPRINT = {
    "teacher": "teacher (its weights, config or tokenizer files)",
    "student": "student shape",
    "model": "model (its weights, config or tokenizer files)",
    "data": "training data",
    "objective": "objective",
}  # what a run's fingerprint holds, as said


def _differs(key: str, old, new) -> str:
    what = FINGERPRINT.get(key, key)
    # "name:digest" entries: name the files that differ (a marker edited by hand to hold other types: what only)
    if all(isinstance(e, list) and all(isinstance(x, str) for x in e) for e in (old, new)):
        names = sorted({e.split(":", 1)[0] for e in set(old) ^ set(new)})
        return f"{what}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
    if isinstance(old, (str, int, float)) and isinstance(new, (str, int, float)) and len(f"{old}{new}") < 120:
        return f"{what}: {old} -> {new}"
    return what


def check_same_run(out: str | Path, fingerprint: dict, restart: str = "start again with --overwrite") -> None:
    """Refuse, in one line naming what differs, a ``--resume`` into ``out`` of another run than the one its marker
    records (another teacher, student shape, data or objective); ``restart``: how the command starts afresh instead.
    A folder without a marker has nothing to compare."""
    mark = read_mark(out)
    if mark is None:
        return
    saved = mark.get("fingerprint") if isinstance(mark.get("fingerprint"), dict) else {}
    differ = [_differs(k, saved.get(k), v) for k, v in fingerprint.items() if saved.get(k) != v]
    if differ:
        raise ValueError(
            f"--resume: {out} holds a run of another {'; '.join(differ)}; resume with that run's options, or {restart}"
        )


HUGE = 256 << 20  # bytes above which a file's fingerprint reads only its ends (see file_fingerprint)


def file_fingerprint(path: str | Path) -> str:
    """A sha256 (16 hex digits) of a file's bytes, read streaming; a file over :data:`HUGE` bytes is fingerprinted
    by its size and the sha256 of its first and last 4 MiB (cheap on a corpus of gigabytes; an edit in the
    middle that keeps the size is not seen, which a resume check accepts)."""
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > HUGE:
            h.update(f"{size}|".encode() + f.read(4 << 20))
            f.seek(size - (4 << 20))
            h.update(f.read())
        else:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:16]


def check_out_file(path: str | Path, option: str, suffixes: Iterable[str] = ()) -> Path:
    """The one rule for an output file option (``--json``, ``--plot``), checked before any work: not a folder,
    not under a file, one of ``suffixes`` when given, its nearest existing folder writable. Missing parent
    folders are created when the file is written."""
    path = Path(path)
    suffixes = tuple(suffixes)
    if path.is_dir():
        raise ValueError(
            f"{option} {path}: is a folder; give a file name{f' ending in {suffixes[0]}' if suffixes else ''}"
        )
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{option} {path}: the file name must end in {' or '.join(suffixes)}")
    folder = _nearest_existing(path.parent)
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path}: cannot write in {folder}")
    return path


class OutLock:
    """One run at a time per output folder: an exclusive, non-blocking ``flock`` on ``out/.lock`` holding the
    PID, for as long as the ``with`` block runs. The kernel releases it when the process dies (kill -9
    included), so a killed run never leaves it stuck; a second run into the same folder is refused in one line."""

    NAME = ".lock"

    def __init__(self, out: str | Path, command: str):
        self.path, self.command = Path(out) / self.NAME, command

    def __enter__(self):
        self.f = self._open()
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.seek(0)
            pid = self.f.read().strip()
            self.f.close()
            raise ValueError(
                f"another `sharebert {self.command}` (pid {pid or '?'}) is writing {self.path.parent}; "
                "wait for it to finish or choose another --out"
            ) from None
        self.f.seek(0)
        held = self.f.read(64)
        if held and not re.fullmatch(r"\d+\n?", held):  # what a run writes here is its PID: anything else is a user's
            self.__exit__()
            raise ValueError(f"{self.path} is a file of yours, not a run's lock (a process id): move it away")
        self.f.seek(0)
        self.f.truncate()
        self.f.write(f"{os.getpid()}\n")
        self.f.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()

    def _open(self):
        """The lock file, opened without following a link: one there (or a FIFO, a device) is refused, where it was
        opened through and truncated to the PID, emptying whatever file the link led to."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise ValueError(f"{self.path} is a symbolic link, not the run's lock file: remove it") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ValueError(f"{self.path} is {untrusted.file_kind(mode)}, not the run's lock file: remove it")
        return open(fd, "a+")


def _torchrun(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def world_size() -> int:
    """Processes in the run under torchrun (``WORLD_SIZE``; 1 without, or where it is not a number >= 1)."""
    return max(_torchrun("WORLD_SIZE", 1), 1)


def rank() -> int:
    """This process's rank under torchrun (``RANK``; 0 without torchrun): only rank 0 writes a run's shared files
    and prints its tables. With :func:`local_rank` and :func:`world_size`, the one place the library reads
    torchrun's environment. In a world of one process it is 0 whatever ``RANK`` says: the Trainer then runs alone
    and saves, so a stray ``RANK`` must not skip the marker, the lock and the table."""
    return _torchrun("RANK", 0) if world_size() > 1 else 0


def local_rank() -> int:
    """This process's rank on its machine under torchrun (``LOCAL_RANK``; 0 without): its GPU's index."""
    return _torchrun("LOCAL_RANK", 0) if world_size() > 1 else 0


def check_torchrun() -> None:
    """Refuse, in one line naming it, a ``LOCAL_RANK`` that is not a number: the Trainer reads it with ``int()``
    (where :func:`local_rank` reads garbage as no torchrun), and failed after the data and model had loaded."""
    value = os.environ.get("LOCAL_RANK")
    try:
        int(value or 0)
    except ValueError:
        raise ValueError(
            f"LOCAL_RANK={value!r} in the environment is no rank (torchrun sets a number): unset it, or launch "
            "with torchrun"
        ) from None


@contextlib.contextmanager
def run_lock(out: str | Path, command: str):
    """An :class:`OutLock` on ``out`` around a command whose library call checks ``out`` itself (``distill``,
    ``compress``). A missing ``out`` is created for the lock; when the run fails, the lock file and any folder
    created here are removed again if nothing else was written, so a refused run leaves nothing behind. Only
    torchrun's rank 0 locks; a path that is not a folder is left to the command's own check."""
    out = Path(out)
    if rank() != 0 or (os.path.lexists(out) and not out.is_dir()) or not _nearest_existing(out.absolute()).is_dir():
        yield
        return
    first_new = next((p for p in reversed((out.absolute(), *out.absolute().parents)) if not os.path.lexists(p)), None)
    lock_file = out / OutLock.NAME
    had_lock = os.path.lexists(lock_file)  # a link there is the user's, left as it is
    out.mkdir(parents=True, exist_ok=True)
    try:
        with OutLock(out, command):
            yield
    except BaseException:
        if not had_lock:
            lock_file.unlink(missing_ok=True)
        if first_new is not None and not any(f.is_file() for f in first_new.rglob("*")):
            shutil.rmtree(first_new, ignore_errors=True)
        raise


def _check_writable(folder: Path, given) -> None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"--out {given}: cannot write in {folder} ({e.strerror or e})") from None


FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a full disk, a file size limit, a quota
# torch.save's stream writer reports a failed write without its errno
TORCH_WRITE_FAILED = ("PytorchStreamWriter failed writing", "inline_container.cc")


def disk_full(error: BaseException, folder: str | Path | None = None) -> bool:
    """Whether ``error`` (or what caused it) is a full disk, a quota or a file size limit. Libraries that hide
    the cause (ONNX Runtime: "Protobuf serialization failed") are recognized by writing 1 MiB in ``folder``."""
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in FULL:
            return True
        if any(os.strerror(code) in str(cause) for code in FULL):
            return True
        if isinstance(cause, RuntimeError) and any(text in str(cause) for text in TORCH_WRITE_FAILED):
            return True
        cause = cause.__cause__ or cause.__context__
    if folder is None or not isinstance(error, Exception):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"\0" * (1 << 20))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        return e.errno in FULL
    return False


def finite(obj):
    """``obj`` with NaN/inf floats replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def read_json(path: str | Path):
    """The JSON value in the file ``path`` (the one reader of the JSON files we write and of transformers' trainer
    state, whose NaN it keeps): read through :mod:`sharebert_runtime.untrusted` (a regular file of bounded size)."""
    return untrusted.read_json(path, limit=untrusted.RESULT_JSON_BYTES, allow_nan=True)


def write_json(path: str | Path, obj) -> None:
    """Write ``obj`` as JSON atomically and durably (:func:`atomic_output`); NaN becomes null."""
    with atomic_output(path) as f:
        f.write(json.dumps(finite(obj), indent=2, allow_nan=False) + "\n")


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP while an output file is written: raised in the main thread so the partial file is removed
    (the default action kills the process at once); ``signum`` is the signal (exit status ``128 + signum``)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # SIGINT already raises KeyboardInterrupt


@contextlib.contextmanager
def _stop_signals_raise():
    """While the block runs, SIGTERM and SIGHUP raise :class:`Stopped` (where they would kill the process: a
    handler already installed, say a training run's checkpoint on SIGTERM, is left in place; main thread only),
    and SIGINT its KeyboardInterrupt. Python prints and drops an exception raised where C code called Python (a
    ``__del__``, a weakref callback the garbage collector runs between any two lines): such a stop is sent again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []  # the stops this block raised: the unraisable hook knows them by identity

    def stop(signum, frame):
        raised.append(KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum))
        raise raised[-1]

    def dropped(unraisable):
        if any(unraisable.exc_value is e for e in raised):  # lost, so it comes again, once the finalizer is done
            signum = getattr(unraisable.exc_value, "signum", signal.SIGINT)
            again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
        else:
            hook(unraisable)

    previous = {}
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is signal.SIG_DFL:
            previous[s] = signal.signal(s, stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Python's own: it raises, and so is lost too
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, stop)
    hook, sys.unraisablehook = sys.unraisablehook, dropped
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w"):
    """A file object for the output file ``path``, the one way every command writes one (``--output``, ``--json``,
    ``--plot``, reports, our JSON files). A symbolic link is written through, never replaced: the file it leads to
    gets the content. A regular (or new) file is written to a hidden ``.NAME.XXXX.partial`` beside it, flushed,
    fsynced and renamed over it at the end, keeping an existing file's permissions (a new one gets the umask's);
    anything that stops the block (an error, a full disk, Ctrl-C, SIGTERM, SIGHUP) removes the partial file and
    leaves the old one as it was. The writer holds an ``flock`` on its partial file until the rename, so a partial
    file of the same output that nobody holds is one a killed writer left (``kill -9``, a power cut): removed
    first (:func:`_remove_stale_partials`); another live writer's is left alone. Anything else there (``/dev/null``,
    ``/dev/full``, a FIFO) is written directly, and a failed write is an error, never success. ``mode``: ``"w"``
    (UTF-8 text) or ``"wb"``."""
    target = Path(os.path.realpath(path))  # through every link: the file the user's name leads to
    encoding = None if "b" in mode else "utf-8"
    with _stop_signals_raise():
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, mode, encoding=encoding) as f:  # a device or FIFO: no rename possible
                yield f
                f.flush()
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(target)
        named = []  # the partial file's name, said before the file exists: a stop from then on removes it
        held = None
        try:
            fd = _locked_partial(target, named)
            held = os.dup(fd)  # the lock lasts until the rename, after the file object closes fd
            tmp = named[0]
            if st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fd, 0o666 & ~umask)
            with open(fd, mode, encoding=encoding) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            for name in named:
                name.unlink(missing_ok=True)
            raise
        finally:
            if held is not None:
                os.close(held)


_PARTIAL_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"  # the 8 characters between a partial file's dots
_RANDOM = random.SystemRandom()


def _partial_name(target: Path) -> re.Pattern:
    """The names :func:`_locked_partial` gives ``target``'s partial files (8 random characters in between)."""
    return re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.partial")


def _locked_partial(target: Path, named: list) -> int:
    """A new partial file for ``target``, open and ``flock``-ed: its fd, its path left alone in ``named``. The path
    goes into ``named`` before the file is made (``O_EXCL``: never someone else's), so a stop that lands between
    the file's creation and the caller's cleanup still finds it to remove. Locked only after it was created, so a
    cleaner may have taken it for stale in between: then it is gone from its name, and another is made."""
    while True:
        name = target.parent / f".{target.name}.{''.join(_RANDOM.choices(_PARTIAL_CHARS, k=8))}.partial"
        named.append(name)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another writer's: not ours to remove
            named.pop()
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(name, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        named.pop()  # a cleaner took it: gone already
        os.close(fd)


def _remove_stale_partials(target: Path) -> None:
    """Remove the partial files of ``target`` that no process holds locked: a writer killed before it could remove
    its own (``kill -9``) left them. A live writer's lock makes the non-blocking ``flock`` fail: its file stays."""
    pattern = _partial_name(target)
    with os.scandir(target.parent) as entries:
        stale = [Path(e.path) for e in entries if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    for path in stale:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or not ours to read: left as it is
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:  # not renamed meanwhile
                path.unlink()
        except OSError:  # locked by a live writer (or gone): not stale
            pass
        finally:
            os.close(fd)


def save_figure(fig, path: str | Path, **kwargs) -> Path:
    """``fig.savefig`` into the output file ``path`` through :func:`atomic_output` (the format from its suffix)."""
    path = Path(path)
    with atomic_output(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".").lower() or "png", **kwargs)
    return path
