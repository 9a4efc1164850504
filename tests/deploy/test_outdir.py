"""torchrun's environment as the library reads it (sharebert_runtime.outdir.rank, local_rank, world_size)."""

from __future__ import annotations

import pytest

from sharebert_runtime.outdir import local_rank, rank, world_size

TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 0, 1)),
        ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, (1, 1, 2)),
        # garbage is no torchrun
        ({"RANK": "abc"}, (0, 0, 1)),
        ({"RANK": "-1"}, (0, 0, 1)),
        ({"WORLD_SIZE": "0"}, (0, 0, 1)),
        ({"WORLD_SIZE": "abc", "RANK": "1"}, (0, 0, 1)),
        # a stray RANK (another launcher's, a shell's) in a world of one: the Trainer runs alone and saves, so
        # the run is rank 0's, which writes the marker, the lock and the table (rank 1 left a folder without them)
        ({"RANK": "1"}, (0, 0, 1)),
        ({"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "1"}, (0, 0, 1)),
    ],
)
def test_torchrun_environment_is_read_as_one_process_unless_it_names_a_world_of_several(env, expected, monkeypatch):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (rank(), local_rank(), world_size()) == expected


@pytest.mark.parametrize("command", [["finetune", "--model", "m", "--task", "sst2"], ["pretrain"]])
def test_a_local_rank_that_is_no_number_is_refused_naming_it_before_any_work(command, tmp_path, monkeypatch, capsys):
    """The Trainer reads LOCAL_RANK with int(): "x" failed after the data and model loaded ("invalid literal for
    int()", naming nothing), and distill left a folder holding only its marker."""
    from sharebert_runtime.main import main

    monkeypatch.setenv("LOCAL_RANK", "x")
    assert main([*command, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "LOCAL_RANK" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
