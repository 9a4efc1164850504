"""Short real fine-tunes of a tiny ShareBERT with the transformers Trainer (SST-2, STS-B) and bad input."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats

from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert.training.encoded import encode, predict_logits
from sharebert.training.evaluate import evaluate_glue, load_finetuned
from sharebert.training.finetune import FinetuneArgs, finetune
from sharebert.training.glue import read_split
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    build_model("sharebert-tiny", out, TINY, seed=0)
    return out


def test_sst2_finetune_writes_metrics_and_best_model(base, tmp_path):
    out = tmp_path / "sst2"
    args = FinetuneArgs(
        max_steps=20, max_train_samples=320, max_eval_samples=200, batch_size=16, lr=1e-3, warmup_steps=2, eval_steps=10
    )
    metrics = finetune(base, "sst2", out, data_path("glue", "SST-2"), args, progress=False)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk == metrics
    assert {"accuracy", "task", "steps", "best_step", "train_samples", "eval_samples"} <= set(metrics)
    assert not {"f1", "matthews_correlation", "pearson", "spearman"} & set(metrics)
    assert metrics["steps"] == 20 and metrics["train_samples"] == 320 and metrics["eval_samples"] == 200
    assert metrics["best_step"] in (10, 20)
    # Trainer logged the dev accuracy at steps 10 and 20; the kept model is the better one.
    history = json.loads((out / "log_history.json").read_text())
    evals = {h["step"]: h["eval_accuracy"] for h in history if "eval_accuracy" in h}
    assert set(evals) == {10, 20}
    assert metrics["accuracy"] == pytest.approx(max(evals.values()))
    assert evals[metrics["best_step"]] == max(evals.values())
    assert not (out / "checkpoints").exists()
    # The saved folder is a complete, loadable classifier whose dev score reproduces metrics.json.
    model, tok = load_finetuned(out)
    assert model.config.id2label == {0: "negative", 1: "positive"} and len(tok) <= model.config.vocab_size
    assert evaluate_glue(out, "sst2", max_eval_samples=200, progress=False)["accuracy"] == metrics["accuracy"]
    with pytest.raises(ValueError, match="--overwrite"):
        finetune(base, "sst2", out, data_path("glue", "SST-2"), args, progress=False)


def test_stsb_regression(base, tmp_path):
    out = tmp_path / "stsb"
    args = FinetuneArgs(max_steps=6, max_train_samples=96, max_eval_samples=120, batch_size=16, warmup_steps=1)
    metrics = finetune(base, "stsb", out, data_path("glue", "STS-B"), args, progress=False)
    assert {"pearson", "spearman"} <= set(metrics) and "accuracy" not in metrics
    model, tok = load_finetuned(out)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    dev = read_split("stsb", data_path("glue", "STS-B"), "dev").head(120)
    scores = predict_logits(model, encode(dev, tok, 128, progress=False), progress=False).reshape(-1)
    assert metrics["spearman"] == pytest.approx(stats.spearmanr(scores, dev.labels)[0], abs=1e-6)
    assert metrics["pearson"] == pytest.approx(np.corrcoef(scores, dev.labels)[0, 1], abs=1e-6)


def test_cli_finetune_and_bad_input(base, tmp_path, capsys):
    rc = main(
        [
            "finetune",
            "--model",
            str(base),
            "--task",
            "cola",
            "--data-dir",
            str(data_path("glue", "CoLA")),
            "--out",
            str(tmp_path / "cola"),
            "--max-steps",
            "3",
            "--max-train-samples",
            "48",
            "--max-eval-samples",
            "64",
            "--batch-size",
            "16",
        ]
    )
    assert rc == 0
    assert "matthews_correlation" in json.loads((tmp_path / "cola" / "metrics.json").read_text())
    # Missing and empty data: a clear error before training, nothing written.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train.tsv").write_text("")
    (empty / "dev.tsv").write_text("sentence\tlabel\nok\t1\n")
    assert (
        main(
            ["finetune", "--model", str(base), "--task", "sst2", "--data-dir", str(empty), "--out", str(tmp_path / "x")]
        )
        == 2
    )
    assert "train.tsv: the file is empty" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert (
        main(
            [
                "finetune",
                "--model",
                str(base),
                "--task",
                "sst2",
                "--data-dir",
                str(tmp_path / "nope"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    # A tokenizer larger than the config's vocabulary.
    bad = tmp_path / "bad"
    shutil.copytree(base, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["finetune", "--model", str(bad), "--task", "sst2", "--out", str(tmp_path / "y")]) == 2
    assert "vocab_size 1,000, but the word embeddings" in capsys.readouterr().err  # before the tokenizer's check


def test_rerun_into_unfinished_out_and_one_run_at_a_time(base, tmp_path, capsys):
    """A stopped run's --out (checkpoints/, no metrics.json) holds nothing finished: a re-run takes it without
    --overwrite (it is not "already holds a fine-tuning result"); a folder another finetune is
    writing (its flock held) is refused in one line naming that process."""
    import subprocess
    import sys

    out = tmp_path / "ft"
    (out / "checkpoints" / "checkpoint-7").mkdir(parents=True)  # what a run killed before its first save leaves,
    from sharebert_runtime.outdir import mark_out

    mark_out(out, "finetune")  # with the marker it wrote first (outdir.MARK): a folder without one is not ours
    argv = [
        "finetune",
        "--model",
        str(base),
        "--task",
        "sst2",
        "--out",
        str(out),
        "--max-steps",
        "2",
        "--max-train-samples",
        "16",
        "--max-eval-samples",
        "16",
        "--batch-size",
        "8",
    ]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from sharebert_runtime.outdir import OutLock\n"
            f"with OutLock({str(out)!r}, 'finetune'):\n    print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"another `sharebert finetune` (pid {holder.pid})" in err, err
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 2
    assert main(argv) == 2  # now it holds a result: replaced only with --overwrite
    assert "already holds a fine-tuning result; pass --overwrite" in capsys.readouterr().err


def test_resume_continues_from_the_newest_complete_checkpoint(base, tmp_path, capsys):
    """finetune --resume continues from the newest checkpoint with a completion marker
    (a save killed halfway, without one, is skipped as pretrain skips it); with nothing to resume it says so."""
    from sharebert.training.callbacks import MARKER, checkpoints

    out = tmp_path / "ft"
    argv = [
        "finetune",
        "--model",
        str(base),
        "--task",
        "sst2",
        "--out",
        str(out),
        "--max-train-samples",
        "32",
        "--max-eval-samples",
        "16",
        "--batch-size",
        "8",
        "--eval-steps",
        "2",
        "--keep-checkpoints",
    ]
    assert main([*argv, "--resume"]) == 2  # a new folder: nothing to resume
    err = capsys.readouterr().err  # the run's own lock does not make the folder "used"
    assert "holds no complete checkpoint to continue from; run without --resume to start" in err and not out.exists()
    assert main([*argv, "--max-steps", "2"]) == 0
    ckpts = checkpoints(out / "checkpoints")
    assert [(step, ok) for step, _, ok in ckpts] == [(2, True)]
    half = out / "checkpoints" / "checkpoint-9"  # a save killed halfway: no marker
    shutil.copytree(ckpts[0][1], half)
    (half / MARKER).unlink()
    assert main([*argv, "--max-steps", "4", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming from {out / 'checkpoints' / 'checkpoint-2'}" in printed, printed
    # set aside, never left where transformers' rotation would take it for the newest and delete the new saves
    assert (out / "checkpoints" / "incomplete-checkpoint-9").is_dir() and not half.exists()
    first = json.loads((ckpts[0][1] / "trainer_state.json").read_text())["log_history"]
    history = json.loads((out / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [2, 4]  # step 2 from the checkpoint, then 3..4 trained
    assert [h for h in history if h["step"] <= 2] == first
    assert json.loads((out / "metrics.json").read_text())["steps"] == 4
    kept = [out / "metrics.json", out / "checkpoints" / "checkpoint-4" / MARKER]
    before = [f.read_bytes() for f in kept]
    assert main([*argv, "--max-steps", "4", "--resume"]) == 0  # finished: its results and checkpoint kept as they
    assert [f.read_bytes() for f in kept] == before  # were, not evaluated and saved again
    assert "had finished (at step 4, its last); nothing left to train" in capsys.readouterr().out


def test_resume_of_a_finished_run_by_epochs_and_its_refusals(base, tmp_path, capsys):
    """Which resumes a finished run keeps (break-it findings): a run of --max-steps 3 resumed with --epochs 1 (4
    steps here) trains on (the epochs the Trainer derived from --max-steps are not the plan); one of 1.5 epochs
    resumed as it was is kept (no 7th step of 6); a metrics.json cut short is written again; without
    --keep-checkpoints the refusal says the results stand; a checkpoint of another width is one line."""
    out = tmp_path / "ft"
    argv = [
        "finetune",
        "--model",
        str(base),
        "--task",
        "sst2",
        "--out",
        str(out),
        "--max-train-samples",
        "32",
        "--max-eval-samples",
        "16",
        "--batch-size",
        "8",
        "--eval-steps",
        "2",
        "--keep-checkpoints",
    ]
    steps = lambda: json.loads((out / "metrics.json").read_text())["steps"]  # noqa: E731
    assert main([*argv, "--max-steps", "3"]) == 0 and steps() == 3
    assert main([*argv, "--epochs", "1", "--resume"]) == 0 and steps() == 4
    shutil.rmtree(out)
    assert main([*argv, "--epochs", "1.5"]) == 0 and steps() == 6
    before = (out / "metrics.json").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--epochs", "1.5", "--resume"]) == 0 and (out / "metrics.json").read_bytes() == before
    assert "had finished (at step 6, its last)" in capsys.readouterr().out
    (out / "metrics.json").write_text('{"steps": 6}')
    assert main([*argv, "--epochs", "1.5", "--resume"]) == 0 and "accuracy" in json.loads(
        (out / "metrics.json").read_text()
    )
    wide = tmp_path / "wide"
    build_model("sharebert-tiny", wide, {**TINY, "hidden_size": 128}, seed=0)
    capsys.readouterr()
    assert main([str(wide) if a == str(base) else a for a in argv] + ["--epochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "holds a run of another model (its weights, config or tokenizer files): config.json, model.safetensors"
        in err
    ), err  # the run's fingerprint, before training
    plain = [a for a in argv if a != "--keep-checkpoints"]
    shutil.rmtree(out)
    assert main([*plain, "--max-steps", "2"]) == 0
    assert main([*plain, "--max-steps", "2", "--resume"]) == 2
    assert "holds a finished run's results and no checkpoint to continue from" in capsys.readouterr().err


def test_a_run_killed_mid_epoch_keeps_a_checkpoint_by_time_and_resumes_from_it(base, tmp_path, capsys):
    """--save-minutes: a checkpoint by time in the middle of
    a 64-step epoch with no --eval-steps; after kill -9 the newest complete one is resumed from (its step > 0)."""
    from sharebert.training.callbacks import latest_checkpoint

    out = tmp_path / "ft"
    argv = [
        "finetune",
        "--model",
        str(base),
        "--task",
        "sst2",
        "--out",
        str(out),
        "--max-train-samples",
        "256",
        "--max-eval-samples",
        "16",
        "--batch-size",
        "4",
        "--keep-checkpoints",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.Popen(
        [sys.executable, "-m", "sharebert", *argv, "--save-minutes", "0.002"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while latest_checkpoint(out / "checkpoints") is None and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        run.kill()  # SIGKILL: no handler runs
        run.wait()
    found = latest_checkpoint(out / "checkpoints")  # rotation never removes the last complete one before the next is
    assert found is not None and run.returncode == -9
    step = int(found.name.split("-")[1])
    assert 0 < step < 64  # saved by time, before the end of the epoch (the only other save)
    assert main([*argv, "--max-steps", str(step + 1), "--resume"]) == 0
    assert f"resuming from {found}" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["steps"] == step + 1
