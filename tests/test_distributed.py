"""Data-parallel training on 2 gloo processes equals one process on the concatenated shards (DESIGN.md,
Distributed): the same global batches, the ranks' losses summing to the global loss, gradients summed by
DistributedDataParallel, initialisation on rank 0 broadcast, closed-form posteriors reduced across ranks."""
import os
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpscale.distributed import LOCAL, TorchComm
from gpscale.models import available_methods, get_model_class
from gpscale.train import Shard, fit

F64 = torch.float64
WORLD = 2
N, D = 97, 2  # shards of 49 and 48 rows: unequal on purpose
FIT = dict(epochs=2, batch_size=32, lr=0.02, seed=3, progress=False)

# method -> options; the minibatch methods (DistributedDataParallel) and their closed-form posterior passes
METHODS = {
    "svgp": dict(n_inducing=6),
    "svgp-unwhitened": dict(n_inducing=6, whiten=False),  # natural-gradient steps on q(u) against N(0, Kuu)
    # a loss that couples the batch's rows (and draws probes): every rank evaluates the gathered batch
    "softki": dict(n_inducing=8, solver="qr", calibrate_noise=None),
    # the noise re-estimated after training from the all-reduced statistics (the default)
    "softki-calibrated": dict(n_inducing=8, solver="qr"),
    "hvgp": dict(n_inducing=4, group="pca_negation", n_ways=1),
    "vff-svgp": dict(n_frequencies=4),  # natural-gradient steps on q, reduced across ranks
    "odvff": dict(n_frequencies=3, n_mean_inducing=8),
    "svdbk": dict(n_basis=6, network="mlp", depth=1, width=8, correction=False),
    # the correction's k_max: the batch's maximum, gathered from every rank, also from one without rows of the batch
    "svdbk-corrected": dict(n_basis=6, network="mlp", depth=1, width=8),
    "odvgp": dict(n_inducing=5, n_mean_inducing=8),
    "odvgp-adam": dict(n_inducing=5, n_mean_inducing=8, natural_gradients=False),
    # full batch: the collapsed bounds all-reduce their statistics (differentiably)
    "sgpr": dict(n_inducing=6),
    "sgpr-qr": dict(n_inducing=6, solver="qr"),
    "vff": dict(n_frequencies=4),
    "exact": dict(),  # every rank gathers all rows for its Cholesky factor
    # BBMM: each rank its rows of K, the probes drawn for the global rows; CG to round-off
    "exact-iterative": dict(inference="iterative", cg_tolerance=1e-11, n_probes=4, preconditioner_rank=5),
    # training sees 40 of the 97 rows, drawn by global index: gathered from both ranks, then split between them
    "exact-subset": dict(evidence_rows=40, inference="iterative", cg_tolerance=1e-11, n_probes=4,
                         preconditioner_rank=5),
    "dbk": dict(n_basis=6, network="mlp", depth=1, width=8),  # the correction's k_max: a max across ranks
    # the noise starts at the exact GP's optimum, not at the GRIEF evidence's, whose zero gradient Adam's
    # normalised first step would turn from round-off into a step of size lr (measured: 3e-3 apart in raw noise)
    "grief": dict(n_eigen=12, grid_size=6, init_exact_points=40, init_iterations=5, init_noise="exact"),
    # no training: MALA on the all-reduced statistics, seeded alike on every rank (not the default HMC, whose
    # trajectories amplify the all-reduce's round-off into chains that differ by Monte Carlo error)
    "grief-i": dict(n_eigen=12, grid_size=6, init_exact_points=40, init_iterations=5, sampler="mala",
                    n_iterations=200, burn_in=50, thin=5, n_chains=1),
    # one-pixel-high images of D pixels: inducing patches by k-means on rank 0, broadcast
    "conv-svgp": dict(n_inducing=4, image_shape=(1, D), filter_size=(1, 1)),
    "conv-hvgp": dict(n_inducing=3, image_shape=(1, D), filter_size=(1, 2)),
    # the draws of the hidden layer: a row's are keyed by the row and a key from the generator the ranks share
    "deep-conv-hvgp": dict(n_inducing=3, hidden_inducing=3, image_shape=(1, D), filter_sizes=((1, 1), (1, 2)),
                           strides=(1, 1), hidden_channels=2, group="negation", predict_samples=2),
}
# registry keys, not a key and a variant
HYPHENATED = ("vff-svgp", "grief-i", "conv-svgp", "conv-hvgp", "deep-conv-hvgp")


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N + 20, D, generator=g, dtype=F64)
    y = torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * torch.randn(N + 20, generator=g, dtype=F64)
    return X[:N], y[:N], X[N:]


