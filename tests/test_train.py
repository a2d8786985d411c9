import math
import warnings
from dataclasses import replace
from unittest.mock import patch

import numpy as np
import pytest
import torch
from threadpoolctl import ThreadpoolController

from conftest import toy_regression
from gpscale import lbfgs
from gpscale.likelihoods import Bernoulli, Gaussian, RobustMax
from gpscale.linalg import NotPSDError
from gpscale.models.linear.sgpr import SGPR
from gpscale.models.variational.svgp import SVGP
from gpscale.defaults import Convergence
from gpscale.distributed import LOCAL
from gpscale.models import get_model_class
from gpscale.train import TrainingError, fit, progress_bar
from gpscale.train.convergence import Plateau, cuts_due, lbfgs_plateaued
from gpscale.train.progress import LinesPerMinute


def sgpr(d=2, m=10, **kw):
    return SGPR(d, n_inducing=m, **kw).double()


def test_training_increases_the_bound_and_fits_the_posterior():
    X, y = toy_regression(n=150)
    model = sgpr(m=20)
    result = fit(model, X, y, epochs=60, lr=0.1, progress=False)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0] - 0.1
    assert model.cache  # posterior ready
    mean, _ = model.predict(X)
    assert torch.sqrt(((mean - y) ** 2).mean()) < 0.2  # noise std is 0.1


def test_same_seed_gives_identical_training_and_other_seed_differs():
    X, y = toy_regression(n=120)
    runs = []
    for seed in (0, 0, 1):
        model = SVGP(2, n_inducing=8).double()
        fit(model, X, y, epochs=3, batch_size=32, lr=0.05, seed=seed, progress=False)
        runs.append(model.q_mu.detach().clone())
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert not torch.allclose(runs[0], runs[2])


def spy_on_batches(model, num_data: int) -> list:
    """The list into which each call of ``model.loss`` puts its rows, checking that the loss is of ``num_data``
    rows and that this process holds the whole batch."""
    seen, expected = [], num_data
    original = model.loss

    def spy(xb, yb, num_data, comm, share):
        seen.append(xb)
        assert num_data == expected and share == 1.0
        return original(xb, yb, num_data, comm, share)

    model.loss = spy
    return seen


def test_minibatches_cover_every_point_once_per_epoch():
    X, y = toy_regression(n=50)
    model = SVGP(2, n_inducing=4).double()
    seen = spy_on_batches(model, num_data=50)
    fit(model, X, y, epochs=2, batch_size=16, progress=False)
    first_epoch = torch.cat(seen[:4])
    assert len(seen) == 8 and [len(b) for b in seen[:4]] == [16, 16, 16, 2]
    assert sorted(first_epoch[:, 0].tolist()) == sorted(X[:, 0].tolist())
    assert not torch.equal(torch.cat(seen[:4]), torch.cat(seen[4:]))  # reshuffled


def test_training_to_convergence_on_many_rows_takes_rounds_of_fresh_samples_and_steps_the_rate_down():
    X, y = toy_regression(n=200)
    model = SVGP(2, n_inducing=4).double()
    seen = spy_on_batches(model, num_data=200)  # the loss is still the whole data's
    # an epoch would take 20 steps of 10 rows; rounds take 3, of 30 rows drawn without replacement
    rule = Convergence(minibatch_round=3, minibatch_window=3, patience=1, minibatch_tol=1.0)
    result = fit(model, X, y, batch_size=10, max_steps=30, lr=0.01, progress=False, convergence=rule)
    assert [h["step"] for h in result.history] == [3 * (i + 1) for i in range(len(result.history))]
    assert len(seen) == 3 * len(result.history) and all(len(b) == 10 for b in seen)
    first_round = torch.cat(seen[:3])[:, 0]
    assert len(set(first_round.tolist())) == 30  # without replacement within a round
    assert not torch.equal(first_round, torch.cat(seen[3:6])[:, 0])  # a fresh sample each round
    # a tolerance no window meets after the first: the rate is cut twice, then training stops, before the cap
    assert [h["lr"] for h in result.history] == pytest.approx([0.01, 0.01, 1e-3, 1e-4])
    assert result.converged


