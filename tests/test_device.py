"""gpscale on a GPU, and what of it can be checked without one.

On any machine: a training epoch of every method reads the device once, after its last step, and its steps read
nothing (counted on the CPU by :mod:`gpscale.bench.host_reads`: there each read is free, but it marks a place where
a GPU would wait); a step, the posterior fit and prediction run on the meta device, which holds shapes and no
values, so they neither read a value nor mix in a tensor made on the CPU; an epoch whose deferred check failed runs
again, to what checking at once gives; host rows stream to the model's device in chunks.

With CUDA: every method fits, predicts, saves and loads on the GPU as it does on the CPU; a training step there
never synchronises (torch.cuda's sync debug mode); host rows are copied from pinned memory.
"""
import math

import numpy as np
import pytest
import torch
from test_contract import CLASSIFIERS, METHODS, TINY, data, regressor

import gpscale
from gpscale import GPClassifier, train
from gpscale.bench.floor import random_problem, trainer_step
from gpscale.bench.host_reads import host_reads
from gpscale.device import check_failed, chunks_on, deferred_checks, pinned_for
from gpscale.distributed import LOCAL
from gpscale.kernels import matern_sums
from gpscale.linalg import NumericalWarning
from gpscale.models import get_model_class
from gpscale.models.base import option_names

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:GP-GRIEF-I's MCMC has not converged"),
              pytest.mark.filterwarnings("ignore:VFF. in dimension")]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BATCH = 32
N = 4 * BATCH  # four steps to an epoch of a minibatch method
TRAINED = [m for m in METHODS if get_model_class(m).trainable]  # GP-GRIEF-I samples by MCMC: it takes no step
PROBLEMS = [(m, "gaussian") for m in TRAINED] + \
    [(m, likelihood) for m in CLASSIFIERS for likelihood in get_model_class(m).likelihoods if likelihood != "gaussian"]


def small_problem(method: str, likelihood: str = "gaussian", **options):
    """``method`` at the contract suite's settings, initialised on N random rows of 2 features (float64) by the
    FLOP floor's :func:`random_problem`: (model, X, y, generator), y holding class labels for a classification
    likelihood (-1 / +1, or 0, 1, 2)."""
    cls = get_model_class(method)
    options = {**{k: v for k, v in TINY[method].items() if k in option_names(cls)}, **options}
    if likelihood != "gaussian":
        options.update(likelihood=likelihood, **({} if likelihood == "bernoulli" else {"n_classes": 3}))
    model, X, y, generator = random_problem(method, N, 2, options, torch.float64)
    if likelihood == "bernoulli":
        y = torch.where(y > y.median(), 1.0, -1.0).to(y)
    elif likelihood != "gaussian":
        y = torch.bucketize(y, y.quantile(torch.tensor([1 / 3, 2 / 3], dtype=y.dtype))).to(y.dtype)
    return model, X, y, generator


def one_step(model, X, y, optimiser):
    """The training loop's step on the first BATCH rows (all rows for a full-batch model); its loss."""
    rows = None if model.full_batch else torch.arange(BATCH, device=X.device)
    return train.epoch._step(train.Objective(model), X, y, train.batches.Batch(rows, BATCH / N), optimiser,
                             train.Shard(0, N, N), LOCAL)


def problem_id(problem) -> str:
    method, likelihood = problem
    return method if likelihood == "gaussian" else f"{method}-{likelihood}"


# --- host reads, counted on the CPU --------------------------------------------------------------------------------

# Reads made on the CPU only, where they cost no wait; the meta-device tests below run the other branch. None_set
# lets VFF skip the edge forms of Kuf when no row is outside its box; linalg.cholesky_inverse (the exact GP's
# backward, a natural-gradient step's S^{-1}) takes LAPACK's potri, whose status check is free there, and two
# triangular solves, which check nothing, elsewhere.
CPU_ONLY_READS = {"none_set", "cholesky_inverse"}
# The reads a step makes on purpose: GP-GRIEF picks its features by value (the distinct eigenvector columns each
# dimension needs, sized by torch.unique; whether any is exactly zero) and eigendecomposes its grid factors, which
# torch.linalg.eigh checks.
KEPT_READS = {"grief": {"grief_features", "forward"}}


