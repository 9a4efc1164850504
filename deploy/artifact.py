"""The artifact contract, in one place: what ``sharebert export`` writes and ``sharebert_runtime`` reads.

An artifact is a folder: ``model.onnx``, ``config.json``, the tokenizer files (``tokenizer.json``), for
compact exports the RAM-int8 graphs, and ``manifest.json`` (format and version, task, labels, maximum
length, ONNX Runtime session entries, the sha256 and size of every file). This module owns the names,
the checks (:func:`verify_artifact`), the ONNX Runtime session options (:func:`session_options`) and
the int8 weight quantizer of the RAM-int8 mode; the exporter and the runtime both import it. Torch-free
(numpy and onnxruntime only).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .memory import give_back
from .options import symlink_loop
from .untrusted import JSON_BYTES, parse_json, read_bytes, read_json, regular_file

FORMAT, FORMAT_VERSION = "sharebert-onnx", 1
TASKS = ("fill-mask", "text-classification", "feature-extraction", "causal-lm")
MANIFEST, MODEL, TOKENIZER = "manifest.json", "model.onnx", "tokenizer.json"
# In a subfolder, so tools that take "the one .onnx file of a folder" (optimum's ORTQuantizer) find model.onnx
RAM_INT8_GENERATOR, RAM_INT8_COMPUTE = "ram_int8/generator.onnx", "ram_int8/compute.onnx"
# Their external data (bytes of model.onnx) is relative to the artifact folder: ONNX Runtime refuses "../",
# so they are opened from bytes with this session entry set to the artifact folder
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
RAM_INT8_ROWS = "ram_int8/rows.onnx"  # rows [start, end) of the product generated weights are cut from
# The compute graph's metadata entry holding the manifest's ram_int8 weights as exported (canonical JSON): the graph
# is hashed, so a weight record edited in the manifest alone (a layout of a square weight, which no shape tells) is
# refused at load (ram_int8_record, weights_record)
RAM_INT8_RECORD = "sharebert.ram_int8.weights"
ROWS_PER_CALL = 32  # rows of that product per call at load: the most fp32 the RAM-int8 mode ever holds
# Its columns per call, where the rows graph takes them (cols.start, cols.end): the product's int8-stored source
# (the word embeddings of a VEPS student) is then dequantized that many of its rows at a time, never whole in fp32
COLUMNS_PER_CALL = 4096
INT8_SESSION_CONFIG = {"session.disable_quant_qdq": "1"}  # int8-stored weights dequantized and folded at load
PAST, PRESENT = "past_key_values.", "present."  # a causal LM's cache inputs and outputs (optimum's names)
# ORT-format artifacts (`sharebert export --format ort`), format_version 2: no model.onnx; an ORT-format generator
# (no inputs; outputs the learned tensors and the generated weights, computed once at load) and the ORT-format
# compute graph stored without the bytes of those tensors (ORT format has no external data): the runtime writes
# the generator's outputs into the listed holes (`ort.holes`: offset, bytes, output) and opens the result.
# Web artifacts (`sharebert export --format web`, export/web_format.py): transformers.js' layout, the graph in
# onnx/ (the manifest's `web.model`), no depth input; format_version 1 (the runtime opens it as it opens model.onnx).
MODEL_FORMATS = ("onnx", "ort", "web")
WEB_DIR = "onnx"
ORT_FORMAT_VERSION = 2
READABLE_VERSIONS = (FORMAT_VERSION, ORT_FORMAT_VERSION)
ORT_GENERATOR, ORT_COMPUTE = "model.generator.ort", "model.compute.ort.part"
REQUIRED_OPERATORS = "required_operators.config"  # for a reduced-operator ONNX Runtime build (--include_ops_by_config)
# A text-classification manifest's ``pairs``: true when the model was trained on sentence pairs (text, text_pair), false
# on single texts, null (or absent, in a manifest without the field) when the export could not tell; predict and serve
# decide by it and by the input's content, and say every mismatch (deploy/cli.py, deploy/serve.py).
PAIRS = "pairs"
DEPTH = "depth"  # optional int64 scalar input of a layer-gated graph: encoder layers to run (1..N, default N)


class ArtifactError(ValueError):
    """The folder is not a complete, unmodified sharebert artifact (the message names the file)."""


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


SESSION_CONFIG_KEYS = frozenset(
    {  # ORT session entries an artifact may set: numerics-preserving ones only
        "session.disable_quant_qdq",
        "session.disable_prepacking",
        "session.use_env_allocators",
        "session.disable_aot_function_inlining",
        "session.qdqisint8allowed",
        "session.disable_double_qdq_remover",
    }
)
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
MAX_LENGTH_LIMIT = 1 << 16
# The largest |int8 weight| fed to an int8 matrix product (RAM int8, int8-dynamic, int8-static: 7-bit weights).
# ONNX Runtime's u8 x s8 kernel on x86 CPUs without VNNI (AVX2, AVX-512F/BW) multiplies with vpmaddubsw, which adds
# two u8 * s8 products into a saturating int16: 255 * 127 * 2 = 64,770 > 32,767, so the answer depends on the CPU
# (VNNI's vpdpbusd and ARM's dot products accumulate in int32). With |w| <= 64 the pair is at most 32,640: no CPU
# saturates, every kernel gives the exact integer sum (docs/DEVICE.md, "int8 on every CPU").
INT8_WEIGHT_MAX = 64
_HEX = frozenset("0123456789abcdef")


def _is_int(value, low: int = 0, high: int | None = None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    return ok and (high is None or value <= high)


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _special_tokens_ok(special) -> bool:
    return isinstance(special, dict) and all(isinstance(k, str) and _is_int(v) for k, v in special.items())


def _labels_ok(labels) -> bool:
    return labels is None or (isinstance(labels, list) and bool(labels) and all(isinstance(x, str) for x in labels))


def _labels_present(m: dict) -> bool:
    """A classification artifact (not a regression one) names its labels."""
    return not (
        m.get("task") == "text-classification" and m.get("problem_type") != "regression" and m.get("labels") is None
    )


def _pairs_ok(m: dict) -> bool:
    pairs = m.get(PAIRS)
    return pairs in (None, True, False) and (pairs is None or m.get("task") == "text-classification")


def _session_config_ok(config) -> bool:
    return isinstance(config, dict) and all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in config.values()
    )


# The manifest's scalar fields, in the order they are checked: (field, holds(manifest), why(manifest)); the first that
# does not hold is the one the error names
_FIELD_CHECKS = (
    ("format", lambda m: isinstance(m, dict) and m.get("format") == FORMAT, lambda m: f"is not {FORMAT!r}"),
    (
        "format_version",
        lambda m: m.get("format_version") in READABLE_VERSIONS,
        lambda m: (
            f"{m.get('format_version')!r} is not supported (this runtime reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        ),
    ),
    ("task", lambda m: m.get("task") in TASKS, lambda m: f"{m.get('task')!r} is not one of {', '.join(TASKS)}"),
    (
        "max_length",
        lambda m: _is_int(m.get("max_length"), 1, MAX_LENGTH_LIMIT),
        lambda m: f"{m.get('max_length')!r} is not an integer in 1..{MAX_LENGTH_LIMIT}",
    ),
    (
        "special_tokens",
        lambda m: _special_tokens_ok(m.get("special_tokens", {})),
        lambda m: "must map token names to non-negative integer ids",
    ),
    (
        "problem_type",
        lambda m: m.get("problem_type") in PROBLEM_TYPES,
        lambda m: f"{m.get('problem_type')!r} is not one of {PROBLEM_TYPES}",
    ),
    ("labels", lambda m: _labels_ok(m.get("labels")), lambda m: "must be a non-empty list of strings (or null)"),
    ("labels", _labels_present, lambda m: "are missing for a classification artifact"),
    (
        PAIRS,
        _pairs_ok,
        lambda m: f"{m.get(PAIRS)!r} must be true, false or null, and only a text-classification artifact says it",
    ),
    (
        "max_depth",
        lambda m: m.get("max_depth") is None or _is_int(m.get("max_depth"), 2),
        lambda m: f"{m.get('max_depth')!r} is not null or an integer >= 2 (the encoder layers a depth input may run)",
    ),
    (
        "depth_note",
        lambda m: isinstance(m.get("depth_note", ""), (str, type(None))),
        lambda m: "must be a string or null",
    ),
    (
        "session_config",
        lambda m: _session_config_ok(m.get("session_config", {})),
        lambda m: "must map entry names to strings",
    ),
    (
        "session_config",
        lambda m: not set(m.get("session_config", {})) - SESSION_CONFIG_KEYS,
        lambda m: (
            f"sets {sorted(set(m.get('session_config', {})) - SESSION_CONFIG_KEYS)}, not among the allowed entries "
            f"{sorted(SESSION_CONFIG_KEYS)}"
        ),
    ),
)


def _check_fields(manifest, path: Path) -> None:
    """Every manifest field the runtime uses has the right type and range (``ArtifactError`` naming it)."""

    def bad(field, why):
        raise ArtifactError(f"{path}: {field} {why}")

    for field, holds, why in _FIELD_CHECKS:
        if not holds(manifest):
            bad(field, why(manifest))
    embedding = manifest.get("embedding")
    if embedding is not None:
        _check_embedding(embedding, bad)
    _check_files_entry(manifest, path, bad)


def _check_files_entry(manifest: dict, path: Path, bad) -> None:
    """``files`` maps each file name to its sha256 and size, and lists every file the runtime opens."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        bad("files", "must map file names to their sha256 and size")
    for name, meta in files.items():
        if not (isinstance(meta, dict) and _is_int(meta.get("bytes")) and _is_sha256(meta.get("sha256"))):
            bad("files", f"entry {name!r} needs an integer bytes and a 64-digit sha256")
    needed = model_files(manifest, path) + [TOKENIZER]
    ram = manifest.get("ram_int8")
    if ram is not None:
        needed += _ram_int8_files(ram, bad)
    for name in needed:
        if name not in files:
            bad("files", f"does not list {name}, which the runtime opens")