def test_the_optimiser_takes_the_models_parameter_groups():
    X, y = toy_regression(n=40)
    model = sgpr(learn_inducing=False)
    seen = []
    adam = torch.optim.Adam

    def spy(groups, **kwargs):
        seen.append(groups)
        return adam(groups, **kwargs)

    with patch("torch.optim.Adam", spy):
        fit(model, X, y, epochs=1, progress=False)
    # the default: one group of every trainable parameter (the frozen inducing points excluded), Adam's defaults
    assert len(seen[0]) == 1 and seen[0][0]["weight_decay"] == 0
    assert {id(p) for p in seen[0][0]["params"]} == {id(p) for p in model.parameters() if p.requires_grad}
    assert all(p is not model.features.Z for p in seen[0][0]["params"])
    groups = [{"params": [model.likelihood.raw_noise], "weight_decay": 0.5}]
    with patch.object(model, "parameter_groups", return_value=groups), patch("torch.optim.Adam", spy):
        fit(model, X, y, epochs=1, progress=False)
    assert seen[1] is groups


def test_cosine_schedule_anneals_learning_rate():
    X, y = toy_regression(n=60)
    result = fit(sgpr(), X, y, epochs=10, lr=0.1, schedule="cosine", progress=False)
    lrs = [h["lr"] for h in result.history]
    assert lrs[0] < 0.1 and lrs[-1] == pytest.approx(0.0, abs=1e-12) and lrs == sorted(lrs, reverse=True)


def test_early_stopping_restores_the_best_validation_state():
    X, y = toy_regression(n=200)
    model = sgpr()
    result = fit(model, X, y, epochs=200, lr=0.3, val_fraction=0.2, patience=3, progress=False)
    nlpds = [h["val_nlpd"] for h in result.history]
    assert result.stopped_early and len(nlpds) < 200
    assert result.best_epoch == min(range(len(nlpds)), key=nlpds.__getitem__)
    assert result.best_epoch == len(nlpds) - 1 - 3


def test_validation_every_k_epochs_counts_patience_in_epochs():
    X, y = toy_regression(n=200)
    result = fit(sgpr(), X, y, epochs=200, lr=0.3, val_fraction=0.2, patience=6, val_every=3, progress=False)
    checked = [h["epoch"] for h in result.history if "val_nlpd" in h]
    assert checked == list(range(2, len(result.history), 3))
    assert result.stopped_early and result.best_epoch in checked
    assert result.history[-1]["epoch"] - result.best_epoch == 6


def test_restart_after_not_psd_error_then_success():
    X, y = toy_regression(n=60)
    model = sgpr()
    calls = {"n": 0}
    original = model.loss

    def flaky(xb, yb, num_data, comm, share):
        calls["n"] += 1
        if calls["n"] == 2:
            raise NotPSDError("simulated")
        return original(xb, yb, num_data, comm, share)

    model.loss = flaky
    with pytest.warns(RuntimeWarning, match="restarting"):
        result = fit(model, X, y, epochs=5, progress=False)
    assert result.restarts == 1 and result.epochs_run == 5


def test_gives_up_with_a_remedy_after_max_restarts():
    X, y = toy_regression(n=60)
    model = sgpr()
    model.loss = lambda *args, **kwargs: torch.tensor(float("nan"), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TrainingError, match="smaller lr"):
            fit(model, X, y, epochs=3, max_restarts=2, progress=False)


def test_checkpoint_resume_continues_where_training_stopped(tmp_path):
    X, y = toy_regression(n=100)
    path = tmp_path / "ckpt.pt"
    straight = SVGP(2, n_inducing=6).double()
    fit(straight, X, y, epochs=6, batch_size=25, lr=0.05, progress=False)
    first = SVGP(2, n_inducing=6).double()
    fit(first, X, y, epochs=3, batch_size=25, lr=0.05, progress=False, checkpoint=path)
    resumed = SVGP(2, n_inducing=6).double()
    result = fit(resumed, X, y, epochs=6, batch_size=25, lr=0.05, progress=False, checkpoint=path, resume=True)
    assert result.epochs_run == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        if torch.is_tensor(a):
            torch.testing.assert_close(a, b, msg=name)