# a deep GP's latent predictive is a mixture over draws of its hidden layers: no joint Gaussian covariance
NO_JOINT_PREDICTIVE = {"deep-conv-hvgp"}


@pytest.mark.parametrize("problem", PROBLEMS, ids=problem_id)
def test_a_training_epoch_reads_the_device_once_after_its_last_step(problem):
    method, likelihood = problem
    model, X, y, generator = small_problem(method, likelihood)
    epoch = trainer_step(model, generator)
    epoch(X, y, BATCH)
    reads = host_reads(lambda: epoch(X, y, BATCH))
    expected = {"_speculate", *CPU_ONLY_READS, *KEPT_READS.get(method, ())}
    unexpected = [str(r) for r in reads if r.function not in expected]
    assert unexpected == [] and [r.function for r in reads].count("_speculate") == 1


@pytest.mark.parametrize("method", ["odvff", "odvgp"])
def test_the_additive_kernels_sums_read_nothing_in_a_step(method, monkeypatch):
    """The additive Matérn's K v by sorted sums (taken only from DENSE_BELOW kernel values up; here at the contract's
    small sizes) records its span check instead of reading it: an epoch reads the device once, and a step runs on
    the meta device."""
    monkeypatch.setattr(matern_sums, "DENSE_BELOW", 1)
    options = {"kernel": "additive_matern32"} if method == "odvgp" else {}
    model, X, y, generator = small_problem(method, **options)
    epoch = trainer_step(model, generator)
    epoch(X, y, BATCH)
    reads = host_reads(lambda: epoch(X, y, BATCH))
    assert [r.function for r in reads if r.function not in CPU_ONLY_READS] == ["_speculate"]
    model, X, y, _ = small_problem(method, **options)
    model.to("meta")
    X, y = X.to("meta"), y.to("meta")
    optimiser = torch.optim.Adam(model.parameter_groups(), lr=1e-3)
    with deferred_checks():
        one_step(model, X, y, optimiser)
    with deferred_checks():
        assert [str(r) for r in host_reads(lambda: one_step(model, X, y, optimiser))] == []


def test_host_reads_are_found_with_the_line_that_made_them_and_adams_own_are_not():
    x = torch.ones(3, requires_grad=True)
    optimiser = torch.optim.Adam([x])

    def work():
        (x * 2).sum().backward()
        optimiser.step()  # reads its step counter, which lives on the host
        float(x.detach().sum()), x.tolist(), torch.linalg.solve(torch.eye(3, dtype=x.dtype), x.detach())

    reads = host_reads(work)
    assert [r.operation for r in reads] == ["aten._local_scalar_dense", "Tensor.tolist", "aten._linalg_check_errors"]
    assert {(r.file, r.function) for r in reads} == {("test_device.py", "work")}


def test_copies_from_pageable_host_memory_to_a_device_are_found():
    on_meta = torch.zeros(3, device="meta")

    def work():
        on_meta + torch.ones(3).to("meta")
        on_meta.copy_(torch.ones(3))
        torch.tensor([1.0, 2.0, 3.0], device="meta")
        on_meta * torch.tensor(2.0)  # a CPU scalar is an argument, not a copy

    assert [r.operation for r in host_reads(work)] == ["copy from the host to meta", "copy from the host to meta",
                                                       "torch.tensor onto meta"]


def test_indexing_that_copies_from_the_host_is_found():
    """On a GPU ``c[0] = 1.0`` and ``W[[0, 2]]`` copy the number or the index list from pageable host memory (torch's
    sync debug mode flagged both in training steps on an H200); numbers, slices and device tensors copy nothing, nor
    does a number assigned to several elements (torch fills them)."""
    on_meta = torch.zeros(3, 2, device="meta")

    def work():
        on_meta[1, 0] = 1.0
        on_meta[[0, 2]]
        on_meta[range(2)]
        on_meta[torch.tensor([0, 2])]
        on_meta[:, 1] = torch.ones(3)
        on_meta[1, 0]  # copy nothing from here on
        on_meta[1:, ::2]
        on_meta[1:] = 2.0  # fills several elements
        on_meta[torch.zeros(2, dtype=torch.long, device="meta")] = torch.ones(2, device="meta")
        on_meta[..., None]
        torch.zeros(3)[[0, 2]] = 1.0  # on the host itself

    assert [r.operation for r in host_reads(work)] == [
        "Tensor.__setitem__ of a number from the host", "Tensor.__getitem__ with an index from the host",
        "Tensor.__getitem__ with an index from the host", "Tensor.__getitem__ with an index from the host",
        "copy from the host to meta"]