def shards():
    return np.array_split(np.arange(N), WORLD)


def make(method):
    torch.manual_seed(1)  # the same network initialisation in every process (SVDBK)
    key = method if method in HYPHENATED else method.split("-")[0]
    return get_model_class(key)(D, **METHODS[method]).double()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, methods, out, options=None):
    """Train each of ``methods`` in turn on this rank's rows, saving each to ``{out}/{method}.{rank}``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        comm = TorchComm()
        X, y, X_test = data()
        rows = shards()[rank]
        for method in methods:
            model = make(method)
            result = fit(model, X[rows], y[rows], comm=comm, **{**FIT, **(options or {})})
            mean, var = model.predict(X_test)
            torch.save({"state": model.state_dict(), "mean": mean, "var": var, "history": result.history},
                       f"{out}/{method}.{rank}")
    except BaseException:
        dist.destroy_process_group()
        raise
    end_worker()


def end_worker():
    """A worker's last act once its work is done: wait for the other, destroy the group and exit at once, without
    the interpreter's shutdown, during which a gloo thread that still releases a collective's tensors aborts the
    process (gpscale.distributed.leave_job says more; it ended about one two-process run in 70)."""
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def in_job(rank, port, out, work, *, through_environment=False):
    """As rank ``rank`` of a WORLD-process gloo job (joined here, or through the variables torchrun sets, for code
    that calls ``TorchComm.from_env``): save ``work()`` to ``{out}.{rank}``, then end the worker."""
    torch.set_num_threads(1)
    if through_environment:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.save(work(), f"{out}.{rank}")
    except BaseException:
        dist.destroy_process_group()
        raise
    end_worker()


def spawn(worker, *args, timeout=240):
    """Run ``worker(rank, *args)`` in WORLD processes; a deadlock fails the test instead of hanging the suite."""
    context = mp.start_processes(worker, args=args, nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{worker.__name__} did not finish within {timeout} s (a collective deadlocked?).")


def run_distributed(method, tmp_path, options=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spawn(_worker, free_port(), [method], str(tmp_path), options)
    return saved_ranks(tmp_path, method)


def saved_ranks(folder, method) -> list[dict]:
    return [torch.load(f"{folder}/{method}.{rank}", weights_only=False) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def every_method_in_two_processes(tmp_path_factory):
    """The folder where one pair of processes saved every method of METHODS, trained one after the other: the
    processes' start-up (importing torch and gpscale), most of a small fit's time, is paid once, not per method."""
    folder = tmp_path_factory.mktemp("every_method")
    spawn(_worker, free_port(), list(METHODS), str(folder), timeout=900)
    return folder


def run_one_process(method, options=None):
    """The plain one-process fit on all rows: the job initialises on the same rows whatever its processes."""
    X, y, X_test = data()
    model = make(method)
    fit(model, X, y, **{**FIT, **(options or {})})
    mean, var = model.predict(X_test)
    return {"state": model.state_dict(), "mean": mean, "var": var}


def assert_same_fit(ranks, single, **tolerance):
    for rank in ranks:
        for name, value in single["state"].items():
            if torch.is_tensor(value):
                torch.testing.assert_close(rank["state"][name], value, **tolerance, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(rank["mean"], single["mean"], **tolerance)
        torch.testing.assert_close(rank["var"], single["var"], **tolerance)


# GRIEF-I starts at the optimum of the GRIEF evidence, where the gradient is ~4e-10: its round-off (the ranks sum the
# statistics in another order) is a relative 1e-8, which Adam's normalised first step turns into a 5e-8 difference
TOLERANCE = {"grief": dict(rtol=1e-6, atol=1e-7), "grief-i": dict(rtol=1e-6, atol=1e-7),
             # the calibrated noise is the argmax of a flat evidence: the ranks' round-off in the statistics moves it
             # by more than 1e-9 and less than 1e-7, relative (measured)
             "softki-calibrated": dict(rtol=1e-7, atol=1e-8),
             # likewise dbk's calibrated noise, its default (measured: 2.6e-8 relative in raw noise)
             "dbk": dict(rtol=1e-7, atol=1e-7),
             # conjugate gradients amplify the ranks' other order of summation by about K's condition number
             "exact-iterative": dict(rtol=1e-7, atol=1e-8), "exact-subset": dict(rtol=1e-7, atol=1e-8)}


def test_every_registered_method_trains_in_two_processes_here():
    assert {key if key in HYPHENATED else key.split("-")[0] for key in METHODS} == set(available_methods())


@pytest.mark.parametrize("method", list(METHODS))
def test_two_processes_train_and_predict_as_one(method, every_method_in_two_processes):
    assert_same_fit(saved_ranks(every_method_in_two_processes, method), run_one_process(method),
                    **TOLERANCE.get(method, dict(rtol=1e-9, atol=1e-10)))


@pytest.mark.parametrize("method", ["sgpr", "exact"])
def test_lbfgs_in_two_processes_takes_the_steps_of_one(method, tmp_path):
    # every rank's L-BFGS sees the all-reduced loss and gradient, so the ranks step alike, as one process does
    options = dict(optimizer="lbfgs", epochs=20)
    assert_same_fit(run_distributed(method, tmp_path, options), run_one_process(method, options),
                    rtol=1e-7, atol=1e-8)


def test_validation_takes_the_mean_nlpd_over_every_ranks_held_out_rows(tmp_path):
    ranks = run_distributed("svgp", tmp_path, dict(val_fraction=0.2, epochs=4, patience=1))
    assert [h["val_nlpd"] for h in ranks[0]["history"]] == [h["val_nlpd"] for h in ranks[1]["history"]]
    assert all(np.isfinite(h["val_nlpd"]) for h in ranks[0]["history"])
    for name, value in ranks[0]["state"].items():
        if torch.is_tensor(value):
            torch.testing.assert_close(ranks[1]["state"][name], value, rtol=0, atol=0)


def test_training_resumes_from_rank_0s_checkpoint(tmp_path):
    checkpoint = str(tmp_path / "svgp.ckpt")
    run_distributed("svgp", tmp_path / "first", dict(epochs=2, checkpoint=checkpoint))
    resumed = run_distributed("svgp", tmp_path / "resumed", dict(epochs=3, checkpoint=checkpoint, resume=True))
    straight = run_distributed("svgp", tmp_path / "straight", dict(epochs=3))
    assert [h["epoch"] for h in resumed[0]["history"]] == [0, 1, 2]
    for name, value in straight[0]["state"].items():
        if torch.is_tensor(value):
            torch.testing.assert_close(resumed[1]["state"][name], value, rtol=1e-12, atol=1e-13)


def _stopped_worker(rank, port, out, checkpoint):
    """svgp with a checkpoint, rank 1 alone sent SIGTERM during its 6th step: every rank stops at the same step."""
    import signal

    from gpscale.train import epoch as training
    from gpscale.preemption import Stopped

    step, count = training._step, {"n": 0}

    def counted(*args, **kwargs):
        count["n"] += 1
        if rank == 1 and count["n"] == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    def work():
        training._step = counted
        X, y, _ = data()
        rows = shards()[rank]
        try:
            fit(make("svgp"), X[rows], y[rows], comm=TorchComm(), checkpoint=checkpoint, **{**FIT, "epochs": 3})
        except Stopped as err:
            return err.signal_name, err.step, count["n"]
        return None

    in_job(rank, port, out, work)


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step_and_the_fit_resumes(tmp_path):
    checkpoint = str(tmp_path / "svgp.ckpt")
    spawn(_stopped_worker, free_port(), str(tmp_path / "stopped"), checkpoint)
    stops = [torch.load(f"{tmp_path}/stopped.{rank}", weights_only=False) for rank in range(WORLD)]
    assert stops[0] == stops[1] == ("SIGTERM", 6, 6)  # 4 steps an epoch: mid-epoch
    resumed = run_distributed("svgp", tmp_path / "resumed", dict(epochs=3, checkpoint=checkpoint, resume=True))
    straight = run_distributed("svgp", tmp_path / "straight", dict(epochs=3))
    for rank in range(WORLD):
        for name, value in straight[0]["state"].items():
            if torch.is_tensor(value):
                torch.testing.assert_close(resumed[rank]["state"][name], value, rtol=0, atol=0)


def _estimator_worker(rank, port, out):
    import os

    from gpscale import GPRegressor

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        X, y, X_test = data()
        rows = shards()[rank]
        reg = GPRegressor(method="svgp", n_inducing=6, epochs=2, batch_size=32, progress=False, distributed=True)
        reg.fit(X[rows].numpy(), y[rows].numpy())
        reg.save(f"{out}.model{rank}")
        torch.save({"scaling": (reg.x_mean_, reg.x_std_, reg.y_mean_, reg.y_std_),
                    "mean": reg.predict(X_test.numpy())}, f"{out}.{rank}")
    except BaseException:
        dist.destroy_process_group()
        raise
    end_worker()


def _table_worker(rank, port, out, path):
    """Fit svgp from a Parquet table in a 2-process job, recording the row groups this rank reads."""
    import pyarrow.parquet as pq

    from gpscale import GPRegressor, Table

    read = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        read.append(list(kwargs["row_groups"]))
        return iter_batches(self, *args, **kwargs)

    def work():
        pq.ParquetFile.iter_batches = spy
        reg = GPRegressor(method="svgp", n_inducing=6, epochs=2, batch_size=32, dtype="float64", progress=False,
                          distributed=True).fit(Table(path, target="y"))
        return {"read": read, "rows": reg.training_["rows"], "mean": reg.predict(data()[2].numpy())}

    in_job(rank, port, out, work, through_environment=True)


def _full_disk_worker(rank, port, out, path):
    """Rank 1's temporary folder has no room for its staged rows."""
    import errno

    from gpscale import GPRegressor, Table

    def work():
        if rank == 1:
            def full(fd, offset, length):
                raise OSError(errno.ENOSPC, "No space left on device")

            os.posix_fallocate = full
        try:
            GPRegressor(method="svgp", epochs=1, progress=False, distributed=True).fit(Table(path, target="y"))
        except (OSError, ValueError) as err:
            return f"{type(err).__name__}: {err}"
        return None

    in_job(rank, port, out, work, through_environment=True)


