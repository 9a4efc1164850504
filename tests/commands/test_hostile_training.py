"""A careless or hostile user at the training commands (finetune, distill): what the training skeleton must survive.

A learning rate that blows the weights up (``--lr 1e9``) used to publish a model of NaN weights with exit 0 (the
Trainer's ``logging_nan_inf_filter`` hid the NaN loss); now the run stops before the update, one ``stopped:`` line,
exit 3, and ``--out`` holds no model, so nothing loads it as a result.
"""

import json
import math

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from sharebert.formats.build import build_model
from sharebert.training.callbacks import MarkCheckpoints, is_complete
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
STEPS = ["--max-steps", "6", "--eval-steps", "3", "--max-train-samples", "32", "--max-eval-samples", "16"]
SMALL = [*STEPS, "--batch-size", "8", "--save-minutes", "0"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    build_model("sharebert-tiny", out, TINY, seed=0)
    return out


def _stopped_on_nan(capsys, command: str, out) -> None:
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"sharebert {command}: stopped: loss became nan at step "), err
    assert "lower --lr" in last and "Traceback" not in err
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()  # no result published


@pytest.mark.slow
def test_finetune_at_a_learning_rate_that_blows_up_stops_with_exit_3_and_publishes_nothing(model, tmp_path, capsys):
    out = tmp_path / "ft"
    argv = ["finetune", "--model", str(model), "--task", "sst2", "--out", str(out), *SMALL]
    assert main([*argv, "--lr", "1e9"]) == 3
    _stopped_on_nan(capsys, "finetune", out)
    assert main(argv) == 0  # the stopped run's folder is taken by a sane re-run, no --overwrite needed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and math.isfinite(metrics["accuracy"])


@pytest.mark.slow
def test_distill_at_a_learning_rate_that_blows_up_stops_with_exit_3_and_publishes_nothing(model, tmp_path, capsys):
    teacher = tmp_path / "teacher"
    assert main(["finetune", "--model", str(model), "--task", "sst2", "--out", str(teacher), *SMALL]) == 0
    capsys.readouterr()
    out = tmp_path / "kd"
    argv = ["distill", "--teacher", str(teacher), "--student", str(model), "--task", "sst2", "--out", str(out)]
    assert main([*argv, *SMALL, "--lr", "1e9"]) == 3
    _stopped_on_nan(capsys, "distill", out)


def test_a_checkpoint_of_non_finite_weights_is_never_marked_complete(tmp_path):
    """A save after an update that blew the weights up (the loss is checked before the update, so the step's own
    loss was finite) leaves the checkpoint unmarked: never resumed from, never named as the last good one."""
    net = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    for step, value in ((1, 0.5), (2, float("nan"))):
        torch.nn.init.constant_(net.weight, value)
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        torch.save(net.state_dict(), folder / "weights.pt")
        MarkCheckpoints().on_save(args, TrainerState(global_step=step), TrainerControl(), model=net)
    assert is_complete(tmp_path / "checkpoint-1") and not is_complete(tmp_path / "checkpoint-2")


def test_a_binary_training_file_is_refused_before_any_model_loads(model, tmp_path, capsys, monkeypatch):
    """The task's files are read before the model: under the command, transformers' load report of the fresh
    classifier head (15 lines) no longer comes before the one error line, and no --out is left behind."""
    import sharebert.training.finetune as finetune

    def loaded(*a, **kw):
        raise AssertionError("the model loaded before the training file was read")

    monkeypatch.setattr(finetune, "load_classifier", loaded)
    data = tmp_path / "glue"
    data.mkdir()
    (data / "train.tsv").write_bytes(bytes(range(128, 256)) * 8)
    (data / "dev.tsv").write_text("sentence\tlabel\na fine film\t1\n")
    out = tmp_path / "ft"
    argv = ["finetune", "--model", str(model), "--task", "sst2", "--data-dir", str(data), "--out", str(out), *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.tsv: not UTF-8 text" in err, err
    assert not out.exists()


@pytest.mark.slow
def test_a_run_that_is_all_warmup_ends(model, tmp_path, capsys):
    """--max-steps equal to --warmup-steps (--max-steps 50 at the default warmup of 50): transformers' polynomial
    decay divided by its 0 decay steps after the last step, an internal error once the whole run had trained."""
    out = tmp_path / "ft"
    argv = ["finetune", "--model", str(model), "--task", "sst2", "--out", str(out), *SMALL, "--warmup-steps", "6"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text())["steps"] == 6
