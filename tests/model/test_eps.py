"""EPS column plan, generation layout and the generic Linear replacement."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sharebert.model.eps import ColumnPlan, EPSLinear, generate_from_source, generate_virtual, share_linears_


def test_plan_takes_ceil_columns_right_to_left():
    plan = ColumnPlan.build(10, 8, [("A", (4, 4)), ("B", (5, 5))])  # paper Fig. 1: L_A=16, L_B=25
    a, b = plan.slot("A"), plan.slot("B")
    assert (a.num_columns, b.num_columns) == (2, 3)  # ceil(16/10), ceil(25/10)
    assert (a.first_column, b.first_column) == (6, 3)  # A takes the right-most block
    assert (a.unused, b.unused) == (4, 5)  # delta = G*E - L
    assert plan.columns_used == 5 and plan.first_column == 3


@pytest.mark.parametrize("E,W", [(7, 40), (50, 12), (16, 16)])
def test_generated_entry_follows_the_documented_formula(E, W):
    targets = [("q", (3, 5)), ("ffn", (6, 2)), ("o", (4, 4))]
    need = sum(math.ceil(r * c / E) for _, (r, c) in targets)
    if need > W:
        pytest.skip("does not fit")
    plan = ColumnPlan.build(E, W, targets)
    M = torch.randn(E, W)
    weights = generate_from_source(plan, M)
    for name, (rows, cols) in targets:
        assert weights[name].shape == (rows, cols)
        for i in range(rows):
            for j in range(cols):
                r, c = plan.source_index(name, i, j)
                assert weights[name][i, j] == M[r, c]


def test_targets_fill_top_to_bottom_column_after_column():
    plan = ColumnPlan.build(4, 5, [("t", (3, 3))])  # 9 entries, 3 columns of 4
    M = torch.arange(20.0).view(4, 5)
    t = generate_from_source(plan, M)["t"]
    # columns 2, 3, 4 read top to bottom: 2,7,12,17 | 3,8,13,18 | 4 ... (rest unused)
    assert t.flatten().tolist() == [2, 7, 12, 17, 3, 8, 13, 18, 4]


def test_virtual_generation_equals_eps_on_the_full_virtual_matrix():
    E, Fd, V = 50, 6, 40
    plan = ColumnPlan.build(E, V, [("a", (8, 8)), ("b", (16, 8)), ("c", (8, 16))])
    A, P, p = torch.randn(E, Fd), torch.randn(Fd, V), torch.randn(V)
    got = generate_virtual(plan, A, P, p)
    want = generate_from_source(plan, A @ P + p)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_over_budget_names_the_shortfall_and_the_ways_out():
    with pytest.raises(ValueError) as e:
        ColumnPlan.build(10, 4, [("a", (5, 5)), ("b", (5, 5))])  # 3 + 3 columns > 4
    msg = str(e.value)
    assert "need 6 columns" in msg and "only 4 are available" in msg and "short by 2" in msg
    assert "veps" in msg and "attention variant" in msg


def test_generation_backward_is_exact_and_skips_unused_entries():
    plan = ColumnPlan.build(10, 8, [("A", (4, 4)), ("B", (5, 5))])
    M = torch.randn(10, 8, requires_grad=True)
    w = generate_from_source(plan, M)
    (w["A"].sum() * 2 + w["B"].sum()).backward()
    expected = torch.zeros(10, 8)
    for name, scale in (("A", 2.0), ("B", 1.0)):
        s = plan.slot(name)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                expected[plan.source_index(name, i, j)] += scale
    torch.testing.assert_close(M.grad, expected)
    assert M.grad[:, : plan.first_column].abs().sum() == 0


def test_share_linears_on_every_linear_of_a_transformer():
    torch.manual_seed(0)
    d = 16
    model = nn.Transformer(
        d_model=d,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=32,
        dropout=0.0,
        batch_first=True,
    )
    dense = copy.deepcopy(model)
    embedding = nn.Parameter(torch.randn(1000, 64) * 0.1)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    plan = share_linears_(model, embedding)
    assert sorted(s.name for s in plan.slots) == sorted(linears)
    for name in linears:
        assert isinstance(model.get_submodule(name), EPSLinear)

    src, tgt = torch.randn(2, 5, d), torch.randn(2, 4, d)
    out = model(src, tgt)
    # Every EPS layer computes F.linear with the planned weight ...
    with torch.no_grad():
        weights = generate_from_source(plan, embedding)
        for name in linears:
            layer = model.get_submodule(name)
            x = torch.randn(3, weights[name].shape[1])
            torch.testing.assert_close(layer(x), F.linear(x, weights[name], layer.bias))
        # ... and the whole model equals the dense one holding the generated weights.
        for name in linears:
            dense.get_submodule(name).weight.copy_(weights[name])
        torch.testing.assert_close(out, dense(src, tgt))
    out.pow(2).mean().backward()
    assert embedding.grad is not None and embedding.grad[:, plan.first_column :].abs().sum() > 0
    assert embedding.grad[:, : plan.first_column].abs().sum() == 0
    # The learned biases stayed parameters of the model; the weights are not.
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.endswith(f"{lin}.weight") for lin in linears for n in names)
    assert all(f"{lin}.bias" in names for lin in linears)


def test_share_linears_refuses_a_too_narrow_embedding():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    with pytest.raises(ValueError, match="column budget exceeded"):
        share_linears_(model, nn.Parameter(torch.randn(100, 50)))


def test_without_keeps_every_other_target_in_place():
    plan = ColumnPlan.build(10, 8, [("A", (4, 4)), ("B", (5, 5))])  # B is planned last: the left-most block
    smaller = plan.without("B")
    assert smaller.slot("A") == plan.slot("A") and smaller.columns_used == 2 and smaller.first_column == 6
    with pytest.raises(ValueError, match="only the left-most"):
        plan.without("A")
