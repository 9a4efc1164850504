"""ORT-format artifacts (``sharebert export --format ort``): for ONNX Runtime mobile and minimal builds.

ORT's own converter (``python -m onnxruntime.tools.convert_onnx_models_to_ort``) folds constants ahead
of time, so its ``.ort`` stores every generated weight; and an unoptimised ``.ort`` is never folded at
load (docs/DEVICE.md), so it would recompute them on every run. An ORT-format file has no external
data, and a weight fed as a graph input is not prepacked (about 2x slower at 1x16). So the model is
cut in two (``graph.split_at_constants``), from the flat ``model.onnx`` (``depth.inline_layers``):

* ``model.generator.ort``: the constant part, no inputs; outputs the learned tensors the model reads
  and every generated weight (saved unoptimised: folding would store its outputs). Run once at load.
* ``model.compute.ort.part``: the rest, with those tensors as initializers (so ORT prepacks them),
  saved optimised as ORT format, gated by ``depth`` again (``depth.wrap_layers``), then stored
  *without* the bytes of those initializers: the manifest's ``ort.holes`` say where each one goes.
  The runtime writes the generator's outputs into the holes and opens the bytes as an ORT model.

So the learned tensors are on disk once (in the generator) and the generated weights are computed
once per load. ``required_operators.config`` (ORT's own writer, from both ORT files as saved) lists
the operators a reduced-operator build needs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from sharebert_runtime.artifact import (
    MODEL,
    ORT_COMPUTE,
    ORT_GENERATOR,
    REQUIRED_OPERATORS,
    ArtifactError,
    assemble_ort,
    open_ort_format,
    session_options,
)

from .depth import inline_layers, is_wrapped, wrap_layers
from .graph import split_at_constants

MIN_HOLE_BYTES = 1024  # smaller tensors stay in the compute file (the hole table would cost more)


def save_ort(model, path: Path, level, scratch: Path) -> None:
    """Save the ``onnx.ModelProto`` ``model`` as an ORT-format file at optimization ``level``, with ORT's
    own writer (a session with ``session.save_model_format=ORT``, as ``convert_onnx_models_to_ort``)."""
    import onnx
    import onnxruntime as ort

    source = scratch / (path.name + ".onnx")
    onnx.save(model, str(source))
    so = session_options(level=level, optimized=path)
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])
    source.unlink()


def write_required_operators(models: list[Path], out: Path) -> None:
    """``out``: the operators (``domain;opset;Op,...``) of the ORT-format ``models``, by
    ``onnxruntime.tools.ort_format_model.create_config_from_models`` (the converter's writer); the
    comment lines name the artifact's files, not the scratch paths."""
    import logging

    from onnxruntime.tools.ort_format_model import create_config_from_models

    logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # no "Created config in <scratch>" line
    create_config_from_models(models, out, enable_type_reduction=False)
    lines = out.read_text().splitlines()
    body = [line for line in lines if not line.startswith("#")]
    out.write_text(
        "# Operators of this artifact's ORT-format graphs (model.generator.ort, model.compute.ort.part\n"
        "# once its holes are filled), for an ONNX Runtime build with --include_ops_by_config\n"
        + "\n".join(body)
        + "\n"
    )


def parse_required_operators(path: Path) -> dict[str, set[str]]:
    """``{domain: {op, ...}}`` from a ``required_operators.config`` (ORT's own parser)."""
    from onnxruntime.tools.reduced_build_config_parser import parse_config

    required, _ = parse_config(str(path))
    return {domain: set().union(*opsets.values()) for domain, opsets in required.items()}


def build_ort_format(out_dir: str | Path, scratch: str | Path) -> dict:
    """Write the ORT-format graphs and ``required_operators.config`` into ``out_dir`` from its ``model.onnx``
    (compact, fp32 or weight-only quantized); return the manifest's ``ort`` entry. ``model.onnx`` is left
    for the caller to check against and remove."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    out_dir, scratch = Path(out_dir), Path(scratch)
    source = onnx.load(str(out_dir / MODEL))
    wrapped = is_wrapped(source.graph)
    inline_layers(source)
    generator, compute, names = split_at_constants(source)
    del source
    gen_path = out_dir / ORT_GENERATOR
    save_ort(generator, gen_path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, scratch)
    del generator
    session = ort.InferenceSession(
        str(gen_path),
        session_options(level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        providers=["CPUExecutionProvider"],
    )
    values = dict(zip(names, session.run(names, {})))
    del session

    c = compute.graph
    keep = [i for i in c.input if i.name not in values]
    del c.input[:]
    c.input.extend(keep)
    c.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(values[n]), n) for n in names)
    if wrapped:
        wrap_layers(compute)
    full = scratch / "model.compute.ort"
    # Extended, not all: the layout level bakes in this CPU's kernels (NCHWc), as ORT's converter avoids.
    save_ort(compute, full, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, scratch)
    del compute
    write_required_operators([gen_path, full], out_dir / REQUIRED_OPERATORS)

    blob = full.read_bytes()
    holes, end = [], 0
    for name in sorted(names, key=lambda n: -values[n].nbytes):
        raw = np.ascontiguousarray(values[name]).tobytes()
        if len(raw) < MIN_HOLE_BYTES:
            continue
        offset = blob.find(raw)
        if offset >= 0:
            holes.append({"output": name, "offset": offset, "bytes": len(raw)})
    holes.sort(key=lambda h: h["offset"])
    kept = []
    for hole in holes:  # equal tensors are found at one place: keep the first of overlapping holes
        if hole["offset"] >= end:
            kept.append(hole)
            end = hole["offset"] + hole["bytes"]
    parts, start = [], 0
    for hole in kept:
        parts.append(blob[start : hole["offset"]])
        start = hole["offset"] + hole["bytes"]
    parts.append(blob[start:])
    part = b"".join(parts)
    (out_dir / ORT_COMPUTE).write_bytes(part)
    entry = {
        "generator": ORT_GENERATOR,
        "compute": ORT_COMPUTE,
        "compute_bytes": len(blob),
        "compute_sha256": hashlib.sha256(blob).hexdigest(),
        "holes": kept,
        "required_operators": REQUIRED_OPERATORS,
        "stored_in_compute": int(len(part)),
        "filled_at_load": int(sum(h["bytes"] for h in kept)),
    }
    if assemble_ort(part, entry, values) != blob:
        raise ArtifactError(f"{ORT_COMPUTE}: the filled compute graph differs from the one ONNX Runtime wrote")
    full.unlink()
    return entry


PARITY_SENTENCES = 16
PARITY_TOLERANCE = 1e-5


def to_ort_format(out_dir: Path, session_config: dict, tokenizer, sentences: list[str], max_length: int) -> dict:
    """Turn the checked ONNX artifact being written in ``out_dir`` into an ORT-format one: write the
    ORT graphs, check that they give the ONNX graph's outputs (within ``PARITY_TOLERANCE``, finite) on the
    first sentences, opened as the runtime opens them, then remove ``model.onnx``. Returns the ``ort`` entry."""
    import shutil
    import tempfile

    import numpy as np
    import onnxruntime as ort

    from sharebert_runtime.artifact import model_feeds

    from .parity import encode

    scratch = Path(tempfile.mkdtemp(dir=out_dir))
    try:
        entry = build_ort_format(out_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reference = ort.InferenceSession(
        str(out_dir / MODEL), session_options(session_config), providers=["CPUExecutionProvider"]
    )
    compute = open_ort_format(
        out_dir,
        entry,
        session_options(session_config),
        ["CPUExecutionProvider"],
        session_options(session_config, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    )
    worst = 0.0
    for start in range(0, min(len(sentences), PARITY_SENTENCES), 4):
        batch = encode(tokenizer, sentences[start : start + 4], max_length)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        want = reference.run(None, model_feeds(reference.get_inputs(), ids, mask))
        got = compute.run(None, model_feeds(compute.get_inputs(), ids, mask))
        for a, b in zip(want, got):
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            if not (np.isfinite(b).all() and diff <= PARITY_TOLERANCE):
                raise ArtifactError(
                    f"the ORT-format graphs differ from model.onnx by {diff:.3g} "
                    f"(> {PARITY_TOLERANCE}) or are not finite"
                )
            worst = max(worst, diff)
    del reference, compute
    (out_dir / MODEL).unlink()
    entry["parity_vs_onnx"] = {"sentences": min(len(sentences), PARITY_SENTENCES), "max_abs_diff": worst}
    entry["model_bytes"] = sum((out_dir / entry[k]).stat().st_size for k in ("generator", "compute"))
    return entry