def _check_embedding(entry, bad) -> None:
    """A feature-extraction artifact's recipe: ``pooling`` (how ``output``, a graph output, was pooled),
    ``normalize`` (whether the runtime L2-normalises it), ``do_lower_case`` (texts lower-cased first), ``source``."""
    from .pooling import POOLING_MODES

    if not isinstance(entry, dict):
        bad("embedding", "must be an object")
    if not isinstance(entry.get("pooling"), str) or entry["pooling"] not in POOLING_MODES:
        bad("embedding", f"pooling {entry.get('pooling')!r} is not one of {', '.join(POOLING_MODES)}")
    if not isinstance(entry.get("normalize"), bool) or entry.get("do_lower_case") not in (None, True, False):
        bad("embedding", "normalize must be true or false, do_lower_case true, false or null")
    if not isinstance(entry.get("output"), str):
        bad("embedding", "output must name the graph output holding the sentence embeddings")


def model_files(manifest: dict, path: Path = Path(MANIFEST)) -> list[str]:
    """The model files the runtime opens: ``[model.onnx]``, or an ORT-format artifact's generator and
    compute files (after checking its ``ort`` entry; ``ArtifactError`` naming the field)."""

    def bad(field, why):
        raise ArtifactError(f"{path}: {field} {why}")

    kind = manifest.get("model_format", "onnx")
    if kind not in MODEL_FORMATS:
        bad("model_format", f"{kind!r} is not one of {', '.join(MODEL_FORMATS)}")
    if kind == "onnx":
        return [MODEL]
    if kind == "web":
        entry = manifest.get("web")
        model = entry.get("model") if isinstance(entry, dict) else None
        if not (isinstance(model, str) and model.startswith(WEB_DIR + "/") and model.count("/") == 1):
            bad("web", f"must name its graph as {WEB_DIR}/<file>")
        return [model]
    if manifest.get("format_version") != ORT_FORMAT_VERSION:
        bad(
            "format_version",
            f"{manifest.get('format_version')!r}: an ORT-format artifact is version {ORT_FORMAT_VERSION}",
        )
    entry = manifest.get("ort")
    if not (
        isinstance(entry, dict)
        and all(isinstance(entry.get(k), str) for k in ("generator", "compute"))
        and _is_int(entry.get("compute_bytes"))
        and isinstance(entry.get("holes"), list)
        and _is_sha256(entry.get("compute_sha256"))
    ):
        bad("ort", "must name its generator and compute files, compute_bytes, compute_sha256 and the holes")
    end = 0
    for hole in entry["holes"]:
        if not (
            isinstance(hole, dict)
            and isinstance(hole.get("output"), str)
            and _is_int(hole.get("offset"), end)
            and _is_int(hole.get("bytes"), 1)
            and hole["offset"] + hole["bytes"] <= entry["compute_bytes"]
        ):
            bad(
                "ort", "holes must be {output, offset, bytes} in increasing, non-overlapping order inside compute_bytes"
            )
        end = hole["offset"] + hole["bytes"]
    return [entry["generator"], entry["compute"]]


