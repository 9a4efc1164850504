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