def test_a_full_disk_on_one_process_while_staging_raises_on_every_process(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y, _ = data()
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"a": X[:, 0].numpy(), "b": X[:, 1].numpy(), "y": y.numpy()}), path)
    spawn(_full_disk_worker, free_port(), str(tmp_path / "e"), str(path))
    messages = [torch.load(f"{tmp_path}/e.{rank}", weights_only=False) for rank in range(WORLD)]
    assert messages[1].startswith("OSError: ") and "could not set aside" in messages[1]
    assert messages[0].startswith("ValueError: process 1: OSError: ") and "TMPDIR" in messages[0]


def test_each_process_reads_only_its_row_groups_of_a_table_and_fits_the_one_process_model(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpscale import GPRegressor, Table

    X, y, X_test = data()
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"a": X[:, 0].numpy(), "b": X[:, 1].numpy(), "y": y.numpy()}), path,
                   row_group_size=10)
    spawn(_table_worker, free_port(), str(tmp_path / "t"), str(path))
    ranks = [torch.load(f"{tmp_path}/t.{rank}", weights_only=False) for rank in range(WORLD)]
    # rows 0..48 and 49..96 (row_blocks): groups 0-4 and 4-9, for the scan and again for the staged copy
    assert ranks[0]["read"] == [[g] for g in range(5)] * 2 and ranks[1]["read"] == [[g] for g in range(4, 10)] * 2
    assert ranks[0]["rows"] == ranks[1]["rows"] == N
    one = GPRegressor(method="svgp", n_inducing=6, epochs=2, batch_size=32, dtype="float64", progress=False)
    expected = one.fit(Table(path, target="y")).predict(X_test.numpy())
    for rank in ranks:
        np.testing.assert_allclose(rank["mean"], expected, rtol=1e-9, atol=1e-9)