def model_config(root: Path) -> dict:
    """The artifact's ``config.json`` (``{}`` when missing or malformed: it only cross-checks the manifest and
    says what the graph cannot, e.g. ``type_vocab_size``)."""
    try:  # bounded and non-blocking: listed in the manifest, a damaged one is refused by its checksum anyway
        config = read_json(root / "config.json", "the model's config")
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def check_fits_model(manifest: dict, root: Path, input_names: list[str]) -> None:
    """Manifest fields that must fit the model, checked at load (``ArtifactError`` naming the field): ``max_length``
    within ``config.json``'s ``max_position_embeddings``; ``max_depth`` only with a ``depth`` input and within
    ``num_hidden_layers``. Otherwise every request would fail inside ONNX Runtime."""
    path = root / MANIFEST
    config = model_config(root)
    positions, layers = config.get("max_position_embeddings"), config.get("num_hidden_layers")
    if _is_int(positions, 1) and manifest["max_length"] > positions:
        raise ArtifactError(
            f"{path}: max_length {manifest['max_length']} exceeds the model's {positions} positions "
            f"(config.json max_position_embeddings)"
        )
    max_depth = manifest.get("max_depth")
    if max_depth and DEPTH not in input_names:
        raise ArtifactError(f"{path}: max_depth {max_depth}, but the model has no {DEPTH!r} input")
    if max_depth and _is_int(layers, 1) and max_depth > layers:
        raise ArtifactError(
            f"{path}: max_depth {max_depth} exceeds the model's {layers} layers (config.json num_hidden_layers)"
        )


