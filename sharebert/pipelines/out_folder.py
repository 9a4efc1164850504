"""A compress run's ``--out`` folder: what it holds (:data:`PARTS`), whose it is (the marker, ``outdir.MARK``, saying
:data:`COMMAND`), the checks before any work (:func:`check_out`, :func:`check_same_student`), ``--resume``'s
fingerprint, ``--overwrite``'s earlier result kept aside until the new report is written (:func:`publish_over`), and
the student published alone (:func:`publish_student`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sharebert_runtime.outdir import (
    MARK,
    check_out_dir,
    check_same_run,
    check_unlisted,
    made_by,
    mark_out,
    read_json,
    read_mark,
    seal_out,
)

from .run import CompressRun

REPORT = "report.json"


WORK = "work"  # an embedding teacher's distillation (checkpoints, the teacher's vectors): kept with --keep-work
WEB = "web"  # --web: the student as a folder transformers.js loads (export --format web), beside its int8 artifact


PARTS = (
    "general",
    "student",
    WORK,
    "artifact",
    "teacher_artifact",
    WEB,
    "teacher_logits",
    "phases.json",
    "clock.json",  # classifier_plan.CLOCK: each phase's seconds before its training, for --resume
    REPORT,
    "report.md",
    "report.png",
    MARK,
)  # what a compress run writes in ``out`` (``--overwrite`` replaces these, nothing else)


COMMAND = "compress"  # the marker's command (outdir.MARK): a folder is a compress result only when it says so


ASIDE = ".replaced"  # ``--overwrite``: the earlier result's parts wait here until the new report is written


def _legacy(path: Path) -> bool:
    """A folder that looks like a compress result (its report, or a phase's metrics) without compress's marker: written
    by hand, by another tool, or copied. ``check_out_dir``'s ``legacy``: refused naming the marker, never replaced.
    No older format is served: sharebert 0.1.0, the first release, writes the marker."""
    try:
        report = read_json(path / REPORT) if (path / REPORT).is_file() else None
    except (OSError, ValueError):
        report = None
    return (isinstance(report, dict) and {"teacher", "student"} <= set(report)) or any(
        (path / part / "metrics.json").is_file() for part in ("student", "general")
    )


def check_out(out, teacher, train, overwrite: bool, resume: bool, data=None) -> Path:
    """``out`` checked, nothing changed: a new or empty folder, or a compress result (its marker) with
    ``overwrite``/``resume``; one that looks like a result without the marker is refused (``outdir.check_out_dir``)."""
    path = check_out_dir(
        out,
        "compress result",
        made_by(COMMAND),
        overwrite or resume,
        legacy=_legacy,
        inputs=(teacher, *([data] if data is not None else []), *(train or [])),
        stopped=stopped_run,
    )
    if overwrite and not resume:
        check_stopped_aside(path, out)
        check_unlisted(path, out, "compress run")
    return path


def check_stopped_aside(path: Path, given) -> None:
    """An ``--overwrite`` killed while it moved the earlier result aside (kill -9, a power cut, before its own marker)
    leaves some of the result's parts in ``.replaced``, the rest in place, the result's sealed marker unchanged: said
    as such, with how to put them back, where every file there is one the marker lists and missing from its place."""
    aside = path / ASIDE
    listed = (read_mark(path) or {}).get("files")
    if not isinstance(listed, dict) or not aside.is_dir() or aside.is_symlink():
        return
    inside = [f.relative_to(aside).as_posix() for f in aside.rglob("*") if not f.is_dir() or f.is_symlink()]
    parts = sorted({name.split("/")[0] for name in inside})
    # a moved part is gone from its place: a copy beside the original is the user's (check_unlisted names it)
    if inside and all(name in listed for name in inside) and not any(os.path.lexists(path / p) for p in parts):
        raise ValueError(
            f"--out {given}: an --overwrite stopped while it set the earlier result aside ({', '.join(parts)} in "
            f"{aside}): put them back (mv {aside}/* {path}/ && rmdir {aside}) and run again"
        )


def stopped_run(out: Path) -> str | None:
    """What a compress run stopped before its report (Ctrl-C, SIGTERM, a kill after a periodic save) left for
    ``--resume``, in words: its newest checkpoint (the distillation's, or a classifier's phase's), or a classifier's
    phases recorded (stopped between its phases or in its report: no checkpoint then); None for a finished run or one
    stopped before its first checkpoint. Torch-free: names only (``--resume`` checks the rest)."""
    if (out / REPORT).is_file():
        return None
    found = [
        (int(p.name.removeprefix("checkpoint-")), p)
        for phase in (f"{WORK}/student", "general", "student")
        for p in (out / phase / "checkpoints").glob("checkpoint-*")
        if p.name.removeprefix("checkpoint-").isdigit() and p.is_dir()
    ]
    if not found:
        return "its finished phases, phases.json" if (out / "phases.json").is_file() else None
    step, path = max(found)
    return f"a checkpoint at step {step}, {path.relative_to(out)}"


def fingerprint(run: CompressRun, student: dict, objective: str) -> dict:
    """What a ``--resume`` must find unchanged (``fingerprint.run_fingerprint``): the teacher's files (its
    fingerprint, made once per run), the student's shape, the training data (``--train`` files, the ``--data``
    manifest, or the default corpus's files) and the objective."""
    from ..training.distill_sentences import default_corpus
    from ..training.fingerprint import data_files, run_fingerprint

    o, teacher = run.options, run.teacher
    files = data_files(o.train, o.data, default_corpus())
    return run_fingerprint(teacher.folder, json.dumps(student, sort_keys=True), files, objective, teacher.fingerprint)


def start_out(out: Path, fp: dict, overwrite: bool, resume: bool) -> Path | None:
    """After every check: with ``resume``, the run's fingerprint compared; with ``overwrite``, the earlier
    result's parts moved into ``out/.replaced`` (kept until :func:`finish_out`; :func:`restore_out` puts them
    back when the new run fails). Then ``out`` is marked a compress result. Returns the side folder, if any."""
    if resume:
        check_same_run(out, fp)
    aside = out / ASIDE
    if os.path.lexists(aside) and not (aside.is_dir() and not aside.is_symlink()):
        raise ValueError(f"{aside} is not the folder compress keeps an earlier result in; move it away and run again")
    if overwrite and not resume:
        if aside.is_dir():  # an earlier --overwrite that never finished: its parts are a partial run, the result waits
            remove_parts(out)
        else:
            aside.mkdir(parents=True)
            for name in PARTS:
                if os.path.lexists(out / name):
                    os.replace(out / name, aside / name)
    out.mkdir(parents=True, exist_ok=True)
    mark_out(out, COMMAND, fp)
    return aside if aside.is_dir() else None


def remove_parts(out: Path) -> None:
    for name in PARTS:
        part = out / name
        shutil.rmtree(part) if part.is_dir() and not part.is_symlink() else part.unlink(missing_ok=True)


def restore_out(out: Path, aside: Path | None) -> None:
    """The new run failed: its parts removed, the earlier result put back as it was."""
    if aside is None or not aside.is_dir():
        return
    remove_parts(out)
    for part in aside.iterdir():
        os.replace(part, out / part.name)
    aside.rmdir()


def finish_out(out: Path) -> None:
    """The new report is written: the earlier result (``--overwrite``) goes."""
    shutil.rmtree(out / ASIDE, ignore_errors=True)


def publish_over(out: Path, fp: dict, overwrite: bool, resume: bool, run) -> dict:
    """``run()``'s report, with the earlier result set aside first (:func:`start_out`): put back when the run fails,
    removed once the new report is written; a stopped run keeps its new parts, to ``--resume``."""
    from ..training.callbacks import StopRequested

    aside = start_out(out, fp, overwrite, resume)
    try:
        report = run()
    except Exception as e:
        if not isinstance(e, StopRequested):
            restore_out(out, aside)
        raise
    if not report.get("stopped"):
        finish_out(out)
        seal_out(out)  # the marker lists what this run wrote: the next --overwrite replaces only those
    return report


def check_same_student(out: Path, overrides: dict, parts=("student",)) -> None:
    """Refuse to resume into ``out`` when a student it holds (saved, or in a checkpoint) has another shape than the
    one these limits pick (``overrides``): the run would fail late, loading the weights into the wrong model."""
    for part in parts:
        folder = out / part
        for config in [folder / "config.json", *sorted(folder.glob("checkpoints/checkpoint-*/config.json"))]:
            try:
                raw = read_json(config)
            except (OSError, ValueError):
                raw = None
            if not isinstance(raw, dict):
                if config.parent == folder and config.exists():  # a checkpoint's may be a save cut short: skipped
                    raise ValueError(f"{config} is not a model config (a JSON object): start again with --overwrite")
                continue
            differ = [f"{k} {raw.get(k)} -> {v}" for k, v in overrides.items() if raw.get(k) != v]
            if differ:
                raise ValueError(
                    f"{out} holds a student of another shape than these options pick ({', '.join(differ)}): "
                    "resume with the first run's --max-params / --max-bytes, or start again with --overwrite"
                )
            break


def publish_student(work: Path, out: Path, portable: bool) -> Path:
    """``out`` (``--out/student``) as a folder to ship: the model, its tokenizer and its sentence-transformers
    recipe from the distillation's folder ``work``, none of its run files (checkpoints, the teacher's vectors,
    metrics, logs, curves, marker); written beside and swapped in; portable (loads with ``trust_remote_code=True``
    where sharebert is not installed) unless ``portable`` is False."""
    from ..model.modeling_sharebert import AUTO_CLASSES
    from ..model.portable import make_portable
    from ..training.distill_run import TARGETS_FILE

    run_files = {"checkpoints", "metrics.json", "log_history.json", "curves.png", MARK, ".lock"}
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in work.iterdir():
        if item.name in run_files or item.name.startswith((TARGETS_FILE, ".")):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    if portable:
        make_portable(tmp, AUTO_CLASSES)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def publish_web(student: Path, out: Path, artifact: Path, progress: bool, task: str, allow_low_parity: bool) -> dict:
    """``--web``: the published ``student`` exported as ``out/web`` (``export --format web --quantize int8``, checked
    as its int8 ``artifact`` was, at the same parity gate); the report's entry: its folder, its bytes and the
    artifact's (the same graph without the RAM-int8 ones: a little smaller). Sealed with the run's other files."""
    from .teacher_pass import export_once

    web = export_once(student, out / WEB, "int8", progress, task=task, allow_low_parity=allow_low_parity, format=WEB)

    def size(folder: Path) -> int:
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())

    return {
        "folder": WEB,
        "bytes": size(web),
        "artifact_bytes": size(artifact),
        "model": read_json(web / "manifest.json")["web"]["model"],
    }
