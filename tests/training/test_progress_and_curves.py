"""Progress in logs that are not a terminal (plain lines, no bar codes) and training curves (curves.png,
`sharebert plot`)."""

import json
import re

import pytest

from sharebert.accounting.curves import _series, read_log
from sharebert.formats.build import build_model
from sharebert.formats.paths import data_path
from sharebert.training.finetune import FinetuneArgs, finetune
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-step SST-2 fine-tune with progress on, its standard error captured (not a terminal)."""
    root = tmp_path_factory.mktemp("run")
    build_model("sharebert-tiny", root / "base", TINY, seed=0)
    return root


def test_finetune_logs_plain_lines_and_draws_curves(run, capfd):
    args = FinetuneArgs(
        max_steps=6, max_train_samples=96, max_eval_samples=64, batch_size=16, lr=1e-3, warmup_steps=1, eval_steps=3
    )
    finetune(run / "base", "sst2", run / "ft", data_path("glue", "SST-2"), args, progress=True)
    captured = capfd.readouterr()
    err = captured.err
    assert "{'loss'" not in captured.out and "{'eval_loss'" not in captured.out  # no second copy as dictionaries
    lines = [ln for ln in err.splitlines() if ln.startswith("step ")]
    assert "\r" not in err and "\x1b[" not in err  # no bar redraws, no cursor codes
    # a train log and an eval log every 3 steps, then the run's summary
    assert [int(re.match(r"step (\d+)/6 ", ln).group(1)) for ln in lines] == [3, 3, 6, 6, 6] and "train_loss" in lines[
        -1
    ]
    assert all(re.search(r"steps/s ETA \d+m\d\ds", ln) for ln in lines)
    assert re.search(r"loss \d+\.\d{4} lr \d\.\d\de-\d\d", lines[0]) and "eval_accuracy" in lines[1]
    assert (run / "ft" / "curves.png").read_bytes()[:8] == PNG


@pytest.mark.slow  # reads the fine-tune of the test above (slow, in the same file), so runs in its tier
def test_plot_command_redraws_from_either_log(run, tmp_path, capsys):
    history = json.loads((run / "ft" / "log_history.json").read_text())
    events = read_log(run / "ft")
    assert _series(events, "eval_loss")[0] == [h["step"] for h in history if "eval_loss" in h] == [3, 6]
    assert main(["plot", str(run / "ft"), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "log.jsonl").write_text(
        "\n".join(
            json.dumps(e)
            for e in (
                {"step": 1, "loss": 9.1, "learning_rate": 1e-4},
                {"step": 2, "loss": None},
                {"step": 2, "eval_loss": 8.7},
            )
        )
        + "\n"
    )
    assert _series(read_log(pre), "loss") == ([1], [9.1])  # a non-finite loss is logged as null and left out
    assert main(["plot", str(pre)]) == 0 and (pre / "curves.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: None, "holds no log.jsonl or log_history.json"),
        (lambda d: (d / "log.jsonl").write_text("{not json\n"), "log.jsonl line 1 is not valid JSON"),
        (
            lambda d: (d / "log_history.json").write_text("[" * 100_000),
            "log_history.json is not valid JSON (nested too deeply)",
        ),
        (lambda d: (d / "log_history.json").write_text('{"step": 1}'), "expected log events"),
        (lambda d: (d / "log.jsonl").write_text('{"step": 1, "learning_rate": 0.1}\n'), "holds no loss yet"),
    ],
)
def test_plot_bad_input(tmp_path, capsys, setup, message):
    setup(tmp_path)
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "curves.png").exists()


def test_a_time_bounded_run_anneals_its_learning_rate_and_counts_progress_by_time(capsys, stepped_clock):
    """`--max-time` without `--max-steps`: the learning rate warms up by steps, then falls linearly to 0 as the
    clock is spent, the warmup over after 10 steps or 5% of the time (compress and `distill --objective embedding`
    follow it), and progress lines count time."""
    import io
    from types import SimpleNamespace

    from sharebert.training.callbacks import WallClockLimit
    from sharebert.training.log_lines import LogLines

    clock = WallClockLimit(100.0)
    assert clock.spent() == 0.0 and clock.lr_factor(0, 10) == pytest.approx(0.1)  # before train begin
    clock._start = stepped_clock.now - 50.0
    assert clock.lr_factor(1000, 10) == pytest.approx(0.5, abs=0.01)
    assert clock.lr_factor(4, 10) == pytest.approx(0.5, abs=0.01)  # 5% of the time ends the warmup too
    clock._start = stepped_clock.now - 2.5
    assert clock.lr_factor(0, 10) == pytest.approx(0.5 * 0.975, abs=0.01)  # warmup (by time) and decay multiply
    assert clock.lr_factor(4, 10) == pytest.approx(0.5 * 0.975, abs=0.01)
    assert clock.lr_factor(7, 10) == pytest.approx(0.8 * 0.975, abs=0.01)  # by steps, where they are ahead
    clock._start = stepped_clock.now - 150.0
    assert clock.spent() == 1.0 and clock.lr_factor(1000, 10) == 0.0
    clock._start = stepped_clock.now - 25.0
    stream = io.StringIO()
    lines = LogLines(stream=stream, clock=clock)
    lines.on_train_begin(None, SimpleNamespace(global_step=0), None)
    lines.on_log(
        None, SimpleNamespace(is_world_process_zero=True, global_step=50, max_steps=10**6), None, logs={"loss": 0.5}
    )
    line = stream.getvalue().strip()
    assert re.fullmatch(r"step 50 \(25% of 1m40s\) loss 0\.5000 [0-9.]+ steps/s ETA 1m1[45]s", line), line


def test_the_clock_stops_at_train_end(stepped_clock):
    """What follows training (the final scoring of the best model) is not counted in train_seconds."""
    from types import SimpleNamespace

    from sharebert.training.callbacks import WallClockLimit

    clock, state = WallClockLimit(100.0), SimpleNamespace(stateful_callbacks={})
    clock.on_train_begin(None, state, None)
    clock._start -= 5.0
    clock.on_train_end(None, state, None)
    used = clock.used()
    stepped_clock.now += 50.0  # the test's clock: the time after train end
    assert used == 5.0 and clock.used() == used


@pytest.mark.parametrize(
    "saved, spent",
    [
        ({"WallClockLimit": {"args": {"seconds": 100.0}, "attributes": {"used_seconds": 60.0}}}, 0.6),  # a resume
        ({}, 0.0),  # a checkpoint without the clock's state: a fresh clock
        ({"WallClockLimit": {"args": {}, "attributes": {"used_seconds": float("nan")}}}, 0.0),  # nonsense: ignored
        ({"WallClockLimit": {"args": {}, "attributes": {"used_seconds": "abc"}}}, 0.0),
        ({"WallClockLimit": {"args": {}, "attributes": {"used_seconds": {"x": 1}}}}, 0.0),
        ({"WallClockLimit": ["not", "a", "dict"]}, 0.0),
        ({"WallClockLimit": {"args": {}, "attributes": {"used_seconds": 500.0}}}, 1.0),  # spent: anneals at once
    ],
)
def test_a_resumed_clock_goes_on_from_the_seconds_its_checkpoint_kept(saved, spent, stepped_clock):
    """--resume of a time-bounded run (compress, distill --objective embedding, pretrain): the checkpoint's
    trainer state keeps the seconds used, so the clock and the learning rate that follows it continue where the
    run stopped rather than starting over at the peak rate with a fresh budget; what it saves next counts both."""
    from types import SimpleNamespace

    from sharebert.training.callbacks import WallClockLimit

    clock, state = WallClockLimit(100.0), SimpleNamespace(stateful_callbacks=dict(saved))
    clock.on_train_begin(None, state, None)
    assert clock.spent() == pytest.approx(spent, abs=0.01)
    assert clock.lr_factor(10**6, 10) == pytest.approx(1.0 - spent, abs=0.01)
    kept = state.stateful_callbacks["WallClockLimit"]  # what the next checkpoint writes starts from it
    assert kept["args"] == {"seconds": 100.0} and kept["attributes"]["used_seconds"] == pytest.approx(
        min(spent, 1.0) * 100.0 if spent < 1.0 else 500.0, abs=1.0
    )
