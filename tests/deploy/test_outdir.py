"""torchrun's environment as the library reads it (sharebert_runtime.outdir.rank, local_rank, world_size)."""

from __future__ import annotations

import fcntl
import os

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


def test_an_out_that_is_a_link_leading_nowhere_is_refused_naming_the_link(tmp_path):
    """A link to nothing (or a folder under one) was called "a file, not a folder": the refusal now names the link
    and where it leads; a link to a file says so too, and a real file is still a file."""
    from sharebert_runtime.outdir import check_out_dir, made_by

    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "file").write_text("x")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    cases = {
        "dangling": f"--out {tmp_path}/dangling is a symbolic link to {tmp_path}/gone, which does not exist",
        "dangling/run": f"--out {tmp_path}/dangling/run: {tmp_path}/dangling is a symbolic link to {tmp_path}/gone, "
        "which does not exist",
        "to-file": f"--out {tmp_path}/to-file is a symbolic link to {tmp_path}/file, which is no folder",
        "file": f"--out {tmp_path}/file is a file, not a folder",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError) as refused:
            check_out_dir(tmp_path / name, "compress result", made_by("compress"))
        assert str(refused.value) == message
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_lock_file_that_is_no_regular_file_is_refused_and_left_alone(tmp_path, kind):
    """The run's lock file was opened through a link and truncated to the PID: a `.lock` leading to a file outside
    the folder emptied that file. A link or a FIFO there is refused in one line naming it, nothing written."""
    from sharebert_runtime.outdir import OutLock

    outside = tmp_path / "important.txt"
    outside.write_text("the user's own\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(outside) if kind == "link" else os.mkfifo(out / ".lock")
    with pytest.raises(ValueError, match=r"out/\.lock is (a symbolic link|a FIFO)[^\n]*remove it") as refused:
        with OutLock(out, "compress"):
            pass
    assert "\n" not in str(refused.value) and outside.read_text() == "the user's own\n"


@pytest.mark.parametrize("held", ["", "4242\n", "my notes\n"])
def test_a_lock_file_of_the_users_own_is_kept_and_a_stale_pid_taken(tmp_path, held):
    """A run writes its PID into `.lock` (a killed run's stays: the next run takes it); a `.lock` that holds anything
    else is a file of the user's, which the run truncated: now refused in one line, the file as it was."""
    from sharebert_runtime.outdir import OutLock

    (tmp_path / ".lock").write_text(held)
    if held.strip().isdigit() or not held:
        with OutLock(tmp_path, "compress"):
            assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
        return
    with pytest.raises(ValueError, match=r"\.lock is a file of yours, not a run's lock") as refused:
        with OutLock(tmp_path, "compress"):
            pass
    assert "\n" not in str(refused.value) and (tmp_path / ".lock").read_text() == held
    with open(tmp_path / ".lock") as f:  # the refusal left no lock held
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stop_right_after_the_partial_file_is_made_leaves_nothing_and_the_old_file(stop, tmp_path, monkeypatch):
    """A signal that lands between the partial file's creation and the block that removes it (once a real SIGHUP
    in tests/deploy/test_untrusted.py's race): here the flock that follows the creation raises, as a stop would."""
    from sharebert_runtime import outdir

    target = tmp_path / "out.json"
    target.write_text("old")

    def stopped(fd, op):
        raise stop()

    monkeypatch.setattr(outdir.fcntl, "flock", stopped)
    with pytest.raises(stop):
        with outdir.atomic_output(target) as f:
            f.write("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    assert target.read_text() == "old"


@pytest.mark.parametrize(
    "marker, says",
    [
        (b'{"command": "finet', "sharebert_run.json cannot be read"),  # truncated by a crash or a copy
        (b'{"command": "distill", "fingerprint": {}, "files": {}}', "says `sharebert distill` wrote it"),
    ],
)
def test_a_marker_that_makes_no_folder_of_this_command_is_refused_saying_why(marker, says, tmp_path):
    from sharebert_runtime.outdir import MARK, check_out_dir, made_by

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / MARK).write_bytes(marker)
    with pytest.raises(ValueError) as refused:
        check_out_dir(out, "fine-tuning result", made_by("finetune"), legacy=lambda p: True)
    assert says in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert (out / MARK).read_bytes() == marker and (out / "config.json").read_text() == "{}"
