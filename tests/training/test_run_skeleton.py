"""The training skeleton's phases (sharebert/training/run_skeleton.py) on real folders, without a Trainer: the checks
every training command shares, once."""

from __future__ import annotations

import pytest

from sharebert.training.run_skeleton import RunKind, TrainingRun, open_run
from sharebert_runtime.outdir import MARK, read_json

KIND = RunKind("test result", "test-command", lambda p: (p / "metrics.json").is_file())


def test_a_folder_that_looks_like_a_result_without_the_marker_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        open_run(KIND, out, replace=True)
    assert "\n" not in str(e.value) and str(out) in str(e.value)
    assert (out / "metrics.json").read_text() == "{}"  # nothing of the user's lost


def test_start_marks_the_folder_and_a_resume_of_another_run_is_refused(tmp_path):
    run = open_run(KIND, tmp_path / "out")
    assert run.out.is_absolute() and run.checkpoints == run.out / "checkpoints"
    run.start({"teacher": "a:1"})
    assert KIND.is_ours(run.out)  # marked in this very folder: a re-run may replace it
    assert read_json(run.out / MARK)["command"] == "test-command"
    again = TrainingRun(KIND, run.out)
    again.start({"teacher": "a:1"}, resume=True)  # the same run: continued
    with pytest.raises(ValueError, match="teacher"):
        again.start({"teacher": "b:2"}, resume=True, restart="choose another --out")


def test_a_resume_with_no_checkpoint_is_refused_naming_out(tmp_path):
    run = open_run(KIND, tmp_path / "out")
    assert run.resume(False) is None
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        run.resume(True)
