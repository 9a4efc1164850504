"""What a run is made of, for the caches' keys and for ``--resume`` (``outdir.check_same_run``): the teacher's
files, the training files, torch-free (``finetune`` and ``distill`` both use it; neither imports the other here)."""

from __future__ import annotations

from pathlib import Path

from sharebert_runtime.artifact import sha256
from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import file_fingerprint, read_json
from sharebert_runtime.untrusted import regular_file


def teacher_fingerprint(teacher_dir) -> list[str]:
    """``name:sha256`` of each file that makes a teacher's outputs, the caches' view of it: its config, weights
    (shards and their index too), tokenizer files, and the files of each sentence-transformers module that
    ``modules.json`` names (``2_Dense/...``, at any depth)."""
    d = Path(teacher_dir)
    files = sorted(p for p in d.iterdir() if p.suffix in (".json", ".safetensors", ".bin", ".txt", ".model"))
    try:
        modules = read_json(d / "modules.json") if (d / "modules.json").is_file() else []
    except ValueError:
        modules = []  # the recipe reader names a bad modules.json; here it only adds nothing
    for module in modules if isinstance(modules, list) else []:
        folder = d / str(module.get("path", "")) if isinstance(module, dict) and module.get("path") else None
        if folder is not None and folder.is_dir() and folder.resolve() != d.resolve():
            files += sorted(p for p in folder.iterdir() if p.suffix in (".json", ".safetensors", ".bin"))
    parts = []
    for p in files:  # a FIFO, device or folder under a weights/config name is refused, never left out
        regular_file(p, "a teacher file")
        try:
            parts.append(f"{p.relative_to(d)}:{sha256(p)}")
        except OSError as e:
            raise ValueError(f"{p} cannot be read: {first_line(e)}") from None
    return parts


def data_files(train=None, data=None, default=()) -> list[Path]:
    """The files a run trains on, for its fingerprint: a prepared ``data`` folder's manifest (it holds each
    shard's sha256), else the ``train`` files (``default`` without)."""
    from sharebert_runtime.textlines import resolve_sources

    if data is not None:
        from .shards import MANIFEST

        return [Path(data) / MANIFEST]
    return [f for f in resolve_sources(train or default) if isinstance(f, Path)]


def run_fingerprint(teacher_dir, student, files, objective: str, teacher: list[str] | None = None) -> dict:
    """What a ``--resume`` must find unchanged (``outdir.check_same_run``): the teacher's files (weights, config,
    tokenizer, recipe: :func:`teacher_fingerprint`, full sha256; ``teacher``: that list where the caller has it
    already), the student (its name or shape), the training files' bytes (``outdir.file_fingerprint``) and the
    objective."""
    return {
        "teacher": teacher_fingerprint(teacher_dir) if teacher is None else teacher,
        "student": student,
        "data": [f"{Path(f).name}:{file_fingerprint(f)}" for f in files],
        "objective": objective,
    }
