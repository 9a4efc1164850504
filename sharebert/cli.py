"""The ``sharebert`` command line. Each subcommand lives in its own module and is imported only
when run, so ``sharebert predict`` and ``sharebert serve`` work without torch.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "build": "sharebert.commands.build",
    "report": "sharebert.commands.report",
    "budget": "sharebert.commands.budget",
    "prepare": "sharebert.commands.prepare",
    "pretrain": "sharebert.commands.pretrain",
    "finetune": "sharebert.commands.finetune",
    "evaluate": "sharebert.commands.evaluate",
    "export": "sharebert.commands.export",
    "predict": "sharebert.deploy.cli",
    "serve": "sharebert.deploy.serve",
    "demo": "sharebert.commands.demo",
}


def _load(name: str):
    return importlib.import_module(COMMANDS[name])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="sharebert", description="Build, train, export and run tiny BERT-class models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen command's module is imported (the others may need torch).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name in COMMANDS:
        if name == chosen:
            module = _load(name)
            p = sub.add_parser(name, help=module.HELP, description=module.HELP)
            module.add_arguments(p)
        else:
            sub.add_parser(name, help=f"see `sharebert {name} --help`", add_help=False)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(_load(args.command).run(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"sharebert {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"sharebert {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