# --- the meta device: shapes without values -----------------------------------------------------------------------

@pytest.mark.parametrize("problem", [p for p in PROBLEMS if p[0] != "grief"], ids=problem_id)
def test_a_training_step_runs_on_the_meta_device_and_copies_nothing_from_the_host(problem):
    """A step runs on the meta device only if it reads no value on the host and mixes no tensor made on the CPU into
    the model's, and there host_reads sees what it copies from the host (a wait on a GPU): what a step on a GPU must
    not do. The first step may copy a group's constants to the device, once. (GP-GRIEF's step sizes its features
    by value.)"""
    model, X, y, _ = small_problem(*problem)
    model.to("meta")
    X, y = X.to("meta"), y.to("meta")
    optimiser = torch.optim.Adam(model.parameter_groups(), lr=1e-3)
    with deferred_checks():
        one_step(model, X, y, optimiser)
    with deferred_checks() as checks:
        reads = host_reads(lambda: one_step(model, X, y, optimiser))
    assert [str(r) for r in reads] == [] and checks.flag.device.type == "meta"


# Why these methods' posterior fits read values on purpose
POSTERIOR_READS = {
    "softki": "its noise calibration searches sigma^2 on the host",
    "dbk": "its noise calibration (its default) searches sigma^2 on the host",
    "grief": "it picks its features by value",
    "grief-i": "it samples by MCMC",
    "vff": "it warns when the data come near the ends of its box",
    "vff-svgp": "it warns when the data come near the ends of its box",
    "odvff": "it warns when the data come near the ends of its box",
}


@pytest.mark.parametrize("method", [m for m in METHODS if m not in POSTERIOR_READS])
def test_the_posterior_fit_and_prediction_from_host_rows_run_on_the_meta_device(method):
    model, X, y, _ = small_problem(method)
    model.to("meta")
    with deferred_checks(), torch.no_grad():
        model.fit_posterior(X.to("meta"), y.to("meta"))
        mean, var = model.predict(X[:10])  # host rows, streamed to the model's device
        means, _ = model.predict_mixture(X[:10])
        _, cov = (None, None) if method in NO_JOINT_PREDICTIVE else model.predict_cov(X[:10])
    assert mean.device.type == "meta" and mean.shape == var.shape == (10,) and means.shape[1:] == (10,)
    assert method in NO_JOINT_PREDICTIVE or cov.shape == (10, 10)


def test_the_linear_engine_streams_host_rows_to_the_models_device():
    model, X, y, _ = small_problem("sgpr", chunk_size=50)
    model.to("meta")
    with deferred_checks(), torch.no_grad():
        stats = model.statistics(X, y)
        posterior = model.weight_posterior(X, y, posterior=True)
    assert stats.A.device.type == posterior.L_B.device.type == "meta" and stats.n == N


# --- deferred checks and speculative epochs -------------------------------------------------------------------------

def test_a_check_reads_at_once_outside_a_deferred_block_and_records_inside():
    assert check_failed(torch.tensor([False, True])) and not check_failed(torch.tensor(False))
    with deferred_checks() as checks:
        assert not check_failed(torch.tensor(False))
        assert checks.flag is not None and not checks.flag
        assert not check_failed(torch.tensor([False, True]))  # failed, recorded, answered "passed"
    assert checks.flag and checks.any_failed(torch.zeros((), dtype=torch.float64)) == 1.0
    assert not check_failed(torch.tensor(False))  # the block is over


def _singular_svgp():
    """SVGP with its inducing points all at one place and no jitter: every Cholesky factor of Kuu needs jitter (the
    points move alike, so they stay together). A new initialisation would move them apart: there is none."""
    model, X, y, generator = small_problem("svgp", jitter=0.0)
    with torch.no_grad():
        model.features.Z.copy_(model.features.Z[0].expand_as(model.features.Z))
    model.initialise_from_data = lambda *args, **kwargs: None
    return model, X, y, generator


