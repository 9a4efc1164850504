"""Budget planner: size parsing, feasibility, the Pareto front, the no-fit explanation, the CLI and plot."""

import pytest

from sharebert.accounting.budget import parse_size, search_candidates
from sharebert.accounting.counts import count_params
from sharebert_runtime.main import main


def test_parse_size():
    assert parse_size("10M") == 10e6 and parse_size("20MB") == 20e6 and parse_size("1.5G") == 1.5e9
    assert parse_size("64MiB") == 64 * 2**20 and parse_size("512") == 512 and parse_size("3kb") == 3000
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("ten")


def _dominates(o, c):
    return (
        o.params >= c.params
        and o.ram_bytes <= c.ram_bytes
        and o.gflops <= c.gflops
        and (o.params, o.ram_bytes, o.gflops) != (c.params, c.ram_bytes, c.gflops)
    )


def test_front_is_feasible_and_pareto():
    r = search_candidates({"max_params": 10e6, "max_ram": 200e6}, "fp16")
    feasible = [c for c in r["all"] if c.params <= 10e6 and c.ram_bytes <= 200e6]
    assert r["feasible"] == len(feasible) > 0 and r["front"]
    assert r["fits"] == [c.params <= 10e6 and c.ram_bytes <= 200e6 for c in r["all"]]  # what the plot fades
    front = set(map(id, r["front"]))
    for c in feasible:
        beaten = any(_dominates(o, c) for o in feasible)
        assert beaten == (id(c) not in front)
    small = next(c for c in r["all"] if c.name == "sharebert-small")  # fp16: 2 bytes per learned and generated number
    n = count_params(small.config)
    assert small.ram_bytes == 2 * (n["learned_params"] + n["generated_params"]) and small in r["presets"]


def test_nothing_fits_names_the_constraint():
    r = search_candidates({"max_params": 20e6, "max_gflops": 0.01})
    smallest = min(c.gflops for c in r["all"] if c.params <= 20e6)
    assert r["feasible"] == 0 and "GFLOPs per forward" in r["blocking"]
    assert f"{smallest / 0.01:.2f}x the limit" in r["blocking"] and "learned parameters" not in r["blocking"]


def test_budget_cli_and_plot(tmp_path, capsys):
    png = tmp_path / "budget.png"
    assert main(["budget", "--max-bytes", "20MB", "--dtype", "int8", "--top", "3", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "heads=" in line]
    assert len(rows) == 3 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["budget", "--max-params", "1k"]) == 0
    assert "rules out every candidate on its own" in capsys.readouterr().out
    assert main(["budget", "--max-params", "lots"]) == 2
