"""The teacher's side of a compress run: its artifact at the first quantization that keeps it
(:func:`export_teacher`, cached per teacher: :func:`teacher_cache`), any export done once (:func:`export_once`),
its sentence vectors of the quality measures kept in the cache (:func:`cached_teacher_vectors`) and its name for
titles. The teacher is a :class:`run.Teacher`, read once per run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import read_json, write_json

from .run import Teacher

# The teacher's artifact in a compress report: the first of these whose outputs keep the teacher (TEACHER_COSINE).
# Measured (docs/RESULTS.md): all-MiniLM-L6-v2's sentence embeddings at int8-dynamic 0.9866 mean cosine to fp32
# (refused), int8 weight-only 0.9987, fp16 0.99999994; ORT's dynamic int8 compute is what loses them.
TEACHER_QUANTIZATIONS = ("int8-dynamic", "int8", "fp16", "none")
# A teacher this large starts at weight-only int8, the cheapest rung sure to keep it (its weights alone rounded, fp32
# compute): int8-dynamic's per-call activation scales lost every real sentence encoder measured (all-MiniLM-L6-v2
# 0.985, a 109M MPNet -0.10, both < TEACHER_COSINE), and a refused rung is a whole export (MiniLM on 2 loaded cores:
# 75 of the ladder's 150 s). Bytes of its weight files: 10M fp32 parameters; the tests' tiny teachers (~0.5 MB) keep
# the whole ladder.
LARGE_TEACHER = 40_000_000


TEACHER_COSINE = 0.99


# The teacher's parity sentences at each rung: its PyTorch and ONNX passes are a third of an export (MiniLM, 1 thread:
# 29 of 79 s at 128 sentences); 64 still tell 0.9866 from 0.99 (the spread of a sentence's cosine is ~0.005).
TEACHER_CHECK = 64
# A teacher over LARGE_TEACHER starts at weight-only int8, whose mean cosine sat well above TEACHER_COSINE on every
# teacher measured (all-MiniLM-L6-v2 0.9987, a 109M MPNet-class 0.99984): 32 sentences' mean, its standard error under
# 0.001 at a sentence's spread of ~0.005, still lies > 8 of them from the bar. The parity passes were 156 of that 109M
# teacher's 239 s export at 64 sentences (benchmarks/teacher_pass.md).
LARGE_TEACHER_CHECK = 32


def kept_cosine(manifest: dict) -> float:
    """How well an artifact keeps its model: the mean cosine of its sentence embeddings (else of its outputs) to
    PyTorch's on the export's check sentences; a classifier's class agreement counts too (the lower of the two)."""
    parity = manifest["parity"]
    cosine = parity.get("sentence_embedding", parity)["cosine_mean"]
    return min(cosine, parity.get("agreement", 1.0))


def export_teacher(teacher: Teacher, out: Path, task: str, progress: bool, say=print) -> tuple[Path, str, dict]:
    """The teacher's artifact in ``out`` at the first of :data:`TEACHER_QUANTIZATIONS` that keeps it within
    :data:`TEACHER_COSINE`: ``(artifact, quantization, {refused mode: why})``. The artifact a resumed run chose is
    kept (exported again only if the teacher changed since); else the one an earlier run of this teacher left in the
    cache (:func:`teacher_cache`)."""
    manifest = Path(out) / "manifest.json"
    chosen = _verified_choice(Path(out), say) if manifest.is_file() else None
    if chosen in TEACHER_QUANTIZATIONS:
        export_once(teacher.folder, Path(out), chosen, progress, task=task, allow_low_parity=True)
        if kept_cosine(read_json(manifest)) >= TEACHER_COSINE:
            check_row_int8(Path(out), say)
            return Path(out), chosen, {}
    cache = teacher_cache(teacher, task)
    if (hit := _from_cache(cache, Path(out), say)) is not None:
        say(f"the teacher's {hit[0]} artifact from the cache ({cache}), exported by an earlier run")
        check_row_int8(Path(out), say)
        return Path(out), *hit
    mode, refused = _teacher_ladder(teacher, Path(out), task, progress, say)
    check_row_int8(Path(out), say)
    _to_cache(cache, Path(out), mode, refused, say)
    return Path(out), mode, refused