def test_the_estimator_scales_with_global_statistics_and_rank_0_saves(tmp_path):
    from gpscale import GPRegressor

    out = str(tmp_path / "reg")
    spawn(_estimator_worker, free_port(), out)
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(WORLD)]
    X, y, X_test = data()
    expected = (X.numpy().mean(0), X.numpy().std(0), float(y.mean()), float(y.numpy().std()))
    for rank in ranks:
        for ours, reference in zip(rank["scaling"], expected):
            np.testing.assert_allclose(ours, reference, rtol=1e-13)
        np.testing.assert_array_equal(rank["mean"], ranks[0]["mean"])
    np.testing.assert_allclose(GPRegressor.load(f"{out}.model0").predict(X_test.numpy()), ranks[0]["mean"],
                               rtol=1e-12)
    assert not (tmp_path / "reg.model1").exists()  # rank 1 holds the same model and writes nothing


def test_shards_cover_the_global_rows_in_rank_order():
    assert Shard.of(10, LOCAL) == Shard(offset=0, n=10, n_global=10)


def _classes_worker(rank, port, out):
    from gpscale.estimator.classifier import global_classes

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    mine = [np.array(["dog", "cat", "dog"], dtype=object), np.array(["émeu", "ant", "cat"], dtype=object)][rank]
    torch.save(global_classes(mine, TorchComm()).tolist(), f"{out}.{rank}")
    dist.destroy_process_group()