def assemble_ort(part: bytes, entry: dict, values: dict, name: str = ORT_COMPUTE) -> bytes:
    """The ORT-format compute model: ``part`` (the stored file) with each hole of ``entry["holes"]``
    filled by the bytes of ``values[hole["output"]]`` (a numpy array from the generator).
    ``ArtifactError`` naming ``name`` when a value is missing or its size differs from the hole's."""
    holes = entry["holes"]
    if len(part) + sum(h["bytes"] for h in holes) != entry["compute_bytes"]:
        raise ArtifactError(f"{name} has {len(part)} bytes; with its holes it should make {entry['compute_bytes']}")
    out = bytearray(entry["compute_bytes"])
    read = write = 0
    for hole in holes:
        value = values.get(hole["output"])
        if value is None or value.nbytes != hole["bytes"]:
            raise ArtifactError(
                f"{name}: the generator's output {hole['output']!r} does not fill its hole of "
                f"{hole['bytes']} bytes (got {None if value is None else value.nbytes})"
            )
        gap = hole["offset"] - write
        out[write : hole["offset"]] = part[read : read + gap]
        read += gap
        out[hole["offset"] : hole["offset"] + hole["bytes"]] = (
            np.ascontiguousarray(value).view(np.uint8).reshape(-1).data
        )
        write = hole["offset"] + hole["bytes"]
    out[write:] = part[read:]
    return bytes(out)


def open_ort_format(
    folder: Path, entry: dict, options: ort.SessionOptions, providers: list[str], generator_options: ort.SessionOptions
) -> ort.InferenceSession:
    """The compute session of an ORT-format artifact in ``folder`` (its manifest's ``ort`` ``entry``): the
    generator run once, its outputs written into the compute file's holes, the result opened with
    ``options``. ``ArtifactError`` naming the file ONNX Runtime cannot load."""
    from .errors import first_line

    def opened(model, label, so, providers):
        try:
            return ort.InferenceSession(model, so, providers=providers)
        except Exception as e:  # ORT's own error classes derive from Exception only
            raise ArtifactError(f"{label} cannot be loaded by ONNX Runtime: {first_line(e)}") from None

    path = folder / entry["generator"]
    generator = opened(str(path), path, generator_options, ["CPUExecutionProvider"])
    names = [o.name for o in generator.get_outputs()]
    values = dict(zip(names, generator.run(names, {})))
    del generator
    path = folder / entry["compute"]
    blob = assemble_ort(path.read_bytes(), entry, values, str(path))
    del values
    if hashlib.sha256(blob).hexdigest() != entry["compute_sha256"]:
        raise ArtifactError(
            f"{path} with its holes filled does not match ort.compute_sha256 in the manifest "
            f"(holes or generator outputs altered)"
        )
    return opened(blob, f"{path} (with its holes filled)", options, providers)