def test_a_fit_to_convergence_resumes_only_with_its_own_cap(tmp_path):
    """The cool-down takes the last part of the cap: resumed with another, the rates would be neither fit's."""
    from gpscale.checkpoint import CheckpointError

    X, y = toy_regression(n=100)
    path = tmp_path / "ckpt.pt"
    settings = dict(batch_size=25, lr=0.05, progress=False, checkpoint=path, patience=1000)
    fit(SVGP(2, n_inducing=6).double(), X, y, max_steps=20, **settings)
    with pytest.raises(CheckpointError, match="max_steps"):
        fit(SVGP(2, n_inducing=6).double(), X, y, max_steps=40, resume=True, **settings)
    assert fit(SVGP(2, n_inducing=6).double(), X, y, max_steps=20, resume=True, **settings).steps == 20


def test_an_untrainable_model_skips_the_optimiser_and_fits_its_posterior():
    X, y = toy_regression(n=60)
    model = sgpr()
    model.trainable = False

    def never(*args, **kwargs):
        raise AssertionError("an untrainable model's loss must not be evaluated")

    model.loss = never
    result = fit(model, X, y, epochs=5, val_fraction=0.2, progress=False)
    assert result.epochs_run == 0 and model.cache


def test_lbfgs_reaches_the_stationary_point_adam_approaches():
    X, y = toy_regression(n=150)
    adam, quasi_newton = sgpr(learn_inducing=False), sgpr(learn_inducing=False)
    quasi_newton.load_state_dict(adam.state_dict())
    fit(adam, X, y, epochs=30, lr=0.05, progress=False)
    result = fit(quasi_newton, X, y, epochs=200, optimizer="lbfgs", progress=False)
    assert result.epochs_run < 200 and result.history[-1]["loss"] <= min(h["loss"] for h in result.history)
    with torch.no_grad():
        final = quasi_newton.loss(X, y, num_data=X.shape[0])
        assert final < adam.loss(X, y, num_data=X.shape[0])
    quasi_newton.train()
    loss = quasi_newton.loss(X, y, num_data=X.shape[0])
    grads = torch.autograd.grad(loss, [p for p in quasi_newton.parameters() if p.requires_grad])
    assert max(g.abs().max().item() for g in grads) < 1e-3  # a stationary point of the loss
    assert quasi_newton.cache  # posterior fitted


def test_lbfgs_backtracks_from_points_it_cannot_evaluate_and_keeps_the_best():
    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)

    def loss():  # minimum at 2, but nothing can be evaluated beyond 1 (as a failed Cholesky)
        if x.item() > 1:
            raise NotPSDError("not positive definite")
        return (x - 2).pow(2).sum()

    result = lbfgs.minimise(loss, [x], bounds=[(-10.0, 10.0)], max_iterations=100)
    assert result.evaluated and result.failures > 0
    assert 0.9 < x.item() <= 1  # scipy would have stopped at 0 on an infinite loss

    def never():
        raise NotPSDError("not positive definite")

    x.data.fill_(-3.0)
    result = lbfgs.minimise(never, [x], bounds=[(-10.0, 10.0)], max_iterations=100)
    assert not result.evaluated and x.item() == -3.0


def _scipys_openblas():
    """numpy's and scipy's OpenBLAS (threaded by pthreads), failing where numpy says it has one and none is seen."""
    openblas = ThreadpoolController().select(internal_api="openblas").select(threading_layer="pthreads")
    if not openblas.lib_controllers:
        config = getattr(np.__config__, "CONFIG", {})  # numpy >= 1.26 describes its build; older ones do not
        blas = config.get("Build Dependencies", {}).get("blas", {}).get("name", "an unknown BLAS")
        assert "openblas" not in blas.lower(), f"numpy uses {blas}, which threadpoolctl does not see"
        pytest.skip(f"numpy uses {blas}, not OpenBLAS")
    return openblas


