"""The pictures of the accounting layer (budget --plot, curves.png) in the house style of accounting/picture.py:
each written as a PNG that reads at 1,200 pixels wide, the caller's matplotlib settings left as they were."""

import sys

import pytest
from pictures import assert_readable_png

from sharebert.accounting.budget import pareto_front, plot, score
from sharebert.accounting.curves import measured_on, plot_curves
from sharebert.accounting.picture import figure, pyplot, save
from sharebert.model.shape import PRESETS


def _presets_result(max_params: float) -> dict:
    """A budget result over the paper's presets alone (the full grid's search takes tens of seconds)."""
    cands = score([(n, dict(p)) for n, p in PRESETS.items() if not p.get("is_decoder")], "fp32", 128)
    fits = [c.params <= max_params for c in cands]
    feasible = [c for c, ok in zip(cands, fits) if ok]
    return dict(
        all=cands,
        fits=fits,
        front=pareto_front(feasible),
        feasible=len(feasible),
        total=len(cands),
        limits={"max_params": max_params},
        dtype="fp32",
        seq_len=128,
    )


def test_budget_picture_reads_at_full_width(tmp_path):
    result = _presets_result(10e6)
    assert 0 < result["feasible"] < result["total"]  # both sides of the limit are drawn
    plot(result, tmp_path / "budget.png")
    assert_readable_png(tmp_path / "budget.png")


EVENTS = [
    {"step": 10, "loss": 0.70, "learning_rate": 9e-4},
    {"step": 10, "eval_loss": 0.72},
    {"step": 20, "loss": 0.66, "learning_rate": 6e-4},
    {"step": 20, "eval_loss": 0.69},
    {"step": 30, "loss": 0.61, "learning_rate": 3e-4},
    {"step": 30, "eval_loss": 0.67},
]


@pytest.mark.parametrize("distill", [False, True], ids=["finetune", "distill"])
def test_curves_picture_reads_at_full_width(tmp_path, distill):
    events = [
        dict(e, loss_hard=e["loss"] * 1.2, loss_kl=e["loss"] / 2) if "loss" in e and distill else e for e in EVENTS
    ]
    width, height = assert_readable_png(plot_curves(events, tmp_path / "curves.png", title="runs/ft"))
    assert height > width / 2  # a panel per series, stacked: the distillation objective's panel too


def test_the_house_style_leaves_the_callers_settings_and_no_figure_open(tmp_path):
    plt = pyplot()
    before = dict(plt.rcParams)
    with figure(3, ncols=2) as (fig, axes):
        assert axes.shape == (1, 2) and plt.rcParams["font.size"] == 11
        axes[0, 0].plot([0, 1], [0, 1])
        save(fig, tmp_path / "two.png")
    assert dict(plt.rcParams) == before and plt.get_fignums() == []
    assert_readable_png(tmp_path / "two.png")


def test_without_matplotlib_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ValueError, match=r"needs matplotlib: pip install 'sharebert\[plot\]'"):
        plot_curves(EVENTS, tmp_path / "curves.png")
    assert not (tmp_path / "curves.png").exists()


def test_curves_say_what_the_losses_were_measured_on():
    finetune = {"task": "sst2", "train_samples": 2000, "eval_samples": 200, "accuracy": 0.5}
    assert measured_on(finetune) == "sst2: 2,000 training examples, validation on 200 dev examples"
    pretrain = {"train_sequences": 5120, "valid_sequences": 64, "seq_len": 128, "global_step": 10}
    assert measured_on(pretrain) == "5,120 training sequences of 128 tokens, validation on 64 held-out sequences"
    assert measured_on({"task": "cola", "eval_samples": True}) == "cola"  # a flag is not a count
    assert measured_on(None) == measured_on({}) == measured_on([1]) == ""