def _ram_int8_files(ram, bad) -> list[str]:
    """The RAM-int8 entry's files, after checking its fields: per weight the int8/scale input names, the layout,
    the shape ``[K, N]`` and its source, an ``output`` of the entry's ``generator`` graph (or of the weight's
    own ``generator``) or an ``offset`` into the product ``rows`` (``height x width``) that must hold it."""
    if not isinstance(ram, dict) or not isinstance(ram.get("weights"), list) or not isinstance(ram.get("compute"), str):
        bad("ram_int8", "must name its compute file and list its weights")
    rows = ram.get("rows")
    if rows is not None and not (
        isinstance(rows, str) and _is_int(ram.get("width"), 1) and _is_int(ram.get("height"), 1)
    ):
        bad("ram_int8", "rows needs a file name, and width and height as positive integers")
    for w in ram["weights"]:
        _check_ram_int8_weight(w, ram, bad)
    _check_ram_int8_unique(ram, bad)
    graphs = [w["generator"] for w in ram["weights"] if "offset" not in w and "generator" in w]
    return [ram[k] for k in ("generator", "rows", "compute") if isinstance(ram.get(k), str)] + sorted(set(graphs))


def _check_ram_int8_weight(w, ram: dict, bad) -> None:
    """One entry of the RAM-int8 ``weights``: its names, layout and shape, and where its values come from."""
    if not isinstance(w, dict):
        bad("ram_int8", f"weights must be objects, got {w!r}")
    shape = w.get("shape")
    if not (
        all(isinstance(w.get(k), str) for k in ("int8", "scale"))
        and w.get("layout") in ("kn", "nk")
        and isinstance(shape, list)
        and len(shape) == 2
        and all(_is_int(x, 1) for x in shape)
    ):
        bad("ram_int8", "weights must list {int8, scale, layout kn|nk, shape [K, N]}")
    if "offset" in w:
        if not (
            ram.get("rows")
            and _is_int(w["offset"])
            and w["offset"] + shape[0] * shape[1] <= ram["width"] * ram["height"]
        ):
            bad("ram_int8", f"weight {w['int8']!r}: offset {w['offset']!r} does not lie in the rows product")
    elif not (isinstance(w.get("output"), str) and isinstance(w.get("generator", ram.get("generator")), str)):
        bad("ram_int8", f"weight {w['int8']!r} names neither a rows offset nor a generator output")


def _check_ram_int8_unique(ram: dict, bad) -> None:
    """One record per compute input and per generated value: no two weights share an ``int8`` or ``scale`` name, a
    generator output, or rows of the product (the second record would overwrite or reuse the first's values)."""
    names = [w[k] for w in ram["weights"] for k in ("int8", "scale")]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        bad("ram_int8", f"weights name the compute input {twice[0]!r} twice")
    outputs = [(w.get("generator", ram.get("generator")), w["output"]) for w in ram["weights"] if "offset" not in w]
    twice = sorted({o for o in outputs if outputs.count(o) > 1})
    if twice:
        bad("ram_int8", f"two weight records take the generator output {twice[0][1]!r}")
    spans = sorted(
        (w["offset"], w["offset"] + w["shape"][0] * w["shape"][1], w["int8"]) for w in ram["weights"] if "offset" in w
    )
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            bad("ram_int8", f"weights {first!r} and {second!r} take overlapping rows of the product")


def weights_record(weights: list) -> str:
    """The ram_int8 weight records as the compute graph's :data:`RAM_INT8_RECORD` holds them (canonical JSON)."""
    import json

    return json.dumps(weights, sort_keys=True, separators=(",", ":"))