def check_row_int8(artifact: Path, say=print) -> dict | None:
    """The teacher's row-int8 graph (``export/teacher_int8.py``) written into ``artifact`` and checked, where the
    teacher is at least ``teacher_int8.MIN_WIDTH`` wide and the artifact keeps it (``teacher_vectors.artifact_keeps``);
    returns the record (``row_int8/parity.json``) or None. Kept as it is where its record is of this ``model.onnx``.

    The check runs no PyTorch: the graph's vectors against the artifact's fp32 compute on the export's own check
    sentences (:data:`LARGE_TEACHER_CHECK` of them), per sentence angle ``b``. The artifact's parity with PyTorch
    gave its worst sentence angle ``a = arccos(cosine_min)``; an angle obeys the triangle inequality, so a sentence's
    angle to PyTorch is at most ``a + b``: the recorded bound is the mean of ``cos(a + b)``, and the pass takes the
    graph only where it holds :data:`TEACHER_COSINE`, the bar by which the ladder keeps a teacher at all."""
    import numpy as np

    from ..export.parity import read_sentences
    from ..export.teacher_int8 import MIN_WIDTH, record_path, write_row_int8
    from ..training.teacher_vectors import artifact_keeps, row_int8_keeps, row_int8_session

    try:
        manifest = read_json(artifact / "manifest.json")
        width = int(read_json(artifact / "config.json").get("hidden_size") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if width < MIN_WIDTH or manifest.get("task") != "feature-extraction" or not artifact_keeps(artifact):
        return None
    if _recorded(artifact, manifest):
        return read_json(record_path(artifact))
    parity = manifest["parity"].get("sentence_embedding", manifest["parity"])
    try:
        sentences = read_sentences(manifest["parity"]["check_file"], LARGE_TEACHER_CHECK)[0]
    except (OSError, ValueError, KeyError) as e:
        say(f"the teacher's row-int8 graph is not checked ({first_line(e)}): its pass stays in fp32")
        return None
    if not write_row_int8(artifact):
        return None
    fp32, int8 = (_vectors(artifact, sentences, swap) for swap in (None, row_int8_session))
    cosine = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
    angle = np.arccos(np.clip(cosine, -1.0, 1.0)) + np.arccos(min(1.0, float(parity["cosine_min"])))
    bound = np.cos(np.minimum(angle, np.pi))
    record = {
        "sentences": len(sentences),
        "cosine_mean": float(cosine.mean()),
        "cosine_min": float(cosine.min()),
        "artifact_cosine_min": float(parity["cosine_min"]),
        "cosine_bound": float(bound.mean()) if np.isfinite(bound).all() else float("nan"),
        "thresholds": {"cosine": TEACHER_COSINE},
        "model_sha256": manifest["files"]["model.onnx"]["sha256"],
    }
    write_json(record_path(artifact), record)
    kept = "its pass runs it" if row_int8_keeps(artifact) else f"< {TEACHER_COSINE}: its pass stays in fp32"
    say(f"the teacher's row-int8 compute: mean cosine to PyTorch >= {record['cosine_bound']:.4f} (bound), {kept}")
    return record


def _recorded(artifact: Path, manifest: dict) -> bool:
    """Whether ``artifact`` already holds a check of its row-int8 graph for this ``model.onnx`` (kept or refused)."""
    from ..export.teacher_int8 import record_path

    try:
        return read_json(record_path(artifact))["model_sha256"] == manifest["files"]["model.onnx"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _vectors(artifact: Path, sentences: list[str], swap=None):
    """The artifact's sentence vectors (before Normalize) of ``sentences`` on every usable core; ``swap(runtime)``
    changes its session first (the row-int8 graph)."""
    import numpy as np

    from sharebert_runtime import Runtime

    from ..training.teacher_vectors import usable_cores

    runtime = Runtime(artifact, threads=usable_cores(), ram="fp32")
    if swap is not None:
        swap(runtime)
    return np.stack(runtime.embed(sentences, normalize=False)).astype(np.float64)


def export_rung(teacher, out: Path, task: str, mode: str, progress: bool = False, run_teacher=None) -> None:
    """One rung of the ladder: the teacher exported at ``--quantize mode`` into ``out``, its parity measured on
    :data:`TEACHER_CHECK` sentences (:data:`LARGE_TEACHER_CHECK` for a teacher over :data:`LARGE_TEACHER`) and recorded
    rather than refused (the ladder judges it by :func:`kept_cosine`). ``run_teacher``: the folder as the run read it
    (:class:`run.Teacher`), so the export does not read its ``config.json`` again."""
    from ..export import export_model

    export_model(
        teacher,
        out,
        task=task,
        quantize=mode,
        overwrite=True,
        progress=progress,
        check_limit=LARGE_TEACHER_CHECK if top_weight_bytes(teacher) > LARGE_TEACHER else TEACHER_CHECK,
        runs=5,
        allow_low_parity=True,
        run_teacher=run_teacher,
    )


def _teacher_ladder(teacher: Teacher, out: Path, task: str, progress: bool, say) -> tuple[str, dict]:
    """The first rung of the teacher's ladder (:func:`teacher_ladder`) that keeps it, exported into ``out``, and the
    refusals."""
    manifest, refused = out / "manifest.json", {}
    for mode in teacher_ladder(teacher.folder):
        try:
            export_rung(teacher.folder, out, task, mode, progress, teacher)
        except ValueError as e:  # ParityError: outputs not finite
            refused[mode] = first_line(e)
            continue
        cosine = kept_cosine(read_json(manifest))
        if cosine >= TEACHER_COSINE:
            return mode, refused
        refused[mode] = f"mean cosine {cosine:.4f} to PyTorch < {TEACHER_COSINE}"
        say(f"the teacher at --quantize {mode} does not keep it ({refused[mode]}); the next mode instead")
    raise ValueError(
        f"no quantization keeps the teacher {teacher.folder}: {'; '.join(f'{k}: {v}' for k, v in refused.items())}"
    )


def teacher_ladder(folder) -> tuple[str, ...]:
    """The quantizations tried for the teacher in ``folder``, in order: :data:`TEACHER_QUANTIZATIONS`, from int8 on
    for a teacher whose weight files hold more than :data:`LARGE_TEACHER` bytes."""
    return TEACHER_QUANTIZATIONS[1:] if top_weight_bytes(folder) > LARGE_TEACHER else TEACHER_QUANTIZATIONS


def top_weight_bytes(folder) -> int:
    """Bytes of the weight files (safetensors, bin) at the top of a model folder."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.suffix in (".safetensors", ".bin"))


def teacher_cache(teacher: Teacher, task: str) -> Path:
    """The cache folder of a teacher's artifact (``paths.cache_dir``): keyed by the teacher's files
    (:attr:`run.Teacher.fingerprint`), the task, the quantization ladder and its bar, and the exporter's code,
    so a second ``compress`` of the same teacher skips its exports (on all-MiniLM-L6-v2, 2 cores: ~100 s, half of
    it the int8-dynamic export the bar refuses)."""
    import hashlib

    from .. import export
    from ..formats.paths import cache_dir

    sources = sorted(Path(export.__file__).parent.glob("*.py"))
    key = json.dumps(
        [
            teacher.fingerprint,
            task,
            teacher_ladder(teacher.folder),
            TEACHER_COSINE,
            [hashlib.sha256(f.read_bytes()).hexdigest() for f in sources],
        ]
    )
    return cache_dir() / "teacher-artifacts" / hashlib.sha256(key.encode()).hexdigest()[:24]


CACHE_CHOICE = "choice.json"  # beside the cached artifact: the quantization chosen and the ones refused


def _verified_choice(artifact: Path, say) -> str | None:
    """The quantization of the teacher's artifact in ``artifact`` when it passes its own manifest (every field, the
    size and sha256 of every file: ``verify_artifact``); else None, said in one line, and it is exported again. A
    truncated or edited file is never measured (it failed at the end of the run, as an internal error)."""
    from sharebert_runtime.artifact import ArtifactError, verify_artifact

    try:
        return verify_artifact(artifact).get("quantization")
    except (ArtifactError, OSError) as e:
        say(f"the teacher's artifact in {artifact} fails its manifest's checks ({first_line(e)}): exported again")
        return None


def _from_cache(cache: Path, out: Path, say=print) -> tuple[str, dict] | None:
    """``(quantization, refusals)`` with the cached artifact copied into ``out``; None where there is none (or an
    unreadable one, or one that fails its manifest's hashes: said, removed and exported again)."""
    try:
        choice = read_json(cache / CACHE_CHOICE)
        mode, refused = choice["quantization"], dict(choice["refused"])
        if mode not in TEACHER_QUANTIZATIONS:
            return None
        if _verified_choice(cache / "artifact", say) != mode:
            shutil.rmtree(cache, ignore_errors=True)
            return None
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(cache / "artifact", out)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return mode, refused


def _to_cache(cache: Path, out: Path, mode: str, refused: dict, say) -> None:
    """The teacher's artifact and choice kept in ``cache`` for the next run; a cache that cannot be written is said
    and skipped (the run goes on)."""
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out, tmp / "artifact")
        write_json(tmp / CACHE_CHOICE, {"quantization": mode, "refused": refused})
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"the teacher's artifact is not cached ({first_line(e)}); set SHAREBERT_CACHE to a writable folder")