def test_string_labels_held_by_different_ranks_give_every_rank_all_the_classes(tmp_path):
    spawn(_classes_worker, free_port(), str(tmp_path / "classes"))
    for rank in range(WORLD):
        assert torch.load(f"{tmp_path / 'classes'}.{rank}") == ["ant", "cat", "dog", "émeu"]


def _bench_worker_failing_on_rank_1(rank, port, out):
    from gpscale.bench import runner
    from gpscale.bench.protocols import get_protocol

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    train = runner._run_ours

    def run_ours(*args):  # (spec, options, train, X, y, seed, progress, trained, comm)
        if rank == 1 and args[-1].world_size > 1:
            raise MemoryError("planted: out of memory on rank 1 alone")
        return train(*args)

    runner._run_ours = run_ours
    runner.run_protocol(get_protocol("quick"), out_dir=out, methods=["svgp"], datasets=["friedman1"],
                        comm=TorchComm(), progress=False, log=lambda message: None)


def test_a_run_failing_on_one_rank_stops_the_job_instead_of_stalling_it(tmp_path):
    # rank 0 trains and waits in a collective for rank 1, whose run failed: recording the failure and going on
    # would leave rank 0 waiting for good (spawn's deadline); raising ends rank 1, and the launcher stops rank 0
    with pytest.raises(mp.ProcessRaisedException, match="Rank 1: svgp on friedman1 failed .*MemoryError"):
        spawn(_bench_worker_failing_on_rank_1, free_port(), str(tmp_path), timeout=120)