def _epoch(model, X, y, generator, speculate=True):
    """The epoch's mean loss, and whether it ran again."""
    optimiser = torch.optim.Adam(model.parameter_groups(), lr=0.01)
    run = train.run_epoch(model, train.Objective(model), X, y, optimiser, generator, BATCH, train.Shard(0, N, N),
                          LOCAL, speculate)
    return run.total / run.n_steps, run.redone


def test_an_epoch_whose_check_failed_runs_again_to_what_checking_at_once_gives():
    runs = {}
    for speculate in (True, False):
        model, X, y, generator = _singular_svgp()
        with pytest.warns(NumericalWarning, match="inducing covariance Kuu .* added jitter"):
            loss, redone = _epoch(model, X, y, generator, speculate)
        runs[speculate] = loss, redone, [p.detach().clone() for p in model.parameters()]
    assert runs[True][1] and not runs[False][1]  # speculation failed, and the epoch ran again
    assert runs[True][0] == runs[False][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[True][2], runs[False][2]))


def _poison_the_third_step(model, X, generator, replace):
    """Make the model's loss ``replace(loss)`` on the rows of the third step of the epoch ``generator`` shuffles next,
    however often that epoch runs."""
    order = torch.randperm(N, generator=torch.Generator().set_state(generator.get_state()))
    third, original = X[order.split(BATCH)[2]], model.loss

    def loss(xb, *args, **kwargs):
        value = original(xb, *args, **kwargs)
        return replace(value) if torch.equal(xb, third) else value

    model.loss = loss


def test_a_loss_that_turns_non_finite_mid_epoch_stops_training_at_that_step():
    model, X, y, generator = small_problem("svgp")
    _poison_the_third_step(model, X, generator, lambda loss: loss * math.nan)
    with pytest.raises(train.TrainingError, match="the loss became nan"):
        _epoch(model, X, y, generator)


def test_an_error_after_a_failed_check_is_taken_for_its_consequence():
    model, X, y, generator = small_problem("svgp")
    _poison_the_third_step(model, X, generator, lambda loss: loss * math.nan)
    poisoned = model.loss

    def strict(*args, **kwargs):  # refuses the NaN parameters that the step after the poisoned one finds
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise ValueError("NaN parameters")
        return poisoned(*args, **kwargs)

    model.loss = strict
    with pytest.raises(train.TrainingError, match="the loss became nan"):  # where checking at once stops
        _epoch(model, X, y, generator)


def test_training_resumes_eager_checks_after_a_speculation_failed(monkeypatch):
    model, X, y, _ = _singular_svgp()
    seen = []
    epoch = train.run_epoch

    def spy(*args, **kwargs):
        run = epoch(*args, **kwargs)
        seen.append((args[-1], run.redone))
        return run

    monkeypatch.setattr(train.adam_loop, "run_epoch", spy)
    with pytest.warns(NumericalWarning):
        train.fit(model, X, y, epochs=3, batch_size=BATCH, progress=False)
    assert seen == [(True, True), (False, False), (False, False)]


# --- rows on their way to the device --------------------------------------------------------------------------------

def test_on_the_cpu_chunks_are_the_rows_themselves():
    X, y = torch.randn(10, 2), torch.randn(10)
    assert pinned_for(torch.device("cpu"), X) is X
    chunks = list(chunks_on(torch.device("cpu"), 4, X, y))
    assert [len(Xc) for Xc, _ in chunks] == [4, 4, 2]
    assert all(Xc.data_ptr() == Xs.data_ptr() for (Xc, _), Xs in zip(chunks, X.split(4)))


# --- on a GPU -------------------------------------------------------------------------------------------------------

@requires_cuda
def test_host_rows_go_to_cuda_from_pinned_memory_without_a_synchronisation():
    X = torch.randn(1000, 3, dtype=torch.float64)
    cuda = torch.device("cuda", torch.cuda.current_device())
    assert pinned_for(cuda, X).is_pinned()
    torch.cuda.set_sync_debug_mode("error")
    try:
        chunks = [Xc for (Xc,) in chunks_on(cuda, 300, X)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [Xc.device for Xc in chunks] == [cuda] * 4
    torch.testing.assert_close(torch.cat(chunks).cpu(), X, rtol=0, atol=0)


@requires_cuda
@pytest.mark.parametrize("problem", [p for p in PROBLEMS if p[0] != "grief"], ids=problem_id)
def test_a_training_step_on_cuda_never_synchronises(problem):
    model, X, y, generator = small_problem(*problem)
    model.cuda()
    X, y = X.cuda(), y.cuda()
    trainer_step(model, generator)(X, y, BATCH)  # lazy starts: library handles, workspaces
    optimiser = torch.optim.Adam(model.parameter_groups(), lr=1e-3)
    one_step(model, X, y, optimiser)  # Adam's state
    with deferred_checks():
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = one_step(model, X, y, optimiser)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss)