def export_once(  # 7 parameters: export_model's own keywords (quantize, task, parity gate, format), passed through
    model_dir: Path,
    out: Path,
    quantize: str,
    progress: bool,
    task: str = "feature-extraction",
    allow_low_parity: bool = False,
    format: str = "onnx",
) -> Path:
    """``model_dir`` exported to ``out`` (``export --format format``), unless ``out`` holds an artifact made after
    ``model_dir``'s weights were written: a run resumed after its export is not exported twice, one that trained on
    is."""
    from sharebert.export import export_model

    manifest = out / "manifest.json"
    weights = [f.stat().st_mtime for f in Path(model_dir).iterdir() if f.suffix in (".safetensors", ".bin")]
    if not manifest.is_file() or manifest.stat().st_mtime < max(weights, default=0.0):
        export_model(
            model_dir,
            out,
            task=task,
            quantize=quantize,
            overwrite=True,
            progress=progress,
            check_limit=128,
            runs=5,
            allow_low_parity=allow_low_parity,
            format=format,
        )
    return out


def teacher_vectors_key(teacher: Teacher) -> str:
    """What the teacher's vectors of the quality measures depend on: its files (:attr:`run.Teacher.fingerprint`:
    weights, config, tokenizer, recipe and Dense modules) and the length it reads."""
    import hashlib

    return hashlib.sha256(json.dumps([teacher.fingerprint, teacher.max_length]).encode()).hexdigest()