def _threads_seen_by_the_loss(openblas, x, raise_at=None):
    seen = []

    def loss():
        seen.append(({lib.num_threads for lib in openblas.lib_controllers}, torch.get_num_threads()))
        if raise_at is not None and len(seen) == raise_at:
            raise KeyboardInterrupt
        return (x - 1).pow(2).sum()

    lbfgs.minimise(loss, [x])
    return seen


def test_lbfgs_runs_scipys_blas_on_one_thread_and_leaves_torchs_threads():
    # OpenBLAS threads woken by L-BFGS-B's own BLAS calls busy-wait and take the cores from torch's threads, which
    # evaluate the loss (SGPR's fit on two cores 3x slower with them)
    openblas = _scipys_openblas()
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with openblas.limit(limits=2):
        torch_threads = torch.get_num_threads()
        seen = _threads_seen_by_the_loss(openblas, x)
        assert seen and all(threads == {1} and mine == torch_threads for threads, mine in seen)
        assert all(lib.num_threads == 2 for lib in openblas.lib_controllers)  # restored afterwards
        with pytest.raises(KeyboardInterrupt):  # and after an interruption
            _threads_seen_by_the_loss(openblas, x, raise_at=1)
        assert all(lib.num_threads == 2 for lib in openblas.lib_controllers)


def test_lbfgs_leaves_openblas_alone_where_torch_multiplies_with_it(monkeypatch):
    openblas = _scipys_openblas()
    monkeypatch.setattr(lbfgs, "_torch_uses_openblas", lambda: True)
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with openblas.limit(limits=2):
        assert all(threads == {2} for threads, _ in _threads_seen_by_the_loss(openblas, x))


def test_lbfgs_that_can_evaluate_nothing_restarts_then_gives_up():
    X, y = toy_regression(n=60)
    model = sgpr()

    def never(*args, **kwargs):
        raise NotPSDError("simulated")

    model.loss = never
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TrainingError, match="L-BFGS could not evaluate"):
            fit(model, X, y, epochs=5, optimizer="lbfgs", max_restarts=1, progress=False)


def test_progress_in_a_log_file_is_plain_lines_at_most_once_a_minute(capsys):
    bar = progress_bar(range(50), desc="svgp", unit="epoch", enabled=True)  # pytest's stderr is no terminal
    for _ in bar:
        bar.set_postfix(loss=1.0)  # redraws the bar every step
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("svgp:") and "\r" not in lines[0]
    every_redraw = LinesPerMinute(interval=0.0)
    for text in ("\rsvgp: 1/3", "\rsvgp: 2/3", "\r   \r"):
        every_redraw.write(text)
    assert capsys.readouterr().err == "svgp: 1/3\nsvgp: 2/3\n"


# --- training to convergence (epochs=None) ---------------------------------------------------------------------
def test_plateau_rule_waits_cuts_the_learning_rate_then_stops():
    plateau = Plateau(Convergence(tol=0.01, patience=2, lr_cuts=1), patience=None)
    verdicts = [plateau.update(v) for v in (5.0, 4.0, 3.995, 3.99, 3.0, 2.999, 2.998, 2.997)]
    # 3.995 and 3.99 are within 1% of the best: a wait, then the cut; 3.0 improves; the next plateau, after the
    # one cut allowed, stops
    assert verdicts == ["improved", "improved", "wait", "cut", "improved", "wait", "stop", "stop"]


