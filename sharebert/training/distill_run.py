"""A distillation's out folder: its marker (``COMMAND``), the files it writes, and a ``--resume`` refused on another
run's folder or other training data than its checkpoint's."""

from __future__ import annotations

from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import read_json

from .run_skeleton import RunKind

PROJECTIONS_FILE = "distill_projections.safetensors"
TARGETS_FILE = "teacher_targets"  # an embedding distillation's teacher vectors: -<key>.npy in its --out
DATA_FILE = "distill_data.json"  # in each checkpoint: what it trained on (check_same_data)


COMMAND = "distill"  # the marker's command (``outdir.MARK``): a folder is a distillation's only when it says so


def looks_like_distill_out(path: Path) -> bool:
    """A folder that looks like a distillation's (its result, its checkpoints, or the teacher's vectors), with or
    without this command's marker: ``check_out_dir``'s ``legacy``, which it asks only of a folder the marker does not
    vouch for (written by hand, by another tool, or copied): refused naming the marker, never replaced. No older
    format is served: sharebert 0.1.0, the first release, writes the marker."""
    return (
        (path / "metrics.json").is_file() or (path / "checkpoints").is_dir() or any(path.glob(f"{TARGETS_FILE}-*.npy"))
    )


DISTILL = RunKind("distillation result", COMMAND, looks_like_distill_out)  # every distillation's --out


def student_name(student: str) -> str:
    """``--student`` as its fingerprint records it: a folder by its full path, a preset by its name."""
    return str(Path(student).resolve()) if Path(student).exists() else student


def check_same_data(checkpoint: Path, data: dict) -> None:
    """Refuse to resume a distillation on another training set than its checkpoint's: a task distillation's
    ``--augment`` and the seed that drew the copies (a checkpoint without ``DATA_FILE`` trained without
    copies), an embedding distillation's sentences (count and hash; unchecked where the file lacks them) and
    student (``--student`` and ``--set``), nor a checkpoint of one kind as the other's."""
    try:
        saved = read_json(checkpoint / DATA_FILE)
    except FileNotFoundError:
        saved = {"augment": 0, "seed": data["seed"]} if "augment" in data else dict(data)
    except (OSError, ValueError) as e:
        raise ValueError(f"{checkpoint / DATA_FILE} cannot be read ({first_line(e)})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{checkpoint / DATA_FILE} is not a JSON object")
    if "sentences_sha256" in saved and "sentences_sha256" not in data:
        raise ValueError(
            f"--resume: {checkpoint} is an embedding distillation's checkpoint; resume it with "
            "--objective embedding, or start again with --overwrite"
        )
    if saved.get("student", data.get("student")) != data.get("student"):  # unchecked where the file lacks it
        raise ValueError(
            f"--resume: {checkpoint} distilled the student {saved['student']}; resume with the same "
            f"--student and --set (now {data['student']}), or start again with --overwrite"
        )
    if "sentences_sha256" in data:
        if saved.get("sentences_sha256") != data["sentences_sha256"]:
            raise ValueError(
                f"--resume: {checkpoint} trained on {saved.get('sentences', '?')} other sentences; "
                f"resume on the same --train / --data and --max-train-samples (now {data['sentences']} "
                "sentences), or start again with --overwrite"
            )
    elif saved.get("augment", 0) != data["augment"] or (data["augment"] and saved.get("seed") != data["seed"]):
        raise ValueError(
            f"--resume: {checkpoint} trained with --augment {saved.get('augment', 0)} and --seed "
            f"{saved.get('seed')}; resume with the same (now --augment {data['augment']}, --seed "
            f"{data['seed']}), or start again with --overwrite"
        )
