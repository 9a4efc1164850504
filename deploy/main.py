"""The ``sharebert`` command line (console script and ``python -m sharebert_runtime``), torch-free.

:data:`COMMANDS` is the one list of commands: each name's module and one-line help. Only the chosen
command's module is imported: the device commands (``predict``, ``serve``) live in this package and
never import torch; a library command's module lives in ``sharebert.commands``, and importing it runs
``import sharebert``, which on a workstation registers with transformers (torch loads), except in this
program's own process (:data:`PROGRAM`): there the registration comes just before a command runs, and not
at all for the :data:`ARITHMETIC` ones. So ``sharebert --help``, ``--version``, every command's ``--help``
and usage errors, ``report`` and ``budget`` import no torch.

A command module defines ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import first_line
from .outdir import check_torchrun, disk_full

# name: (module, one-line help). The device commands first: a device install (no extras) holds only them.
COMMANDS = {
    "predict": (
        "sharebert_runtime.cli",
        "answer the task of an exported artifact (fill-mask, classify, embed, generate) without torch",
    ),
    "serve": (
        "sharebert_runtime.serve",
        "serve an exported artifact over local HTTP/JSON (/predict, /health, /metadata) without torch",
    ),
    "verify": (
        "sharebert_runtime.verify",
        "replay an artifact's stored inputs on this CPU: agreement with PyTorch's answers at export, exit 1 below "
        "its parity thresholds",
    ),
    "build": ("sharebert.commands.build", "build a model folder (config, safetensors, tokenizer) from a preset"),
    "report": (
        "sharebert.commands.report",
        "parameter, memory and FLOP report of a preset or model folder (analytic, no model built)",
    ),
    "budget": (
        "sharebert.commands.budget",
        "find ShareBERT / BERT configurations under a parameter, byte, RAM and FLOP budget",
    ),
    "prepare": (
        "sharebert.commands.prepare",
        "tokenize corpora once into a data folder of memory-mapped token shards for `pretrain --data`",
    ),
    "pretrain": (
        "sharebert.commands.pretrain",
        "pre-train a model folder or a preset on text / MediaWiki XML corpora or on a `sharebert prepare` "
        "folder (runs under torchrun too)",
    ),
    "finetune": (
        "sharebert.commands.finetune",
        "fine-tune a pre-trained model on a GLUE task (best dev checkpoint, metrics.json)",
    ),
    "distill": (
        "sharebert.commands.distill",
        "distil a fine-tuned BERT teacher into a ShareBERT student on a GLUE task (best dev student, metrics.json)",
    ),
    "compress": (
        "sharebert.commands.compress",
        "compress a pre-trained encoder (e.g. all-MiniLM-L6-v2) into a small ShareBERT: pick, distil, export, report",
    ),
    "evaluate": ("sharebert.commands.evaluate", "evaluate models: glue | wordsim | analogy | noise | cross-domain"),
    "export": (
        "sharebert.commands.export",
        "Export a model folder to an ONNX artifact (compact or materialized weights, optional quantization).",
    ),
    "plot": (
        "sharebert.commands.plot",
        "draw a pretrain/finetune run's loss and learning-rate curves (curves.png) from its log",
    ),
    "demo": (
        "sharebert.commands.demo",
        "the main job end to end: compress all-MiniLM-L6-v2 where installed (else a tiny pre-train), then search",
    ),
}

# Arithmetic on a config (counts, bytes, FLOPs, budgets): no model built, so no registration with transformers.
ARITHMETIC = ("report", "budget")

# Set by main when it runs as the program (console script, python -m sharebert_runtime: no argv given), read by
# sharebert/__init__.py: `import sharebert` then leaves the registration to main. main(argv) called from Python
# (tests, a user's script) changes nothing: there `import sharebert` registers as everywhere else.
PROGRAM = False

# Packages of the extras that a device install (`pip install sharebert`, runtime only) lacks.
EXTRAS = {
    "full": ("torch", "transformers", "onnx", "safetensors", "accelerate", "scipy", "tensorboard"),
    "plot": ("matplotlib",),
    "optimum": ("optimum",),
}


def _missing_extra(e: ModuleNotFoundError) -> str | None:
    top = (e.name or "").split(".")[0]
    return next((extra for extra, packages in EXTRAS.items() if top in packages), None)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors (a bad option value, a missing one) are one line: the message as a
    ``ValueError``, printed by ``main`` like every other bad input (sub-commands' parsers are of this class too).
    No abbreviations: ``--max-step 3`` or ``--resum`` would silently act as ``--max-steps`` or ``--resume``, and a
    flag added later could change what an abbreviation meant in a user's script."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise ValueError(f"{message} (see {self.prog} --help)")


def _parse(argv: list[str], chosen: str | None):
    """The parsed arguments; only ``chosen``'s module is imported (to add its arguments)."""
    parser = _Parser(prog="sharebert", description="Build, train, export and run tiny BERT-class models.")
    parser.add_argument("--version", action="version", version=f"sharebert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, line) in COMMANDS.items():
        if name == chosen:
            p = sub.add_parser(name, help=line, description=line)
            importlib.import_module(module).add_arguments(p)
        else:
            sub.add_parser(name, help=line if chosen is None else None, add_help=False)
    args, extra = parser.parse_known_args(argv)
    if (
        extra and chosen is not None and args.command == chosen
    ):  # options before trailing positionals (`predict ART --depth 2 TEXT`)
        try:
            return parser, p.parse_intermixed_args(argv[argv.index(chosen) + 1 :], argparse.Namespace(command=chosen))
        except TypeError:  # a command with subcommands of its own: argparse cannot intermix those
            return parser, parser.parse_args(argv)
    if extra:  # an unknown option before any command: argparse's own usage error
        parser.parse_args(argv)
    return parser, args


def main(argv: list[str] | None = None) -> int:
    global PROGRAM
    if argv is None:
        PROGRAM = True
        argv = sys.argv[1:]
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = None
    try:
        parser, args = _parse(argv, chosen)
        if args.command is None:
            parser.print_help()
            return 2
        module = COMMANDS[args.command][0]
        if not module.startswith(__package__):  # a library command (the device commands load no hub client)
            if PROGRAM and args.command not in ARITHMETIC:  # what `import sharebert` left to this program
                importlib.import_module("sharebert")._register()
            _quiet_libraries()
            check_torchrun()
        return int(importlib.import_module(module).run(args) or 0)
    except ModuleNotFoundError as e:
        extra = _missing_extra(e)
        if extra is None:
            raise
        print(
            f"sharebert {chosen}: error: needs the {e.name.split('.')[0]} package, which this install lacks: "
            f"pip install 'sharebert[{extra}]' (a device install holds only predict, serve and verify)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / SIGHUP while an output file was written (outdir.Stopped)
        signum = getattr(e, "signum", None)
        print(f"sharebert {chosen}: {e if signum else 'interrupted'}", file=sys.stderr)
        return 128 + (signum or 2)
    except Exception as e:
        if isinstance(e, BrokenPipeError):  # output piped into `head` and the like
            sys.stderr.close()
            return 0
        return _failed(chosen, e, getattr(args, "out", None) or getattr(args, "output", None))


def _quiet_libraries() -> None:
    """No bars of transformers' own (transformers 5 draws one for every model it loads or saves) among a command's
    lines: its progress is its own (``sharebert.formats.bars``). The Trainer's bars are tqdm's, untouched."""
    try:
        from huggingface_hub.utils import disable_progress_bars  # read by transformers when it is imported
    except ImportError:  # a device install without the hub client: nothing draws those bars there
        return
    disable_progress_bars()
    transformers = sys.modules.get("transformers")  # None where blocked (a test's device simulation)
    if transformers is not None:  # imported already (main called from Python)
        transformers.utils.logging.disable_progress_bar()


def _failed(chosen, e: Exception, out) -> int:
    """One ``error:`` line for bad input (``ValueError``, ``OSError``, ``KeyError``) and a full disk (exit 2), one
    ``internal error:`` line for anything else (exit 1)."""
    probe = out if out and os.path.isdir(out) and not isinstance(e, (ValueError, KeyError)) else None
    if disk_full(e, probe):
        where = f" while writing {out}" if out else ""
        print(
            f"sharebert {chosen}: error: no space left on the device (or a file size limit reached){where}: "
            f"{first_line(e, 300)}",
            file=sys.stderr,
        )
        return 2
    if isinstance(e, (ValueError, OSError, KeyError)):  # bad input, a missing or unwritable path
        message = e.args[0] if isinstance(e, KeyError) and e.args else first_line(e, 1000)
        print(f"sharebert {chosen}: error: {message}", file=sys.stderr)
        return 2
    if os.environ.get("SHAREBERT_DEBUG"):  # a bug of ours: one line, the traceback on request
        raise e
    print(
        f"sharebert {chosen}: internal error: {type(e).__name__}: {first_line(e, 1000)} "
        "(set SHAREBERT_DEBUG=1 for the traceback, and please report it)",
        file=sys.stderr,
    )
    return 1