def test_lbfgs_plateau_counts_evaluations_not_iterations():
    rule = Convergence(tol=1e-3, lbfgs_window=10)
    # fewer than ten evaluations in: nothing to compare with yet
    assert not lbfgs_plateaued([(e, 2.0) for e in range(1, 9)], 2.0, 9, rule)
    # one evaluation an iteration: the loss ten iterations back
    steady = [(e, 2.0 - 0.01 * e) for e in range(1, 20)]
    assert not lbfgs_plateaued(steady, 2.0 - 0.01 * 20, 20, rule)
    assert lbfgs_plateaued(steady[:9] + [(e, 1.9) for e in range(10, 20)], 1.9, 20, rule)
    # two iterations whose line searches took 25 evaluations between them: the window is spent
    searching = [(2, 2.0), (5, 1.0)]
    assert lbfgs_plateaued(searching, 0.9995, 30, rule)
    assert not lbfgs_plateaued(searching, 0.99, 30, rule)
    assert not lbfgs_plateaued(searching, 0.9995, 14, rule)  # (5, 1.0) ended only 9 evaluations ago


def test_lbfgs_to_convergence_stops_before_the_cap_and_says_so():
    X, y = toy_regression(n=120)
    result = fit(sgpr(learn_inducing=False), X, y, progress=False)  # full batch: L-BFGS by default
    assert result.settings.optimizer == "lbfgs" and result.settings.epochs is None
    assert result.converged and result.steps < result.settings.max_steps
    capped = fit(sgpr(learn_inducing=False), X, y, max_steps=3, progress=False)
    # 3 iterations and 3 evaluations of the loss at most: the first line search may take two
    assert capped.converged is False and 0 < capped.steps <= 3


def test_adam_to_convergence_steps_the_learning_rate_down_and_stops_on_the_plateau():
    X, y = toy_regression(n=200)
    rule = Convergence(minibatch_tol=1e-3, patience=2, lr_cuts=2, minibatch_window=20)
    result = fit(SVGP(2, n_inducing=8).double(), X, y, batch_size=50, lr=0.05, progress=False, convergence=rule)
    assert result.settings.optimizer == "adam" and result.converged
    rates = sorted({h["lr"] for h in result.history}, reverse=True)
    assert rates == pytest.approx([0.05, 0.005, 0.0005])  # two cuts of lr_factor 0.1, then the stop
    assert result.steps % 4 == 0 and result.steps < result.settings.max_steps  # whole epochs of 4 batches
    capped = fit(SVGP(2, n_inducing=8).double(), X, y, batch_size=50, lr=0.05, max_steps=12, progress=False,
                 convergence=rule)
    assert capped.converged is False and capped.steps == 12


def test_a_fit_that_reaches_its_cap_spends_the_last_part_of_it_at_the_lower_rates():
    """The last ``cooldown`` share of the cap (20% of 10 epochs) goes to the rates of one and two cuts, an epoch
    each, where the plateau rule has not cut; cuts the rule took count towards them; ``cooldown=0`` keeps the rate."""
    X, y = toy_regression(n=200)

    def rates(rule, patience):
        result = fit(SVGP(2, n_inducing=8).double(), X, y, batch_size=50, lr=0.05, max_steps=40, progress=False,
                     convergence=rule, patience=patience)
        assert result.converged is False and result.steps == 40
        return [h["lr"] for h in result.history]

    assert rates(Convergence(), 1000) == pytest.approx([0.05] * 8 + [0.005, 0.0005])
    assert rates(Convergence(cooldown=0.0), 1000) == pytest.approx([0.05] * 10)
    # windows of one epoch that never improve: the rule cuts after 4 (epoch 5) and again at epoch 9, where the
    # cool-down asks for its second cut too, which is the same cut
    never_better = Convergence(minibatch_tol=1e9, minibatch_window=4, lr_cuts=2)
    assert rates(never_better, 4) == pytest.approx([0.05] * 5 + [0.005] * 4 + [0.0005])