# Not compared with a fit on the CPU: SoftKI's probes and the deep convolutional GP's draws come from the device's
# own generator (the CPU's and CUDA's give different numbers for one seed); GP-GRIEF-I samples by MCMC; GP-GRIEF
# starts its noise at the maximiser of its evidence over the noise, where the noise's gradient is near zero, and
# Adam's first step, lr g / (|g| + 1e-8), makes large and different steps of gradients that differ in their last
# digits: X scaled by 1 + 1e-14 gave raw-noise gradients 1.0e-7 and 2.1e-8 at the start, the raw noise 0.027 apart
# after one epoch (the other parameters 3e-13) and the predictions 2.4e-3 apart after three; an H200's fit differed
# from the CPU's by 6.6%.
DETERMINISTIC = [m for m in METHODS if m not in ("softki", "deep-conv-hvgp", "grief", "grief-i")]
ACROSS_DEVICES = dict(rtol=1e-5, atol=1e-7)  # a few Adam steps from round-off apart


@requires_cuda
@pytest.mark.parametrize("method", METHODS)
def test_a_regressor_fits_predicts_saves_and_loads_on_cuda_as_on_the_cpu(tmp_path, method):
    X, y = data()
    Xs = data(20, seed=1)[0]
    gpu = regressor(method, device="cuda").fit(X, y)
    assert next(gpu.model_.parameters()).is_cuda
    mean, std = gpu.predict(Xs, return_std=True)
    assert np.isfinite(mean).all() and np.isfinite(std).all()
    gpu.save(tmp_path / "m.gps")
    for device, tolerance in (("cuda", dict(rtol=0, atol=0)), ("cpu", dict(rtol=1e-9, atol=1e-12))):
        loaded = gpscale.load(tmp_path / "m.gps", device=device)
        assert next(loaded.model_.parameters()).device.type == device
        for a, b in zip(loaded.predict(Xs, return_std=True), (mean, std)):
            np.testing.assert_allclose(a, b, **tolerance)
    if method in DETERMINISTIC:
        cpu = regressor(method).fit(X, y)
        for a, b in zip(cpu.predict(Xs, return_std=True), (mean, std)):
            np.testing.assert_allclose(a, b, **ACROSS_DEVICES)


@requires_cuda
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("method", CLASSIFIERS)
def test_a_classifier_fits_predicts_saves_and_loads_on_cuda_as_on_the_cpu(tmp_path, method, n_classes):
    if n_classes > 2 and "robustmax" not in get_model_class(method).likelihoods:
        pytest.skip(f"{method} classifies two classes only")
    X, _ = data(80)
    labels = np.digitize(X[:, 0] + 0.3 * X[:, 1], [-0.5, 0.5][: n_classes - 1])
    # float64, as the regressors' test: the load on the CPU is compared to the bit's neighbourhood (in float32 the
    # CPU's and an H200's predictions differed by 1.5e-7)
    settings = {"epochs": 3, "batch_size": 32, "lr": 0.05, "dtype": "float64", **TINY[method]}
    gpu = GPClassifier(method=method, progress=False, device="cuda", **settings).fit(X, labels)
    p = gpu.predict_proba(X)
    assert p.shape == (80, n_classes) and np.allclose(p.sum(1), 1)
    gpu.save(tmp_path / "clf.gps")
    np.testing.assert_allclose(gpscale.load(tmp_path / "clf.gps", device="cpu").predict_proba(X), p, rtol=1e-9)
    if method in DETERMINISTIC:
        cpu = GPClassifier(method=method, progress=False, **settings).fit(X, labels)
        np.testing.assert_allclose(cpu.predict_proba(X), p, **ACROSS_DEVICES)
