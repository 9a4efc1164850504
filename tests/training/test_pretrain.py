"""Pre-training with the real Trainer: exact resume after SIGTERM, NaN stop, partial checkpoints,
torchrun on 2 CPU processes, character-level CLI, bad input, wall-clock budget."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert.training.callbacks import MARKER, checkpoints, is_complete, latest_checkpoint
from sharebert.training.pretrain import NonFiniteLoss, PretrainArgs, param_digest, pretrain
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
ARGS = dict(
    max_steps=6,
    batch_size=4,
    seq_len=32,
    save_steps=2,
    eval_steps=3,
    logging_steps=1,
    max_eval_sequences=16,
    eval_on_start=True,
    progress=False,
)
REPO = Path(__file__).resolve().parents[2]
MAX_TIME_ARGS = [
    "--batch-size",
    "4",
    "--seq-len",
    "32",
    "--logging-steps",
    "1",
    "--eval-steps",
    "100000",
    "--save-steps",
    "100000",
    "--max-eval-sequences",
    "8",
    "--no-progress",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    build_model("sharebert-tiny", out, TINY)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt"
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8", newline=None) as f:
        path.write_text("".join(next(f) for _ in range(300)), encoding="utf-8")
    return path


def _log(out):
    return [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]


def _losses(out):
    return {r["step"]: r["loss"] for r in _log(out) if "loss" in r}


class SignalAt(TrainerCallback):
    """Sends a real signal to this process after optimizer step ``step``."""

    def __init__(self, step, signum=signal.SIGTERM):
        self.step, self.signum = step, signum

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def test_sigterm_checkpoint_and_resume_match_an_uninterrupted_run(tmp_path, model_dir, corpus):
    whole = pretrain([corpus], tmp_path / "whole", model_dir, args=PretrainArgs(**ARGS))
    assert whole["status"] == "completed" and whole["global_step"] == 6
    log = _log(tmp_path / "whole")
    evals = [r for r in log if "eval_loss" in r]
    assert [r["step"] for r in evals] == [0, 3, 6]  # the untrained model is scored first
    assert all(
        abs(r["eval_perplexity"] - torch.tensor(r["eval_loss"]).exp().item()) < 1e-2 * r["eval_perplexity"]
        for r in evals
    )
    assert whole["eval_loss"] == evals[-1]["eval_loss"]
    assert list((tmp_path / "whole" / "tb").glob("events.out.tfevents.*"))
    lrs = [r["learning_rate"] for r in log if "learning_rate" in r]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-3) and lrs[-1] < lrs[1]  # 6% warm-up, linear decay

    part = tmp_path / "part"
    stopped = pretrain([corpus], part, model_dir, args=PretrainArgs(**ARGS), callbacks=[SignalAt(3)])
    assert stopped["status"] == "interrupted" and stopped["signal"] == signal.SIGTERM
    # sent after step 3, caught inside the evaluation at step 3: that step is saved
    assert stopped["global_step"] == 3 and stopped["checkpoint"] == str(part / "checkpoint-3")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert not (part / "model.safetensors").exists()  # no final model from an interrupted run
    assert is_complete(part / "checkpoint-3")

    # A save killed halfway: checkpoint-6 without its marker, checkpoint-5 with a truncated weights file.
    for step, cut in ((6, True), (5, False)):
        shutil.copytree(part / "checkpoint-3", part / f"checkpoint-{step}")
        weights = part / f"checkpoint-{step}" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
        if cut:
            (part / f"checkpoint-{step}" / MARKER).unlink()
    assert [ok for _, _, ok in checkpoints(part)] == [True, True, False, False]
    assert latest_checkpoint(part) == part / "checkpoint-3"
    with pytest.raises(ValueError, match="pass --resume"):
        pretrain([corpus], part, model_dir, args=PretrainArgs(**ARGS))

    resumed = pretrain([corpus], part, model_dir, args=PretrainArgs(**ARGS, resume=True))
    assert resumed["status"] == "completed" and resumed["global_step"] == 6
    assert resumed["param_sha256"] == whole["param_sha256"]  # same schedule, data order and masking
    assert _losses(part) == _losses(tmp_path / "whole")
    assert resumed["eval_loss"] == whole["eval_loss"]
    assert [s for s, _, ok in checkpoints(part)] == [3, 4, 6] and latest_checkpoint(part) == part / "checkpoint-6"


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, model_dir, corpus, capsys):
    out = tmp_path / "nan"
    rc = main(
        [
            "pretrain",
            "--model",
            str(model_dir),
            "--train",
            str(corpus),
            "--out",
            str(out),
            "--lr",
            "1e9",
            "--warmup-ratio",
            "0",
            "--max-steps",
            "5",
            "--batch-size",
            "4",
            "--seq-len",
            "32",
            "--save-steps",
            "1",
            "--logging-steps",
            "1",
            "--max-eval-sequences",
            "8",
            "--no-progress",
        ]
    )
    msg = capsys.readouterr().out
    assert rc == 3
    assert "loss became nan at step 2" in msg and "checkpoint-1" in msg
    assert [(s, ok) for s, _, ok in checkpoints(out)] == [(1, True)]  # nothing saved after the bad step
    weights = load_file(out / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()


def test_injected_inf_raises_non_finite_loss(tmp_path, model_dir, corpus):
    class Poison(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3:  # after checkpoint-2, before step 4's forward
                with torch.no_grad():
                    model.lm_head.decoder.bias[7] = float("inf")

    with pytest.raises(NonFiniteLoss) as err:
        pretrain([corpus], tmp_path / "inf", model_dir, args=PretrainArgs(**ARGS), callbacks=[Poison()])
    assert err.value.step == 4 and err.value.checkpoint == tmp_path / "inf" / "checkpoint-2"
    assert [s for s, _, ok in checkpoints(tmp_path / "inf") if ok] == [2]


def test_torchrun_two_processes_keep_identical_replicas(tmp_path, model_dir, corpus):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    tiny = [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "sharebert",
        "pretrain",
        "--preset",
        "sharebert-tiny",
        *tiny,
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--max-steps",
        "3",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--lr",
        "1e-2",
        "--warmup-ratio",
        "0",
        "--logging-steps",
        "1",
        "--save-steps",
        "2",
        "--eval-steps",
        "3",
        "--eval-samples",
        "16",
        "--eval-on-start",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_step"] == 3
    rank0, rank1 = metrics["param_sha256"]
    assert rank0 == rank1  # each rank hashed its own replica
    from sharebert.model.modeling_sharebert import ShareBertForMaskedLM

    saved = ShareBertForMaskedLM.from_pretrained(out)  # rank 0 built the preset, rank 1 loaded it
    assert param_digest(saved) == rank0
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1]
    evals = {r["step"]: r["eval_loss"] for r in _log(out) if "eval_loss" in r}  # same fixed masks each time
    assert sorted(evals) == [0, 3] and evals[3] < evals[0] - 0.05
    assert {"rng_state_0.pth", "rng_state_1.pth", MARKER} <= {p.name for p in (out / "checkpoint-2").iterdir()}


def test_cli_sigterm_then_resume(tmp_path, model_dir, corpus):
    out = tmp_path / "cli"
    common = [
        "--model",
        str(model_dir),
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--save-steps",
        "1000",
        "--logging-steps",
        "1",
        "--max-eval-sequences",
        "8",
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharebert", "pretrain", *common, "--max-steps", "100000"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "log.jsonl"
    deadline = time.monotonic() + 300  # a hang guard: starting takes long on a loaded machine
    while not (log.exists() and len(log.read_text().splitlines()) >= 2) and proc.poll() is None:
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM: saved" in stdout and "--resume" in stdout
    ckpt = latest_checkpoint(out)
    step = int(ckpt.name.split("-")[1])
    assert step >= 2 and json.loads((out / "metrics.json").read_text())["status"] == "interrupted"

    rc = main(["pretrain", *common, "--max-steps", str(step + 2), "--resume"])
    assert rc == 0
    steps = [r["step"] for r in _log(out) if "loss" in r]
    assert steps[-2:] == [step + 1, step + 2] and steps[:step] == list(range(1, step + 1))
    assert json.loads((out / "metrics.json").read_text())["global_step"] == step + 2


def test_char_level_preset_on_shakespeare(tmp_path):
    out = tmp_path / "char"
    rc = main(
        [
            "pretrain",
            "--char-level",
            "--objective",
            "clm",
            "--preset",
            "charlm-tiny",
            "--set",
            "hidden_size=32",
            "--set",
            "num_hidden_layers=1",
            "--set",
            "intermediate_size=64",
            "--set",
            "qk_share_ratio=0.9",
            "--out",
            str(out),
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--seq-len",
            "64",
            "--eval-steps",
            "2",
            "--max-eval-sequences",
            "4",
            "--no-progress",
        ]
    )
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    n = 1_115_394  # characters in input.txt = tokens
    assert m["train_sequences"] == round(0.9 * n) // 64  # 90/10 split of the character stream
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 72 and config["is_decoder"] and config["qk_share_ratio"] == 0.9
    assert config["architectures"] == ["ShareBertForCausalLM"]
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 67 and vocab["[PAD]"] == 0 and vocab["\n"] == 2
    assert m["eval_loss"] < 4.5  # ln(72) = 4.28 at init; finite and near it after 2 steps


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "sharebert-tiny", "--train", "missing.txt"], "not found"),
        (["--preset", "sharebert-tiny", "--char-level", "--train", "x"], "--objective clm"),
        (["--train", "x"], "exactly one of --model"),
    ],
)
def test_bad_command_lines(tmp_path, capsys, argv, message):
    rc = main(["pretrain", *argv, "--out", str(tmp_path / "o")])
    assert rc == 2 and message in capsys.readouterr().err


def test_tokenizer_config_mismatch_is_refused_before_training(tmp_path, model_dir, corpus, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    rc = main(["pretrain", "--model", str(bad), "--train", str(corpus), "--out", str(tmp_path / "o")])
    # the config's vocab_size against the weights' rows comes first (the tokenizer's check: test_corpus)
    assert rc == 2 and "vocab_size 1,000, but the word embeddings" in capsys.readouterr().err
    assert not (tmp_path / "o" / "log.jsonl").exists()


# max_time: a real tiny run stops on the wall clock, before max_steps, with a checkpoint --resume continues from.
def test_max_time_stops_before_max_steps_and_resumes(tmp_path, model_dir, corpus, capsys, stepped_clock):
    out = tmp_path / "run"
    argv = [
        "pretrain",
        "--model",
        str(model_dir),
        "--train",
        str(corpus),
        "--out",
        str(out),
        *MAX_TIME_ARGS,
        "--max-steps",
        "1000000",
        "--max-time",
        "1.5",
    ]
    assert main(argv) == 0
    assert "stopped by --max-time" in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    step = m["global_step"]
    assert m["status"] == "completed" and m["stopped_by"] == "max_time" and m["args"]["max_time"] == 1.5
    assert 1 <= step <= 2 and m["train_runtime"] > 0  # 0.5 s a step: the next step is reserved from the 1.5 s
    assert latest_checkpoint(out).name == f"checkpoint-{step}"  # saved where the clock stopped it
    assert m["eval_loss"] > 0 and (out / "model.safetensors").is_file()  # scored and published as at a normal end

    state = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())
    used = state["stateful_callbacks"]["WallClockLimit"]["attributes"]["used_seconds"]
    assert used == step * stepped_clock.step_seconds  # the checkpoint keeps the clock: the budget is the run's
    assert main([*argv[:-1], "3.0", "--resume"]) == 0  # a larger budget goes on from the seconds used
    again = json.loads((out / "metrics.json").read_text())
    assert again["stopped_by"] == "max_time" and again["global_step"] > step
    assert again["train_seconds"] > used  # both runs counted (train_runtime: this process only)
    assert f"after {again['train_seconds']:.0f} s of training" in capsys.readouterr().out
    state = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())
    assert used < state["stateful_callbacks"]["WallClockLimit"]["attributes"]["used_seconds"]
    logged = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert step + 1 in logged


def test_save_minutes_checkpoints_by_time_between_step_saves(tmp_path, model_dir, corpus):
    """--save-minutes: with --save-steps past the run, a
    tiny interval saves at every step; each time save is complete (marked, so --resume takes it) and rotated."""
    out = tmp_path / "run"
    argv = [
        "pretrain",
        "--model",
        str(model_dir),
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--save-steps",
        "1000",
        "--eval-steps",
        "1000",
        "--max-eval-sequences",
        "8",
        "--keep-checkpoints",
        "2",
        "--no-progress",
        "--max-steps",
        "4",
    ]
    assert main([*argv, "--save-minutes", "0.00001"]) == 0
    assert [(step, done) for step, _, done in checkpoints(out)] == [(3, True), (4, True)]
    assert main([*argv, "--max-steps", "2", "--save-minutes", "0", "--out", str(tmp_path / "none")]) == 0
    assert [step for step, _, _ in checkpoints(tmp_path / "none")] == [2]  # only the end of the run's
    before = (out / "metrics.json").read_bytes()
    assert main([*argv, "--resume"]) == 0  # finished at step 4: nothing trained, its figures kept as they were
    assert (out / "metrics.json").read_bytes() == before and [s for s, _, _ in checkpoints(out)] == [3, 4]
    from sharebert.training.pretrain import UNFINISHED

    (out / UNFINISHED).write_text('{"status": "training"}')  # an extension killed before its first checkpoint
    assert main([*argv, "--resume"]) == 0 and not (out / UNFINISHED).exists()  # published again, not left
    # marked unfinished (export would refuse the folder and send the user to a --resume that kept it)


def test_max_steps_reached_first_and_bad_max_time(tmp_path, model_dir, corpus):
    args = PretrainArgs(
        max_steps=2,
        max_time=3600.0,
        batch_size=4,
        seq_len=32,
        eval_steps=2,
        save_steps=2,
        max_eval_sequences=8,
        progress=False,
    )
    m = pretrain([corpus], tmp_path / "steps", model_dir, args=args)
    assert m["stopped_by"] == "max_steps" and m["global_step"] == 2
    with pytest.raises(ValueError, match="max_time must be a positive"):
        pretrain([corpus], tmp_path / "bad", model_dir, args=PretrainArgs(max_time=0.0, progress=False))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, model_dir, corpus):
    from sharebert.training.shards import prepare

    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare([corpus], out, model_dir, progress=False)
    return out


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_train_from_prepared_data_with_depth_sampling(tmp_path, data_dir):
    """Two torchrun nodes (one process each, gloo) train from prepared data with --depth-sampling: DDP with layers
    skipped, whose biases and norms get no gradient in that step (find_unused_parameters), keeps identical replicas.
    A 4-layer model of the data's tokenizer: a depth under 4 in either of the first 2 steps (15 of 16 draws) leaves
    parameters without a gradient before the next step, which DDP refuses without find_unused_parameters."""
    out, port = tmp_path / "nodes", _free_port()
    model_dir = tmp_path / "deep"
    build_model("sharebert-tiny", model_dir, {**TINY, "num_hidden_layers": 4})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "-m",
                "sharebert",
                "pretrain",
                "--model",
                str(model_dir),
                "--data",
                str(data_dir),
                "--out",
                str(out),
                "--max-steps",
                "3",
                "--batch-size",
                "4",
                "--seq-len",
                "32",
                "--lr",
                "1e-2",
                "--warmup-ratio",
                "0",
                "--logging-steps",
                "1",
                "--save-steps",
                "3",
                "--eval-samples",
                "8",
                "--no-progress",
                "--depth-sampling",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["global_step"] == 3
    assert m["param_sha256"][0] == m["param_sha256"][1]  # identical replicas on both nodes
    assert sorted(_losses(out)) == [1, 2, 3]
    assert json.loads((out / "config.json").read_text())["train_min_depth"] == 1


class SignalInEval(TrainerCallback):
    """Sends SIGTERM from inside the first evaluation at optimizer step ``step``."""

    def __init__(self, step):
        self.step, self.sent = step, False

    def on_prediction_step(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def test_prepared_data_sigterm_in_evaluation_corrupt_checkpoint_and_exact_resume(tmp_path, model_dir, data_dir, corpus):
    args = dict(ARGS, eval_on_start=False, max_eval_sequences=64, eval_steps=3)
    whole = pretrain(None, tmp_path / "whole", model_dir, data=data_dir, args=PretrainArgs(**args))
    # the same sequences and masks as tokenizing in memory: --train with the same held-out share
    in_memory = pretrain([corpus], tmp_path / "mem", model_dir, args=PretrainArgs(**args, valid_fraction=0.0))
    nothing_held = pretrain(
        None, tmp_path / "d0", model_dir, data=data_dir, args=PretrainArgs(**args, valid_fraction=0.0)
    )
    assert nothing_held["param_sha256"] == in_memory["param_sha256"]

    part = tmp_path / "part"
    stopped = pretrain(None, part, model_dir, data=data_dir, args=PretrainArgs(**args), callbacks=[SignalInEval(3)])
    assert stopped["status"] == "interrupted" and stopped["global_step"] == 3
    assert stopped["checkpoint"] == str(part / "checkpoint-3")  # the step before the evaluation, saved
    # same-size corruption of the newest checkpoint: set aside, resume from the one before, saying so
    opt = part / "checkpoint-3" / "optimizer.pt"
    raw = bytearray(opt.read_bytes())
    raw[-100] ^= 0xFF
    opt.write_bytes(bytes(raw))
    resumed = pretrain(
        None, part, model_dir, data=data_dir, args=PretrainArgs(**{**args, "resume": True, "logging_steps": 100})
    )
    assert (part / "corrupt-checkpoint-3").is_dir()
    assert resumed["param_sha256"] == whole["param_sha256"] and resumed["eval_loss"] == whole["eval_loss"]
    # metrics over the whole run, though this part ran steps 3-6 and logged none of them
    assert abs(resumed["train_loss"] - whole["train_loss"]) < 1e-9
    assert abs(resumed["last_loss"] - _losses(tmp_path / "whole")[6]) < 1e-4


def test_a_step_corrupted_twice_is_set_aside_twice(tmp_path):
    """A checkpoint of the same step found corrupt a second time (after a resume saved it again) is set aside
    beside the first (the rename would meet a non-empty directory)."""
    from sharebert.training.callbacks import mark_complete, resume_checkpoint

    def save(step, body=b"good"):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "w.bin").write_bytes(body)
        mark_complete(tmp_path / f"checkpoint-{step}", step)
        (tmp_path / f"checkpoint-{step}" / "w.bin").write_bytes(b"bad!")  # same size, other bytes

    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "w.bin").write_bytes(b"ok")
    mark_complete(tmp_path / "checkpoint-2", 2)
    said = []
    for _ in range(2):
        save(3)
        assert resume_checkpoint(tmp_path, said.append) == tmp_path / "checkpoint-2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-2",
        "corrupt-checkpoint-3",
        "corrupt-checkpoint-3.2",
    ]
    assert said[-1].endswith("set aside as corrupt-checkpoint-3.2, trying the previous checkpoint"), said
    (tmp_path / "corrupt-checkpoint-3.3").symlink_to(tmp_path / "nowhere")  # a link that leads nowhere counts too
    save(3)
    assert resume_checkpoint(tmp_path, said.append) == tmp_path / "checkpoint-2"
    assert (tmp_path / "corrupt-checkpoint-3.4" / "w.bin").is_file()


def test_rotation_never_deletes_the_newest_checkpoint(tmp_path):
    from sharebert.training.callbacks import mark_complete, rotate

    for step in (1, 2, 3):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "w.bin").write_bytes(b"x" * step)
        mark_complete(tmp_path / f"checkpoint-{step}", step)
    rotate(tmp_path, -1)
    assert [s for s, _, ok in checkpoints(tmp_path) if ok] == [3]


def _tokenizer_mismatch(tmp_path, model_dir, data_dir, corpus):
    small = tmp_path / "vocab.txt"
    small.write_text("".join(default_vocab_lines()[:3000]))
    other = tmp_path / "other"
    build_model("sharebert-tiny", other, TINY, vocab=small)
    return ["--model", str(other), "--data", str(data_dir)]


def default_vocab_lines():
    from sharebert.formats.paths import default_vocab

    return default_vocab().read_text(encoding="utf-8").splitlines(keepends=True)


def _binary_corpus(tmp_path, model_dir, data_dir, corpus):
    (tmp_path / "w.bin").write_bytes(bytes(range(256)) * 40)
    return ["--model", str(model_dir), "--train", str(tmp_path / "w.bin")]


def _plain(extra):
    return lambda tmp_path, model_dir, data_dir, corpus: ["--model", str(model_dir), "--train", str(corpus), *extra]


@pytest.mark.parametrize(
    "make_argv, out_kind, message",
    [
        (_plain(["--keep-checkpoints", "-1"]), "new", "keep_checkpoints must be at least 1"),
        (_plain(["--keep-checkpoints", "0"]), "new", "keep_checkpoints must be at least 1"),
        (_plain(["--set", "hidden_size=32"]), "new", "--set changes a --preset build"),
        (_plain(["--eval-samples", "0"]), "new", "eval_samples must be at least 1"),
        (_binary_corpus, "new", "w.bin is binary, not UTF-8 text"),
        (_tokenizer_mismatch, "new", "was prepared with another tokenizer"),
        (_plain([]), "file", "is a file, not a folder"),
        (_plain([]), "under_file", "is a file, not a folder"),
        (_plain([]), "foreign", "is a non-empty folder that is not a pretrain run"),
        (lambda t, m, d, c: ["--model", str(m), "--data", str(t)], "new", "is not a prepared data folder"),
        # --out may never be the input model, even with --resume (which would overwrite it)
        (_plain([]), "model", "is, or holds, the input"),
        (_plain(["--resume"]), "model", "is, or holds, the input"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_out(
    tmp_path, capsys, model_dir, data_dir, corpus, make_argv, out_kind, message
):
    argv = make_argv(tmp_path, model_dir, data_dir, corpus)
    weights = (model_dir / "model.safetensors").read_bytes()
    (tmp_path / "f.txt").write_text("mine\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    out = {
        "new": tmp_path / "new",
        "file": tmp_path / "f.txt",
        "under_file": tmp_path / "f.txt" / "o",
        "foreign": tmp_path / "foreign",
        "model": model_dir,
    }[out_kind]
    rc = main(["pretrain", *argv, "--out", str(out), "--max-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "f.txt").read_text() == "mine\n" and (tmp_path / "foreign" / "notes.txt").read_text() == "mine\n"
    assert (model_dir / "model.safetensors").read_bytes() == weights and not (model_dir / "log.jsonl").exists()


STEP_LINE = re.compile(r"^step \d+/\d+ \(\d+%\)( [a-z_]+ -?[0-9.e+-]+)*( [0-9.]+ steps/s ETA \d+m\d\ds)?$")


def test_no_progress_prints_step_lines_and_resume_reports_the_whole_run(tmp_path, model_dir, corpus, capfd):
    """--no-progress: the documented plain lines, never a raw dict; after --resume the train loss (printed and
    in metrics.json) is the mean over every step of the run, and the tied decoder weight is not 'missing'."""
    out = tmp_path / "run"
    argv = [
        "pretrain",
        "--model",
        str(model_dir),
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--logging-steps",
        "1",
        "--save-steps",
        "2",
        "--eval-steps",
        "2",
        "--max-eval-sequences",
        "8",
        "--no-progress",
    ]
    assert main([*argv, "--max-steps", "2"]) == 0
    first = capfd.readouterr()
    assert main([*argv, "--max-steps", "4", "--resume"]) == 0
    second = capfd.readouterr()
    for printed in (first, second):
        lines = [line for line in printed.err.splitlines() if line.strip()]
        assert lines and all(STEP_LINE.match(line) for line in lines), printed.err
    assert "missing keys" not in second.out + second.err
    step_losses = _losses(out)
    assert sorted(step_losses) == [1, 2, 3, 4]
    whole_run = sum(step_losses.values()) / 4  # logged losses are rounded to 4 decimals
    m = json.loads((out / "metrics.json").read_text())
    assert abs(m["train_loss"] - whole_run) <= 1e-3
    printed = float(re.search(r"train_loss (\S+)", second.err).group(1))
    assert abs(printed - m["train_loss"]) <= 1e-4
    assert f"train loss {m['train_loss']:.4f}" in second.out


def test_interrupted_preset_run_is_refused_until_resumed(tmp_path, corpus, capsys):
    """A preset run stopped by a signal keeps the freshly built (untrained) model in --out: every command that
    loads a model folder refuses it, naming --resume, until the resumed run saves its trained model."""
    from sharebert.formats.model_folder import UNFINISHED, read_config

    out = tmp_path / "run"
    args = dict(ARGS, max_steps=3, eval_on_start=False, overrides=TINY)
    stopped = pretrain([corpus], out, preset="sharebert-tiny", args=PretrainArgs(**args), callbacks=[SignalAt(1)])
    assert stopped["status"] == "interrupted" and (out / "config.json").is_file() and (out / UNFINISHED).is_file()
    capsys.readouterr()
    for argv in (
        ["export", "--model", str(out), "--out", str(tmp_path / "art")],
        ["finetune", "--model", str(out), "--task", "sst2", "--out", str(tmp_path / "ft"), "--max-steps", "1"],
        ["pretrain", "--model", str(out), "--train", str(corpus), "--out", str(tmp_path / "pt")],
        ["report", "--model", str(out)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds an unfinished training run" in err and "--resume" in err, err
    assert not any((tmp_path / name).exists() for name in ("art", "ft", "pt"))
    resumed = pretrain([corpus], out, preset="sharebert-tiny", args=PretrainArgs(**args, resume=True))
    assert resumed["status"] == "completed" and resumed["global_step"] == 3
    assert not (out / UNFINISHED).exists() and read_config(out)["model_type"] == "sharebert"


def test_one_run_at_a_time_per_out_and_a_killed_run_leaves_no_stuck_lock(tmp_path, model_dir, corpus, capsys):
    """The --out lock (outdir.OutLock, an flock with the PID) refuses a second run while the first holds it;
    the kernel drops it when its holder is killed with SIGKILL, so the next run proceeds."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from sharebert_runtime.outdir import OutLock\n"
            f"with OutLock({str(out)!r}, 'pretrain'):\n    print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = [
            "pretrain",
            "--model",
            str(model_dir),
            "--train",
            str(corpus),
            "--out",
            str(out),
            *MAX_TIME_ARGS,
            "--max-steps",
            "1",
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"another `sharebert pretrain` (pid {holder.pid}) is writing" in err, err
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0  # no stuck lock after kill -9
    assert json.loads((out / "metrics.json").read_text())["status"] == "completed"


def test_full_disk_during_a_checkpoint_is_one_line_naming_out(tmp_path, corpus):
    """A file size limit (as a full disk) met while torch.save writes a checkpoint: one `error:` line naming --out
    (not torch's `RuntimeError: [enforce fail at inline_container.cc]`), exit 2, --out marked unfinished."""

    def limit():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))  # the weights fit, the optimizer state does not

    out = tmp_path / "run"
    sets = [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharebert",
            "pretrain",
            "--preset",
            "sharebert-tiny",
            *sets,
            "--train",
            str(corpus),
            "--out",
            str(out),
            "--max-steps",
            "2",
            "--save-steps",
            "1",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--no-progress",
        ],
        cwd=REPO,
        preexec_fn=limit,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    assert "error: no space left on the device" in err[0] and f"while writing {out}" in err[0], err
    assert (out / ".sharebert_unfinished").is_file()
