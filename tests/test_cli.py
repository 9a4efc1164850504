"""Every subcommand's --help renders (argparse %-formats help strings, so a stray % breaks it)."""
from __future__ import annotations

import pytest

from sharebert.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_renders(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert f"usage: sharebert {name}" in capsys.readouterr().out


def test_no_command_prints_usage_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_overview_shows_every_command_with_its_line_and_the_version(capsys):
    import importlib

    from sharebert import __version__
    from sharebert.cli import COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, module in COMMANDS.items():
        assert f"{name} {' '.join(importlib.import_module(module).HELP.split())}" in text
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"sharebert {__version__}"