def test_torch_comm_needs_an_initialised_group_and_from_env_needs_torchrun(monkeypatch):
    with pytest.raises(RuntimeError, match="not initialised"):
        TorchComm()
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        TorchComm.from_env()


def test_the_command_line_trains_under_torchrun(tmp_path):
    import subprocess
    import sys

    from gpscale import GPRegressor

    X, y, X_test = data()
    table = tmp_path / "train.csv"
    np.savetxt(table, np.c_[X.numpy(), y.numpy()], delimiter=",", header="a,b,y", comments="")
    model = tmp_path / "model.gps"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "-m", "gpscale", "fit", str(table), "--target", "y", "--method", "svgp", "--n-inducing", "6",
               "--epochs", "2", "--batch-size", "32", "--quiet", "--distributed", "-o", str(model)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"on {N} rows x 2 features" in done.stdout and f"({WORLD} processes)" in done.stdout
    assert np.isfinite(GPRegressor.load(model).predict(X_test.numpy())).all()


def test_the_command_line_names_the_files_rows_when_they_are_too_few_for_its_processes(tmp_path):
    import subprocess
    import sys

    table = tmp_path / "one.csv"
    np.savetxt(table, np.array([[0.0, 1.0]]), delimiter=",", header="a,y", comments="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "-m", "gpscale", "fit", str(table), "--target", "y", "--method", "svgp", "--quiet", "--distributed",
               "-o", str(tmp_path / "model.gps")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in done.stderr.splitlines()
              if line.startswith(("gpscale:", "gpscale (process")) and ": error: " in line]
    # every process raises the error; torchrun ends the others once the first has exited, so one or both print it
    assert done.returncode != 0 and 1 <= len(errors) <= WORLD, done.stderr[-2000:]
    assert all("The data have 1 row, parted [0, 1] over 2 processes" in line for line in errors), errors
    # a line each, then torchrun's own report: no gpscale traceback, no abort at exit
    assert "gpscale/" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "model.gps").exists()


def _disagreeing_worker(rank, port, out):
    """Rank 1's rows hold a NaN: scikit-learn's check fails there alone."""
    from gpscale import GPRegressor

    def work():
        X, y, _ = data()
        X = X[shards()[rank]].numpy().copy()
        if rank == 1:
            X[3, 0] = np.nan
        try:
            GPRegressor(method="svgp", epochs=1, progress=False, distributed=True).fit(X, y[shards()[rank]].numpy())
        except ValueError as err:
            return str(err)
        return None

    in_job(rank, port, out, work, through_environment=True)


def test_a_check_failing_on_one_ranks_rows_raises_on_every_rank_with_the_reason(tmp_path):
    spawn(_disagreeing_worker, free_port(), str(tmp_path / "err"))
    messages = [torch.load(f"{tmp_path}/err.{rank}", weights_only=False) for rank in range(WORLD)]
    assert "NaN" in messages[1]
    assert messages[0].startswith("process 1: ValueError: ") and "NaN" in messages[0]


def test_the_benchmark_runs_under_torchrun_and_rank_0_records(tmp_path):
    import subprocess
    import sys

    from gpscale.bench.store import ResultsStore

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "-m", "gpscale", "bench", "--protocol", "quick", "--methods", "svgp,sgpr,gpytorch-svgp",
               "--datasets", "friedman1", "--distributed", "--out", str(tmp_path),
               "--data-option", "n=10000"]  # a quarter of quick's 40,000 rows: the test's time, not the protocol's
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "GPSCALE_DATA": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {r["method"]: r for r in ResultsStore(tmp_path / "results.sqlite").runs()}
    assert set(runs) == {"svgp", "sgpr", "gpytorch-svgp"}  # one record each: rank 0 alone writes
    for method in ("svgp", "sgpr"):
        assert runs[method]["status"] == "ok" and runs[method]["processes"] == WORLD, runs[method]
        assert runs[method]["rmse"] < 0.5
    assert runs["gpytorch-svgp"]["status"] == "error" and "one process" in runs["gpytorch-svgp"]["error"]
    assert done.stdout.count("gpscale bench: protocol quick") == 1


