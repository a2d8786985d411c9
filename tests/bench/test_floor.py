import json

import pytest
import torch

from gpscale.bench.floor import (EPOCH_STEPS, FLOOR_CASES, FloorCase, count_flops, count_flops_by_dtype, count_work,
                                  floor_seconds, matmul_rate, measure, operator_seconds, random_problem,
                                  trainer_step)
from gpscale.cli import main
from gpscale.models import available_methods

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64


def test_products_factorisations_and_solves_are_counted_by_their_textbook_flops():
    a, b = torch.randn(30, 20, dtype=F64), torch.randn(20, 10, dtype=F64)
    assert count_flops(lambda: a @ b) == 2 * 30 * 20 * 10
    # products accumulated in place (a sum of chunks' Gram matrices), plain and batched
    assert count_flops(lambda: torch.zeros(20, 20, dtype=F64).addmm_(a.T, a)) == 2 * 20 * 30 * 20
    a3, b3 = a.expand(3, 30, 20), b.expand(3, 20, 10)
    assert count_flops(lambda: torch.zeros(3, 30, 10, dtype=F64).baddbmm_(a3, b3)) == 3 * 2 * 30 * 20 * 10
    A = torch.eye(12, dtype=F64) * 3 + 0.1
    L = torch.linalg.cholesky(A)
    assert count_flops(lambda: torch.linalg.cholesky(A)) == 12**3 // 3
    R = torch.randn(12, 5, dtype=F64)
    assert count_flops(lambda: torch.linalg.solve_triangular(L, R, upper=False)) == 12 * 12 * 5
    assert count_flops(lambda: torch.linalg.solve_triangular(L.T, R.T, upper=True, left=False)) == 12 * 12 * 5
    assert count_flops(lambda: torch.cholesky_solve(R, L)) == 2 * 12 * 12 * 5
    assert count_flops(lambda: torch.linalg.solve(A, R)) == 2 * 12**3 // 3 + 2 * 12 * 12 * 5


def test_each_dtypes_flops_are_charged_at_that_dtypes_rate():
    a32, b64 = torch.randn(30, 20), torch.randn(20, 10, dtype=F64)
    flops = count_flops_by_dtype(lambda: (a32 @ a32.T, b64.T @ b64))
    assert flops == {torch.float32: 2 * 30 * 20 * 30, torch.float64: 2 * 10 * 20 * 10}
    assert floor_seconds(flops, {"float32": 1e9, "float64": 1e8}) == pytest.approx(36e3 / 1e9 + 4e3 / 1e8)


def test_the_backward_pass_is_counted_too():
    a = torch.randn(30, 20, dtype=F64, requires_grad=True)
    b = torch.randn(20, 10, dtype=F64, requires_grad=True)
    assert count_flops(lambda: (a @ b).sum().backward()) == 3 * 2 * 30 * 20 * 10  # forward, then one per operand


def test_operators_are_counted_but_not_views():
    a = torch.randn(30, 20, dtype=F64)
    # mm, exp, the copy of reshape (of a transpose) and sum; the transposes and reshape's view compute nothing
    flops, operators = count_work(lambda: (a.T @ a).exp().T.reshape(-1).sum())
    assert operators == 4 and flops == {F64: 2 * 20 * 30 * 20}
    assert count_work(lambda: a.T.reshape(2, -1).view(-1).unsqueeze(0)[:, :5].expand(3, 5))[1] == 1  # the copy


def test_the_least_operator_time_is_microseconds():
    assert 1e-8 < operator_seconds(calls=200, repeats=2) < 1e-4  # per call: 200 calls take longer than 1e-4 s


def test_every_gradient_trained_method_has_a_small_and_a_paper_size():
    sizes = {(c.method, c.size) for c in FLOOR_CASES}
    for method in set(available_methods()) - {"grief-i"}:  # GP-GRIEF-I samples by MCMC: no gradient step
        assert {(method, "small"), (method, "paper")} <= sizes


@pytest.mark.parametrize("case", [FloorCase("svgp", 300, 3, {"n_inducing": 20}, 64),
                                  FloorCase("sgpr", 300, 3, {"n_inducing": 20})], ids=["minibatch", "full batch"])
def test_a_measurement_gives_flops_seconds_and_their_ratio_for_each_phase(case):
    operator_s = 2e-6
    row = measure(case, {"float32": matmul_rate(torch.float32, size=256), "float64": matmul_rate(F64, size=256)},
                  operator_s, repeats=2)
    assert row["rows per step"] == (64 if case.method == "svgp" else 300)
    # a minibatch step is the mean of an epoch: as many batches as the 300 rows hold, at most EPOCH_STEPS
    assert row["steps per epoch"] == (min(EPOCH_STEPS, 300 // 64) if case.method == "svgp" else 1)
    for phase, per in (("step", 1), ("posterior", 1), ("predict", 300)):
        numbers = row[phase]
        assert numbers["gflop"] > 0 and numbers["seconds"] > 0 and numbers["operators"] > 10
        assert numbers["ratio"] == pytest.approx(numbers["seconds"] / numbers["floor_s"])
        with_operators = numbers["floor_s"] + numbers["operators"] * operator_s / per
        assert numbers["operator floor_s"] == pytest.approx(with_operators)
        assert numbers["operator ratio"] == pytest.approx(numbers["seconds"] / numbers["operator floor_s"])


def test_a_minibatch_step_is_the_mean_step_of_an_epoch():
    """SoftKI's steps are alike in their work: the mean step of the measured epoch (four batches of 64 from 300 rows)
    has the FLOPs and operators of an epoch of one step, but for the epoch's own bookkeeping, shared by its steps."""
    case = FloorCase("softki", 300, 3, {"n_inducing": 20}, 64)
    row = measure(case, {"float32": 1e10, "float64": 1e10}, 1e-6, repeats=1)
    assert row["steps per epoch"] == 4
    model, X, y, g = random_problem(case.method, case.n, case.d, case.options, torch.float32)
    step = trainer_step(model, g)
    one_step = count_work(lambda: step(X[:64], y[:64]))
    four_steps = count_work(lambda: step(X[:256], y[:256], 64))
    assert row["step"]["gflop"] * 1e9 == pytest.approx(sum(four_steps[0].values()) / 4)
    assert sum(four_steps[0].values()) == pytest.approx(4 * sum(one_step[0].values()))
    assert row["step"]["operators"] == pytest.approx(four_steps[1] / 4)
    assert one_step[1] < row["step"]["operators"] * 1.5  # not four steps' operators charged to one


def test_bench_protocol_floor_writes_its_table(tmp_path, capsys):
    assert main(["bench", "--protocol", "floor", "--methods", "exact", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "floor.md").read_text()
    assert "| exact | small | 500 |" in page and "| exact | paper | 2,000 |" in page and "GFLOP/s" in page
    assert "x floor with operators" in page and "the least time of one operator" in page
    assert [r["size"] for r in json.loads((tmp_path / "floor.json").read_text())["rows"]] == ["small", "paper"]
    assert "floor" in capsys.readouterr().out