def test_a_cap_of_one_epoch_is_cooled_within_it(monkeypatch):
    import gpscale.train.adam_loop as loop

    rates, make = [], loop.adam

    def recording(model, lr):  # Adam that notes the rate of every step
        optimiser = make(model, lr)
        step = optimiser.step
        optimiser.step = lambda *args, **kwargs: rates.append(optimiser.param_groups[0]["lr"]) or step(*args, **kwargs)
        return optimiser

    monkeypatch.setattr(loop, "adam", recording)
    X, y = toy_regression(n=200)
    fit(SVGP(2, n_inducing=8).double(), X, y, batch_size=10, lr=0.05, max_steps=20, progress=False, patience=1000)
    assert rates == pytest.approx([0.05] * 16 + [0.005] * 2 + [0.0005] * 2)  # the last 20% of 20 steps


def test_the_plateau_rule_counts_the_cool_downs_cuts():
    plateau = Plateau(Convergence(tol=0.01, patience=1, lr_cuts=2), patience=None)
    assert [plateau.update(v) for v in (5.0, 5.0)] == ["improved", "cut"]
    plateau.catch_up(1)
    assert plateau.state["cuts"] == 1
    plateau.catch_up(3)
    assert plateau.state["cuts"] == 2 and plateau.update(5.0) == "stop"


def test_cuts_due_give_each_lower_rate_an_equal_part_of_the_cooldown():
    rule = Convergence(cooldown=0.2, lr_cuts=2)
    assert [cuts_due(step, 50, rule) for step in range(35, 50)] == [0] * 5 + [1] * 5 + [2] * 5
    assert [cuts_due(step, 3, rule) for step in range(3)] == [0, 0, 0]  # parts of 0.3 steps: too short to cool


def test_adam_to_convergence_can_watch_the_validation_nlpd_and_keeps_the_best():
    X, y = toy_regression(n=200)
    rule = Convergence(patience=1, lr_cuts=0, minibatch_window=8)
    result = fit(SVGP(2, n_inducing=8).double(), X, y, batch_size=40, lr=0.05, val_fraction=0.2,
                 progress=False, convergence=rule)
    checked = [h for h in result.history if "val_nlpd" in h]
    assert checked and all((h["epoch"] + 1) % 2 == 0 for h in checked)  # 160 rows: windows of 2 epochs
    best = min(checked, key=lambda h: h["val_nlpd"])
    assert result.converged and result.best_epoch == best["epoch"]


