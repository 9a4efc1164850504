"""``optimum-cli export onnx`` on a sharebert folder: the checks ``sharebert export`` makes, before optimum runs.

The optimum-register hook (``optimum/commands/register/sharebert.py``) calls :func:`preflight` with the
command line. What we can name is refused in one line with exit 2, instead of optimum's tracebacks: a
missing, damaged or empty model folder, an exported artifact given as the model, a task sharebert has no
ONNX config for, an output that is a file (or lies under one), and a task whose head the folder holds no
trained weights for (``--task text-classification`` of a masked-LM folder would export a random head;
:func:`sharebert.export.exporter.load_model` is the one check). Folders of other model types, hub names
and ``--task auto`` are left to optimum.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sharebert.formats.model_folder import read_config
from sharebert_runtime.errors import first_line
from sharebert_runtime.untrusted import read_json


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # optimum reports its own usage errors
        raise LookupError(message)


def _local(name: str) -> bool:
    """Whether ``--model`` names a path on this machine rather than a hub id (``org/name``)."""
    path = Path(name).expanduser()
    return (
        path.exists()
        or name.startswith((".", "/", "~"))
        or len(path.parts) > 2
        or path.parent.is_dir()
        and str(path.parent) != "."
    )


def check_export_onnx(argv: list[str]) -> None:
    """``ValueError`` / ``FileNotFoundError`` naming what is wrong with ``optimum-cli export onnx ARGV`` for a sharebert
    folder; returns quietly for what optimum should decide."""
    from optimum.commands.export.onnx import parse_args_onnx

    from .onnx_config import OPTIMUM_TASKS

    parser = _Parser(add_help=False)
    parse_args_onnx(parser)
    try:
        args, _ = parser.parse_known_args(argv)
    except LookupError:
        return
    if not _local(args.model):
        return
    model = Path(args.model).expanduser()
    try:
        raw = read_json(
            model / "config.json", "the model's config"
        )  # bounded, never blocks (sharebert_runtime.untrusted)
        if isinstance(raw, dict) and raw.get("model_type") != "sharebert":
            return  # another library's folder (BERT included): optimum's own export
    except (OSError, ValueError):
        pass  # missing, unreadable or damaged: read_config names it
    read_config(model)  # a missing folder, a file, an artifact, a damaged config.json: one line naming it
    out = Path(args.output)
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise ValueError(f"output {out}: {p} is a file, not a folder")
            break
    if args.task == "auto":
        return
    ours = {optimum: task for task, optimum in OPTIMUM_TASKS.items()} | {"text-generation": "causal-lm"}
    if args.task not in ours:
        raise ValueError(f"--task {args.task}: sharebert exports {', '.join(sorted(ours))} (or auto)")
    from .exporter import load_model

    load_model(model, ours[args.task])  # refuses a head the folder holds no trained weights for


def preflight(argv: list[str]) -> None:
    """:func:`check_export_onnx`; on an error, one line on stderr and exit 2 (no traceback)."""
    try:
        check_export_onnx(argv)
    except (ValueError, OSError) as e:
        print(f"optimum-cli export onnx: error: {first_line(e, 400)}", file=sys.stderr)
        sys.exit(2)
