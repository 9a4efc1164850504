"""evaluate glue --depths --plot's picture (training/depth_table.plot_depths) from a depth table's result: a PNG
that reads at 1,200 pixels wide, from a table with or without the CPU its latencies came from."""

import pytest
from pictures import assert_readable_png

from sharebert.training.depth_table import plot_depths
from sharebert_runtime.cpu import cpu_info


def _table(**extra) -> dict:
    rows = [
        {"depth": d, "accuracy": acc, "p50_ms": ms, "metric_vs_full": acc - 0.49, "latency_vs_full": ms / 22.1}
        for d, acc, ms in ((1, 0.509, 4.0), (2, 0.509, 14.3), (4, 0.491, 22.1))
    ]
    return dict(
        task="sst2",
        metric="accuracy",
        backend="pytorch",
        layers=4,
        eval_samples=872,
        latency_samples=50,
        threads=1,
        rows=rows,
        **extra,
    )


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "table-before-the-cpu-field"])
def test_depth_picture_reads_at_full_width(tmp_path, cpu):
    path = plot_depths(_table(**({"cpu": cpu_info()} if cpu else {})), tmp_path / "depths.png")
    assert path == tmp_path / "depths.png"
    assert_readable_png(path)