def vectors_path(key: str, texts) -> Path:
    import hashlib

    from ..formats.paths import cache_dir

    digest = hashlib.sha256(json.dumps([key, list(texts)]).encode()).hexdigest()[:24]
    return cache_dir() / "teacher-vectors" / f"{digest}.npy"


def cached_teacher_vectors(key: str, texts, compute):
    """The teacher's vectors of ``texts`` (``compute()``), kept in the cache (``paths.cache_dir``) under ``key``
    (:func:`teacher_vectors_key`) and the texts: the teacher's side of a report's measures (held-out sentences,
    search set, STS-B: 3,740 sentences, ~3 minutes of a 5-minute compress on 2 loaded cores) is computed once
    per teacher. A damaged file is computed again; a cache that cannot be written is skipped."""
    import numpy as np

    path = vectors_path(key, texts)
    try:
        cached = np.load(path, allow_pickle=False)
        if (
            cached.ndim == 2
            and cached.shape[0] == len(texts)
            and cached.dtype.kind == "f"
            and np.isfinite(cached).all()
        ):
            return cached
    except (OSError, ValueError, EOFError):
        pass
    vectors = compute()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.npy")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, vectors)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return vectors


def teacher_name(teacher) -> str:
    """The teacher's name for titles: its model card's first heading (``README.md``'s ``# all-MiniLM-L6-v2``, as
    the Hub writes them; config.json's ``_name_or_path`` names the base model a fine-tuned one came from), else
    the folder's name, with its parent's when that alone says little (``model``, ``snapshot``)."""
    folder = Path(teacher).absolute()
    card = folder / "README.md"
    if card.is_file():
        with open(card, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)
        title = next((line[2:].strip() for line in head.splitlines() if line.startswith("# ")), "")
        if 0 < len(title) <= 80:
            return title
    generic = ("model", "student", "snapshot", "")
    return folder.name if folder.name not in generic else f"{folder.parent.name}/{folder.name}"
