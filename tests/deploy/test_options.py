"""Command-line option types (sharebert_runtime.options) as the commands use them."""

from __future__ import annotations

import pytest

from sharebert_runtime.main import main


@pytest.mark.parametrize("command", ["compress", "pretrain", "distill"])
@pytest.mark.parametrize("seconds", ["1e308", "31700000"])
def test_max_time_beyond_a_year_is_refused_in_one_line(command, seconds, tmp_path, capsys):
    """``--max-time 1e308`` passed the finite check, and compress's plan line printed figures of 300 digits."""
    argv = {
        "compress": ["compress", str(tmp_path / "teacher")],
        "pretrain": ["pretrain", "--preset", "sharebert-tiny"],
        "distill": ["distill", "--teacher", "t", "--student", "s"],
    }[command] + ["--out", str(tmp_path / "o"), "--max-time", seconds]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "argument --max-time: must be at most" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
