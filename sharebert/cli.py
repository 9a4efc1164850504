"""The ``sharebert`` command line. Each subcommand lives in its own module and is imported only
when run, so ``sharebert predict`` and ``sharebert serve`` work without torch.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import first_line

COMMANDS = {
    "build": "sharebert.commands.build",
    "report": "sharebert.commands.report",
    "budget": "sharebert.commands.budget",
    "prepare": "sharebert.commands.prepare",
    "pretrain": "sharebert.commands.pretrain",
    "finetune": "sharebert.commands.finetune",
    "distill": "sharebert.commands.distill",
    "compress": "sharebert.commands.compress",
    "evaluate": "sharebert.commands.evaluate",
    "export": "sharebert.commands.export",
    "plot": "sharebert.commands.plot",
    "predict": "sharebert.deploy.cli",
    "serve": "sharebert.deploy.serve",
    "demo": "sharebert.commands.demo",
}


# Packages of the extras that a device install (`pip install sharebert`, runtime only) lacks.
EXTRAS = {"full": ("torch", "transformers", "onnx", "safetensors", "accelerate", "scipy", "tensorboard"),
          "plot": ("matplotlib",), "optimum": ("optimum",)}


def _load(name: str):
    return importlib.import_module(COMMANDS[name])


def _help_line(name: str) -> str:
    try:
        return _load(name).HELP
    except ImportError as e:
        return f"(needs {e.name}: pip install 'sharebert[full]')"


def _missing_extra(e: ModuleNotFoundError) -> str | None:
    top = (e.name or "").split(".")[0]
    return next((extra for extra, packages in EXTRAS.items() if top in packages), None)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors (a bad option value, a missing one) are one line: the message as a
    ``ValueError``, printed by ``main`` like every other bad input (sub-commands' parsers are of this class too)."""

    def error(self, message):
        raise ValueError(f"{message} (see {self.prog} --help)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(prog="sharebert", description="Build, train, export and run tiny BERT-class models.")
    parser.add_argument("--version", action="version", version=f"sharebert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen command's module is imported (the others may need torch); the overview imports all
    # (their module level is light) for their one-line descriptions.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = None
    try:
        for name in COMMANDS:
            if name == chosen:
                module = _load(name)
                p = sub.add_parser(name, help=module.HELP, description=module.HELP)
                module.add_arguments(p)
            else:
                sub.add_parser(name, help=_help_line(name) if chosen is None else None, add_help=False)
        args, extra = parser.parse_known_args(argv)
        if extra and chosen is not None and args.command == chosen:  # options before trailing positionals (`predict ART --depth 2 TEXT`)
            try:
                args = p.parse_intermixed_args(argv[argv.index(chosen) + 1:], argparse.Namespace(command=chosen))
            except TypeError:  # a command with subcommands of its own: argparse cannot intermix those
                args = parser.parse_args(argv)
        elif extra:  # an unknown option before any command: argparse's own usage error
            parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        _quiet_libraries()
        return int(_load(args.command).run(args) or 0)
    except ModuleNotFoundError as e:
        extra = _missing_extra(e)
        if extra is None:
            raise
        print(f"sharebert {chosen}: error: needs the {e.name.split('.')[0]} package, which this install lacks: "
              f"pip install 'sharebert[{extra}]' (a device install holds only predict and serve)", file=sys.stderr)
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
    lines: its progress is its own (``progress.py``). The Trainer's bars are tqdm's, untouched."""
    try:
        from huggingface_hub.utils import disable_progress_bars  # read by transformers when it is imported
    except ImportError:  # a device install without the hub client: nothing draws those bars there
        return
    disable_progress_bars()
    # imported already (sharebert.cli.main called from Python); an entry of None is an import blocked on purpose
    if sys.modules.get("transformers") is not None:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def _failed(chosen, e: Exception, out) -> int:
    """One ``error:`` line for bad input (``ValueError``, ``OSError``, ``KeyError``) and a full disk (exit 2), one
    ``internal error:`` line for anything else (exit 1)."""
    from .outdir import disk_full

    probe = out if out and os.path.isdir(out) and not isinstance(e, (ValueError, KeyError)) else None
    if disk_full(e, probe):
        where = f" while writing {out}" if out else ""
        print(f"sharebert {chosen}: error: no space left on the device (or a file size limit reached){where}: "
              f"{first_line(e, 300)}", file=sys.stderr)
        return 2
    if isinstance(e, (ValueError, OSError, KeyError)):  # bad input, a missing or unwritable path
        message = e.args[0] if isinstance(e, KeyError) and e.args else first_line(e, 1000)
        print(f"sharebert {chosen}: error: {message}", file=sys.stderr)
        return 2
    if os.environ.get("SHAREBERT_DEBUG"):  # a bug of ours: one line, the traceback on request
        raise e
    print(f"sharebert {chosen}: internal error: {type(e).__name__}: {first_line(e, 1000)} "
          "(set SHAREBERT_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