def check_ram_int8_record(session: ort.InferenceSession, ram: dict, path: Path) -> None:
    """The manifest's ram_int8 weights are those recorded in the (hashed) compute graph; ``ArtifactError`` naming the
    field otherwise. A compute graph without the record (exported before it existed) is read on the shape checks
    alone, which tell every layout but a square generated weight's: with one of those it is refused, naming the
    re-export (``ram='fp32'`` reads it meanwhile). A check of its answers against the stored reference would catch a
    wrong orientation too, but only after a whole load and a run, and a user who asked for int8 would get an
    artifact refused or not depending on how far that orientation moves its answers."""
    recorded = session.get_modelmeta().custom_metadata_map.get(RAM_INT8_RECORD)
    if recorded is None:
        square = next((w for w in ram["weights"] if "offset" not in w and w["shape"][0] == w["shape"][1]), None)
        if square is not None:
            raise ArtifactError(
                f"{path}: ram_int8 weight {square['int8']!r} is square ({square['shape'][0]} x {square['shape'][1]}) "
                f"and {ram['compute']} holds no record of its layout (exported before sharebert recorded it), so "
                "which way it is stored cannot be checked: export the model again, or use ram='fp32'"
            )
        return
    if recorded is not None and recorded != weights_record(ram["weights"]):
        raise ArtifactError(
            f"{path}: ram_int8 weights differ from the record in {ram['compute']} (the manifest was edited: a "
            "layout, shape, offset or output); export the model again"
        )


def check_generated_shape(w: dict, shape, path: Path) -> None:
    """A generator output's declared ``shape`` fits weight record ``w``: ``[K, N]`` for layout kn, ``[N, K]`` for
    nk (a square weight's layout is vouched for by :func:`check_ram_int8_record`)."""
    expected = w["shape"] if w["layout"] == "kn" else w["shape"][::-1]
    if shape is None:
        raise ArtifactError(f"{path}: ram_int8 weight {w['int8']!r}: its generator has no output {w['output']!r}")
    if any(isinstance(d, int) and d != e for d, e in zip(shape, expected)) or len(shape) != 2:
        raise ArtifactError(
            f"{path}: ram_int8 weight {w['int8']!r}: layout {w['layout']} with shape {w['shape']} does not match "
            f"its generator output {w['output']!r} of shape {shape}"
        )


def _check_file(root: Path, name: str, meta: dict, path: Path) -> None:
    """``name`` lies inside ``root`` (no ``..``, no link leading out) with the listed size and sha256."""
    file = root / name
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ArtifactError(f"{path} lists a file outside the artifact: {name}")
    if not file.resolve().is_relative_to(root.resolve()):
        raise ArtifactError(f"{file} leads outside the artifact folder (a link to {file.resolve()})")
    try:
        size = regular_file(file)
    except FileNotFoundError:
        raise ArtifactError(f"{file} is missing") from None
    except ValueError as e:  # a FIFO, device or folder under a listed name: refused before anything is read
        raise ArtifactError(str(e)) from None
    if size != meta["bytes"]:
        raise ArtifactError(f"{file} has {size} bytes, the manifest says {meta['bytes']} (truncated or replaced)")
    if sha256(file) != meta["sha256"]:
        raise ArtifactError(f"{file} does not match its sha256 in the manifest (modified or corrupted)")


def verify_artifact(artifact_dir: str | Path, manifest_sha256: str | None = None) -> dict:
    """Check ``manifest.json`` field by field and the size and sha256 of every file it lists; return it.

    ``manifest_sha256``: pin the artifact: the manifest file's own sha256 must equal it (the manifest's
    checksums then vouch for every other file). Raises :class:`ArtifactError` naming the first bad
    field or the missing, truncated, modified or outside file.
    """
    root = Path(artifact_dir)
    if not root.is_dir():
        raise ArtifactError(
            f"{root} is a file, not an artifact folder"
            if root.exists()
            else symlink_loop(root) or f"artifact folder not found: {root}"
        )
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise ArtifactError(f"{path} is missing: not a sharebert artifact (write one with `sharebert export`)")
    if not path.resolve().is_relative_to(root.resolve()):
        raise ArtifactError(f"{path} leads outside the artifact folder (a link to {path.resolve()})")
    try:
        data = read_bytes(path, "the artifact's manifest", JSON_BYTES)
    except (OSError, ValueError) as e:  # a FIFO, device, folder or huge file named manifest.json
        raise ArtifactError(str(e)) from None
    if manifest_sha256 is not None:
        pin = str(manifest_sha256).strip().lower()
        if not (len(pin) == 64 and set(pin) <= _HEX):
            raise ValueError(f"the pinned manifest sha256 must be 64 hexadecimal digits, got {manifest_sha256!r}")
        if hashlib.sha256(data).hexdigest() != pin:
            raise ArtifactError(f"{path} does not match the pinned sha256 {pin} (a different or rewritten artifact)")
    try:
        manifest = parse_json(data, str(path))
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    _check_fields(manifest, path)
    for name, meta in manifest["files"].items():
        _check_file(root, name, meta, path)
    return manifest