def test_a_validation_split_over_processes_is_the_one_process_split_of_the_concatenated_rows():
    from gpscale.distributed import LocalComm
    from gpscale.train.validation import validation_split

    class RankOfThree(LocalComm):  # shards of 40, 25 and 35 rows
        world_size = 3

        def __init__(self, rank):
            self.rank = rank

        def all_gather(self, tensor):
            return torch.tensor([40, 25, 35])

    X, y = toy_regression(n=100)
    whole = validation_split(X, y, 0.2, torch.Generator().manual_seed(5))
    bounds = [0, 40, 65, 100]
    parts = [validation_split(X[a:b], y[a:b], 0.2, torch.Generator().manual_seed(5), RankOfThree(rank))
             for rank, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    for i, expected in enumerate(whole):
        torch.testing.assert_close(torch.cat([part[i] for part in parts]), expected, rtol=0, atol=0)
    assert whole[2].shape[0] == 20 and whole[0].shape[0] == 80
    fit_rows = {tuple(row) for row in whole[0].tolist()}
    assert not fit_rows & {tuple(row) for row in whole[2].tolist()}
    assert whole[0].tolist() == [row for row in X.tolist() if tuple(row) in fit_rows]  # the rows keep their order


def test_a_validation_split_that_would_leave_a_process_no_training_rows_fails_on_every_process_alike():
    """Every process draws the same global split, so each sees whether any would train on no rows (it could not
    take part in the training's collectives) and raises the same error instead of leaving the others waiting."""
    from gpscale.distributed import LocalComm
    from gpscale.train.validation import validation_split

    class RankOfTwo(LocalComm):  # shards of 1 and 9 rows
        world_size = 2

        def __init__(self, rank):
            self.rank = rank

        def all_gather(self, tensor):
            return torch.tensor([1, 9])

    X, y = toy_regression(n=10)
    outcomes = []
    for seed in range(6):
        errors = []
        for rank, (a, b) in enumerate([(0, 1), (1, 10)]):
            try:
                validation_split(X[a:b], y[a:b], 0.5, torch.Generator().manual_seed(seed), RankOfTwo(rank))
                errors.append(None)
            except ValueError as error:
                errors.append(str(error))
        assert errors[0] == errors[1]
        outcomes.append(errors[0])
    assert any(outcomes) and not all(outcomes)
    assert "holds out every row of process 0" in next(o for o in outcomes if o)


def test_a_method_holds_out_its_default_share_of_the_rows_only_when_training_to_convergence():
    X, y = toy_regression(n=200)
    seen = []

    class HoldsOut(SGPR):
        default_training = replace(SGPR.default_training, val_fraction=0.25)
        default_convergence = Convergence(watch_validation=False)

        def calibrate_on_held_out(self, X_fit, y_fit, X_held, y_held, comm=LOCAL):
            seen.append((X_fit.shape[0], X_held.shape[0]))

    fit(HoldsOut(2, n_inducing=5).double(), X, y, max_steps=3, progress=False)
    assert seen == [(150, 50)]  # once, after training: no validation passes while converging
    fit(HoldsOut(2, n_inducing=5).double(), X, y, epochs=2, progress=False)
    fit(HoldsOut(2, n_inducing=5).double(), X, y, max_steps=3, val_fraction=0, progress=False)
    fit(HoldsOut(2, n_inducing=5).double(), X[:196], y[:196], max_steps=3, progress=False)  # 49 < HELD_OUT_MIN_ROWS
    assert seen == [(150, 50)]
    fit(HoldsOut(2, n_inducing=5).double(), X, y, max_steps=3, optimizer="lbfgs", progress=False)
    assert seen == [(150, 50)] * 2  # L-BFGS on the rows kept: the plateau rule watches the training loss


def test_a_default_hold_out_serves_calibrate_noise_alone(monkeypatch):
    """softki's default holds out a tenth of the rows for calibrate_noise's estimate of the noise; with
    calibrate_noise=None nothing would use them, so it trains on every row, and the estimator caps its inducing
    points at the rows trained on by the same rule."""
    from gpscale import GPRegressor
    from gpscale.models.linear.softki import SoftKI

    X, y = toy_regression(n=600)
    held = []
    monkeypatch.setattr(SoftKI, "calibrate_on_held_out",
                        lambda self, X_fit, y_fit, X_held, y_held, comm=LOCAL: held.append(X_held.shape[0]))
    fit(SoftKI(2, n_inducing=8).double(), X, y, max_steps=3, progress=False)
    fit(SoftKI(2, n_inducing=8, calibrate_noise=None).double(), X, y, max_steps=3, progress=False)
    assert held == [60]
    for calibrate, trained_on in (("variance", 540), (None, 600)):
        fitted = GPRegressor(method="softki", n_inducing=600, max_steps=1, calibrate_noise=calibrate, progress=False)
        assert fitted.fit(X.numpy(), y.numpy()).model_.n_inducing == trained_on


def test_initialisation_sees_every_row_up_to_its_cap_and_a_seeded_sample_of_global_rows_beyond(monkeypatch):
    from gpscale.train import batches as train

    X, y = toy_regression(n=50)
    Xi, yi = train.initialisation_rows(X, y, seed=0)
    assert Xi is X and yi is y
    monkeypatch.setattr(train, "INIT_ROWS", 20)
    Xi, yi = train.initialisation_rows(X, y, seed=3)
    rows = torch.randperm(50, generator=torch.Generator().manual_seed(3))[:20].sort().values
    torch.testing.assert_close(Xi, X[rows], rtol=0, atol=0)
    torch.testing.assert_close(yi, y[rows], rtol=0, atol=0)


def test_a_fit_that_leaves_the_objective_far_worse_than_it_began_is_an_error_not_a_model():
    X, y = toy_regression(n=100)
    model = get_model_class("exact")(2).double()
    with pytest.raises(TrainingError, match="objective worse, from .* to .*Lower the learning rate \\(lr=10.0\\)"):
        fit(model, X, y, epochs=50, lr=10.0, progress=False)
    fit(get_model_class("exact")(2).double(), X, y, epochs=50, lr=0.1, progress=False)  # a sane lr trains


def test_a_fit_far_worse_than_ignoring_the_inputs_is_an_error_not_a_model():
    X, y = toy_regression(n=200)
    given = dict(n_inducing=10, outputscale=1e12, noise=1e-9, learn_noise=False)  # float32 never leaves ~1e14/point
    degenerate = "nats per point at best, against .* for a model that ignores the inputs"
    with pytest.raises(TrainingError, match=degenerate):  # 1e14 nats a point: no budget explains it
        fit(SVGP(2, **given).float(), X.float(), y.float(), epochs=3, batch_size=50, progress=False)
    with patch("gpscale.train.result.ABSURD_EXCESS", math.inf), \
            pytest.warns(RuntimeWarning, match=degenerate + ".*Train for longer"):  # a budget may be too short
        fit(SVGP(2, **given).float(), X.float(), y.float(), epochs=3, batch_size=50, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fit(SVGP(2, n_inducing=10).float(), X.float(), y.float(), max_steps=12, batch_size=50, progress=False)


def test_a_degenerate_fit_is_an_error_when_training_converged_there_and_a_warning_when_a_budget_ended_it():
    from gpscale.train.result import FitResult, check_not_degenerate
    from gpscale.distributed import LOCAL
    model, y = SVGP(2, n_inducing=4), torch.tensor([1.0, -1.0])  # null loss 1/2 log(2 pi) + 1/2 = 1.42
    result = FitResult(history=[{"loss": 600.0}, {"loss": 500.0}])
    with pytest.raises(TrainingError, match="500 nats per point at best, against 1.419"):
        check_not_degenerate(result, model, y, LOCAL, converged=True)
    with pytest.warns(RuntimeWarning, match="Train for longer"):
        check_not_degenerate(result, model, y, LOCAL, converged=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_not_degenerate(FitResult(history=[{"loss": 101.0}]), model, y, LOCAL, converged=True)  # within 100


@pytest.mark.parametrize("likelihood, y, expected", [
    (Gaussian(), torch.tensor([1.0, -3.0]), 0.5 * math.log(2 * math.pi * 5.0) + 0.5),  # N(0, mean(y^2) = 5)
    (Bernoulli(), torch.tensor([1.0, -1.0, 1.0, 1.0]), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))),
    (RobustMax(3), torch.tensor([0, 0, 2, 2]), math.log(2.0)),
])
def test_the_null_loss_is_the_likelihood_of_the_model_that_ignores_the_inputs(likelihood, y, expected):
    assert likelihood.null_loss(y) == pytest.approx(expected, rel=1e-12)


def test_fits_adam_is_adam():
    """fit's Adam (PyTorch's fused update) moves the parameters as the per-tensor Adam does, to round-off, over
    DBK's two parameter groups (weight decay on the network's, none on the noise's)."""
    import copy
    from gpscale.train import adam
    torch.manual_seed(0)
    X = torch.randn(64, 3, dtype=torch.float64)
    y = torch.sin(X[:, 0])
    from gpscale.models import get_model_class
    fused = get_model_class("dbk")(3, n_basis=8, width=16, weight_decay=1e-3).double()
    fused.initialise_from_data(X, y, seed=0)
    reference = copy.deepcopy(fused)
    optimisers = [adam(fused, 0.01), torch.optim.Adam(reference.parameter_groups(), lr=0.01, foreach=False)]
    for _ in range(5):
        for optimiser, model in zip(optimisers, (fused, reference)):
            optimiser.zero_grad()
            model.loss(X, y, 64).backward()
            optimiser.step()
    for a, b in zip(fused.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert optimisers[0].defaults["fused"]
