"""``max_time``: a real tiny pre-training run stops on the wall clock, before ``max_steps``, with a
checkpoint that ``--resume`` continues from; a run that reaches ``max_steps`` first says so."""
import json

import pytest

from sharebert.build import build_model
from sharebert.cli import main
from sharebert.paths import data_path
from sharebert.training.callbacks import latest_checkpoint
from sharebert.training.pretrain import PretrainArgs, pretrain

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
COMMON = ["--batch-size", "4", "--seq-len", "32", "--logging-steps", "1", "--eval-steps", "100000",
          "--save-steps", "100000", "--max-eval-sequences", "8", "--no-progress"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    build_model("sharebert-tiny", out, TINY)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt"
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8", newline=None) as f:
        path.write_text("".join(next(f) for _ in range(200)), encoding="utf-8")
    return path


def test_max_time_stops_before_max_steps_and_resumes(tmp_path, model_dir, corpus, capsys):
    out = tmp_path / "run"
    argv = ["pretrain", "--model", str(model_dir), "--train", str(corpus), "--out", str(out), *COMMON,
            "--max-steps", "1000000", "--max-time", "1.5"]
    assert main(argv) == 0
    assert "stopped by --max-time" in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    step = m["global_step"]
    assert m["status"] == "completed" and m["stopped_by"] == "max_time" and m["args"]["max_time"] == 1.5
    assert 1 <= step < 1_000_000 and m["train_runtime"] >= 1.5
    assert latest_checkpoint(out).name == f"checkpoint-{step}"  # saved where the clock stopped it
    assert m["eval_loss"] > 0 and (out / "model.safetensors").is_file()  # scored and published as at a normal end

    assert main([*argv, "--resume"]) == 0
    again = json.loads((out / "metrics.json").read_text())
    assert again["stopped_by"] == "max_time" and again["global_step"] > step  # a fresh budget from the checkpoint
    logged = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert step + 1 in logged


def test_max_steps_reached_first_and_bad_max_time(tmp_path, model_dir, corpus):
    args = PretrainArgs(max_steps=2, max_time=3600.0, batch_size=4, seq_len=32, eval_steps=2, save_steps=2,
                        max_eval_sequences=8, progress=False)
    m = pretrain([corpus], tmp_path / "steps", model_dir, args=args)
    assert m["stopped_by"] == "max_steps" and m["global_step"] == 2
    with pytest.raises(ValueError, match="max_time must be a positive"):
        pretrain([corpus], tmp_path / "bad", model_dir, args=PretrainArgs(max_time=0.0, progress=False))