def quantize_per_channel(weight: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output channel in ``[-INT8_WEIGHT_MAX, INT8_WEIGHT_MAX]``: ``(K, N)`` int8 and ``(N,)``
    scales, ``B ~ q * scale``.

    ``weight`` is ``(K, N)`` (``layout="kn"``, a MatMul's B) or ``(N, K)`` (``"nk"``, a Gemm's B with
    transB); it is overwritten (divided by the scales) to keep one fp32 copy in memory.
    """
    if layout == "nk":
        weight = weight.T
    scale = np.maximum(weight.max(axis=0), -weight.min(axis=0)) / INT8_WEIGHT_MAX  # max |w| without a copy of |w|
    if not np.isfinite(scale).all():  # NaN/inf propagate through max and min
        raise ArtifactError("a generated weight is not finite (NaN or inf): the artifact's learned tensors are corrupt")
    scale[scale == 0] = 1.0
    np.divide(weight, scale, out=weight)
    np.rint(weight, out=weight)
    return np.ascontiguousarray(weight.astype(np.int8)), scale.astype(np.float32)


def quantize_rows(rows, width: int, offset: int, shape: list[int], out=None, chunk_rows: int = ROWS_PER_CALL):
    """Int8 ``(K, N)`` and scales ``(N,)`` of a generated weight cut from a row-major product, a few rows at a time.

    ``rows(start, end)`` returns rows ``[start, end)`` of the product ``(R, width)``; the weight's output
    channels (``N`` of ``shape = [K, N]``) are consecutive runs of ``K`` numbers from ``offset`` in the
    flattened product. Each call spans at most about ``chunk_rows`` rows and holds whole channels, so
    the result equals :func:`quantize_per_channel` of the whole weight while no more than one chunk (and its
    copy, which is quantized in place) is ever in fp32. ``out``: the ``(q, scale)`` arrays to fill (allocated
    beforehand, they keep the heap compact).
    """
    K, N = shape
    q, scale = out or (np.empty((K, N), dtype=np.int8), np.empty(N, dtype=np.float32))
    step = max(1, chunk_rows * width // K)  # channels per call
    for c0 in range(0, N, step):
        c1 = min(N, c0 + step)
        lo, hi = offset + c0 * K, offset + c1 * K
        first, last = lo // width, -(-hi // width)
        block = rows(first, last).reshape(-1)[lo - first * width : hi - first * width].reshape(c1 - c0, K)
        q[:, c0:c1], scale[c0:c1] = quantize_per_channel(block.copy(), "nk")  # rows() may keep its buffer
    return q, scale


def product_rows(session: ort.InferenceSession, width: int, height: int):
    """``rows(start, end)`` of the RAM-int8 rows graph's product ``(height, width)``, for :func:`quantize_rows`.

    ORT writes into one buffer of at most ``ROWS_PER_CALL + 1`` rows (what one call of ``quantize_rows`` asks for),
    filled as far as it reaches and kept: the next weight's rows, when they lie in it, cost no run (a small student's
    whole product is made once). Callers must not write into the view returned. A rows graph that takes ``cols.start`` /
    ``cols.end`` is run ``COLUMNS_PER_CALL`` columns at a time, so its int8 source is dequantized a slice at a time; one
    written before that, whole rows at a time.
    """
    by_columns = "cols.start" in {i.name for i in session.get_inputs()}
    corner = {
        "rows.start": [height - 1],
        "rows.end": [height + 1],
        **({"cols.start": [width - 1], "cols.end": [width + 1]} if by_columns else {}),
    }
    made = session.run(["rows"], {k: np.array(v, np.int64) for k, v in corner.items()})[0].shape  # ORT clamps ends
    if made != (1, 1 if by_columns else width):  # checked here, so no run below can fail on a shape
        raise ValueError(f"the rows graph's product is not {height} x {width}")
    step = min(width, COLUMNS_PER_CALL) if by_columns else width
    most = min(height, ROWS_PER_CALL + 1)
    buffer = np.empty((most, width), np.float32)
    part = np.empty(most * step, np.float32) if step < width else None  # a slice of columns, before its copy
    binding = session.io_binding()
    held = [0, 0]  # the rows [lo, hi) in buffer

    def fill(lo, hi):
        block = buffer[: hi - lo]
        binding.bind_cpu_input("rows.start", np.array([lo], np.int64))
        binding.bind_cpu_input("rows.end", np.array([hi], np.int64))
        for c0 in range(0, width, step):
            c1 = min(width, c0 + step)
            out = block if part is None else part[: block.shape[0] * (c1 - c0)].reshape(block.shape[0], c1 - c0)
            if by_columns:
                binding.bind_cpu_input("cols.start", np.array([c0], np.int64))
                binding.bind_cpu_input("cols.end", np.array([c1], np.int64))
            binding.bind_output("rows", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
            session.run_with_iobinding(binding)
            give_back()  # the run's freed fp32 slice: glibc would keep it (and the next one beside it) otherwise
            if out is not block:
                block[:, c0:c1] = out
        held[:] = lo, hi

    def rows(start, end):
        if not 0 <= start < end <= height or end - start > most:
            raise ValueError(f"rows {start}:{end} of a product of {height} rows, made {most} at a time")
        if not (held[0] <= start and end <= held[1]):
            lo = max(0, min(start, height - most))  # as many rows as the buffer holds, from start or before it
            fill(lo, lo + most)
        return buffer[start - held[0] : end - held[0]]

    return rows


def depth_limit(manifest: dict, where) -> int:
    """The encoder layers an artifact's ``depth`` input may run (``max_depth``); ``ValueError`` saying why
    ``where`` has no depth input (the manifest's ``depth_note``) when it has none."""
    if not manifest.get("max_depth"):
        why = manifest.get("depth_note") or "a one-layer model, or exported before depth support: export it again"
        raise ValueError(f"{where} has no depth input ({why})")
    return manifest["max_depth"]


def is_artifact(folder: str | Path) -> bool:
    """Whether ``folder`` holds a manifest of this format (a quick test, not a verification)."""
    try:
        manifest = read_json(Path(folder) / MANIFEST, "the artifact's manifest")
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def session_options(
    session_config: dict | None = None,
    threads: int | None = None,
    level=None,
    optimized: str | Path | None = None,
    arena: bool = True,
) -> ort.SessionOptions:
    """``onnxruntime.SessionOptions`` as every sharebert session builds them.

    ``session_config``: the manifest's entries (``session.disable_quant_qdq`` for int8-stored weights);
    ``threads``: intra-op threads (inter-op 1); ``level``: a ``GraphOptimizationLevel`` (default ORT's);
    ``optimized``: where to write the optimized graph; ``arena=False`` gives freed activations back to
    the system instead of keeping them in ORT's CPU arena.
    """
    so = ort.SessionOptions()
    so.log_severity_level = 3  # folding leaves stored int8 tensors unused: ORT would warn once per tensor
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if level is not None:
        so.graph_optimization_level = level
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    so.enable_cpu_mem_arena = arena
    for key, value in (session_config or {}).items():
        so.add_session_config_entry(str(key), str(value))
    return so


def model_feeds(inputs, input_ids: np.ndarray, attention_mask: np.ndarray, past: dict | None = None) -> dict:
    """Feeds for an exported graph's ``inputs`` (``session.get_inputs()``) from token ids ``(B, T)`` and the
    attention mask ``(B, S)`` over past and new tokens: ``token_type_ids`` zeros, ``position_ids`` counted
    over the mask (so left padding does not shift them), and a causal LM's ``past_key_values.{i}.key|value``
    from ``past`` (``{input name: (B, heads, S - T, head_dim)}``) or empty ones for a first step."""
    B, T = input_ids.shape
    feeds = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": np.zeros_like(input_ids),
        "position_ids": np.maximum(attention_mask.cumsum(-1) - 1, 0)[:, -T:],
    }
    for i in inputs:
        if i.name.startswith(PAST):
            feeds[i.name] = past[i.name] if past else np.zeros((B, i.shape[1], 0, i.shape[3]), np.float32)
    return {i.name: feeds[i.name] for i in inputs if i.name in feeds}