def _pid_of_rank(rank: int, marker: str) -> int | None:
    """The pid of the torchrun worker of ``rank`` whose command line contains ``marker`` (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
            environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if marker in cmdline and f"RANK={rank}".encode() in environ:
            return int(entry)
    return None


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker's pid in /proc")
def test_a_rank_killed_mid_training_stops_the_job_with_no_model_written(tmp_path):
    import signal
    import subprocess
    import sys

    X, y, _ = data()
    table = tmp_path / "train.csv"
    np.savetxt(table, np.c_[X.numpy(), y.numpy()], delimiter=",", header="a,b,y", comments="")
    model, state = tmp_path / "model.gps", tmp_path / "state.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "-m", "gpscale", "fit", str(table), "--target", "y", "--method", "svgp", "--n-inducing", "6",
               "--epochs", "100000", "--batch-size", "8", "--quiet", "--distributed", "--checkpoint", str(state),
               "-o", str(model)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while not state.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # training has begun on both ranks once rank 0 has written a checkpoint
        victim = _pid_of_rank(1, str(model))
        assert victim is not None and job.poll() is None
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=180)  # bounded: torchrun stops rank 0 when rank 1 dies
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0 and not model.exists()
    # torchrun names the root cause: "rank : 1 (local_rank: 1) exitcode : -9 ... Signal 9 (SIGKILL)"
    assert "local_rank: 1" in err and ("Signal 9" in err or "exitcode: -9" in err), err[-2000:]


# The library's defaults: float32 for svgp and softki, float64 for sgpr, each trained until its plateau rule ends it.
# Round-off differs between one process and two (the ranks sum their parts; SoftKI's only in its posterior pass, its
# ranks evaluating the whole gathered batch), and training to convergence carries it into the fit as any harmless
# change, such as another thread count, does (docs/distributed.md, "One answer at the defaults", has the sizes). So
# the predictions are compared to a fraction of the model's own predictive standard deviation, not to the bit.
DEFAULTS_N = 600
DEFAULT_AGREEMENT = {"svgp": 0.5, "sgpr": 0.5, "softki": 1e-4}  # of the smallest predictive std


def defaults_data():
    rng = np.random.default_rng(4)
    X = rng.uniform(-2, 2, (DEFAULTS_N + 100, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - X[:, 2] + 0.1 * rng.standard_normal(len(X))
    return X[:DEFAULTS_N], y[:DEFAULTS_N], X[DEFAULTS_N:]


def _defaults_worker(rank, port, method, out):
    from gpscale import GPRegressor

    def work():
        X, y, X_test = defaults_data()
        rows = np.array_split(np.arange(len(X)), WORLD)[rank]
        return GPRegressor(method=method, progress=False, distributed=True).fit(X[rows], y[rows]).predict(
            X_test, return_std=True)

    in_job(rank, port, out, work, through_environment=True)


@pytest.mark.parametrize("method", [pytest.param("svgp", marks=pytest.mark.slow), "softki", "sgpr"])
def test_the_defaults_in_two_processes_predict_as_one_to_round_offs_own_scatter(tmp_path, method):
    from gpscale import GPRegressor

    spawn(_defaults_worker, free_port(), method, str(tmp_path / method), timeout=900)
    X, y, X_test = defaults_data()
    mean, std = GPRegressor(method=method, progress=False).fit(X, y).predict(X_test, return_std=True)
    for rank in range(WORLD):
        mean_w, std_w = torch.load(f"{tmp_path / method}.{rank}", weights_only=False)
        assert np.abs(mean_w - mean).max() <= DEFAULT_AGREEMENT[method] * std.min()
        assert np.abs(std_w - std).max() <= DEFAULT_AGREEMENT[method] * std.min()