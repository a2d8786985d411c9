"""Stopping on SIGTERM, SIGUSR1 and Ctrl-C: with a checkpoint the state is saved at the next step boundary and a
resume ends where a straight run does; without one the command says so in one line and writes nothing. A
checkpoint knows its data and options: a resume on other ones, or from a file that is not a checkpoint, is refused
in one sentence. The signals are sent from inside a training step (deterministically, at a chosen step), not timed."""
import os
import re
import signal

import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.train import epoch as training
from gpscale.checkpoint import CheckpointError
from gpscale.cli import main
from gpscale.preemption import Stopped, deferred_stop, stop_signals

FIT = dict(method="svgp", n_inducing=8, epochs=3, batch_size=64, lr=0.05, seed=1, progress=False, dtype="float64")


@pytest.fixture(autouse=True)
def interactive_sigint():
    """Ctrl-C at Python's own handler, as in a terminal, whatever this process inherited: a job started in the
    background by a shell ignores SIGINT, and the library leaves a disposition the program chose as it is."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def data(n=300, shift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) + shift
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


@pytest.fixture
def signal_at_step(monkeypatch):
    """``arm(step, signum)``: the process sends itself ``signum`` during its ``step``-th optimiser step (1-based)."""
    step = training._step

    def arm(at: int, signum=signal.SIGTERM):
        count = {"n": 0}

        def counted(*args, **kwargs):
            count["n"] += 1
            if count["n"] == at:
                os.kill(os.getpid(), signum)
            return step(*args, **kwargs)

        monkeypatch.setattr(training, "_step", counted)

    yield arm
    monkeypatch.setattr(training, "_step", step)


@pytest.mark.parametrize("at, signum", [(7, signal.SIGTERM), (5, signal.SIGUSR1), (10, signal.SIGINT)])
def test_a_signal_saves_the_state_at_the_next_step_and_a_resume_ends_where_a_straight_run_does(
        tmp_path, signal_at_step, at, signum):
    X, y = data()
    straight = GPRegressor(**FIT).fit(X, y).predict(X)
    checkpoint = tmp_path / "fit.ckpt"
    signal_at_step(at, signum)
    with pytest.raises(Stopped) as stopped:
        GPRegressor(checkpoint=checkpoint, **FIT).fit(X, y)
    assert stopped.value.signal_name == signal.Signals(signum).name and stopped.value.step == at
    assert stopped.value.exit_status == 128 + signum and checkpoint.exists()
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)  # the handlers put back
    signal_at_step(0)
    resumed = GPRegressor(checkpoint=checkpoint, resume=True, **FIT).fit(X, y).predict(X)
    np.testing.assert_array_equal(resumed, straight)  # mid-epoch (5 steps an epoch) as at an epoch's end


def test_a_second_ctrl_c_stops_at_once_and_a_repeated_sigterm_does_not():
    with deferred_stop() as request:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler and torchrun may each send one
        assert request.pending() == "SIGTERM"
        with pytest.raises(Stopped, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    with stop_signals(), pytest.raises(Stopped, match="SIGUSR1"):
        os.kill(os.getpid(), signal.SIGUSR1)


def test_a_handler_the_program_set_is_left_to_it():
    seen = []
    before = signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
    try:
        with deferred_stop() as request:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert request.pending() is None and seen == [1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def write_csv(path, X, y):
    np.savetxt(path, np.c_[X, y], delimiter=",", header="a,b,y", comments="")


CLI_FIT = ["--target", "y", "--method", "svgp", "--n-inducing", "8", "--epochs", "3", "--batch-size", "64",
           "--dtype", "float64", "--quiet"]


def test_the_command_line_stopped_with_a_checkpoint_says_how_to_resume(tmp_path, signal_at_step, capsys):
    table, model, checkpoint = tmp_path / "train.csv", tmp_path / "model.gps", tmp_path / "fit.ckpt"
    write_csv(table, *data())
    command = ["fit", str(table), *CLI_FIT, "-o", str(model), "--checkpoint", str(checkpoint)]
    signal_at_step(8)
    assert main(command) == 143
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1, message
    assert "stopped by SIGTERM" in message and str(checkpoint) in message and "--resume" in message
    assert checkpoint.exists() and not model.exists()
    signal_at_step(0)
    assert main([*command, "--resume"]) == 0 and model.exists()


def test_the_command_line_stopped_without_a_checkpoint_writes_nothing(tmp_path, signal_at_step, capsys):
    table, model = tmp_path / "train.csv", tmp_path / "model.gps"
    write_csv(table, *data())
    signal_at_step(3, signal.SIGUSR1)
    # without a checkpoint the signal stops the step at once (there is no state to save)
    assert main(["fit", str(table), *CLI_FIT, "-o", str(model)]) == 138
    message = capsys.readouterr().err.strip()
    assert message == ("gpscale: stopped by SIGUSR1; nothing was saved (pass --checkpoint FILE to be able to resume "
                       "a stopped fit)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.csv"]


def stopped_checkpoint(tmp_path, signal_at_step, X, y, **options):
    checkpoint = tmp_path / "fit.ckpt"
    signal_at_step(4)
    with pytest.raises(Stopped):
        GPRegressor(checkpoint=checkpoint, **{**FIT, **options}).fit(X, y)
    signal_at_step(0)
    return checkpoint


@pytest.mark.parametrize("other, expected", [
    (dict(rows=data(seed=5)), "on other rows of the same size"),
    (dict(rows=data(n=250)), "on 300 rows x 2 features, this fit has 250 x 2"),
    (dict(rows=data(shift=1.0)), "x_shift="),  # the same rows once standardised: the scaling tells them apart
    (dict(options=dict(n_inducing=6)), "with n_inducing=8, this fit has n_inducing=6"),
    (dict(options=dict(kernel="matern32")), "kernel="),
    (dict(options=dict(dtype="float32")), "with dtype='float64', this fit has dtype='float32'"),
])
def test_a_resume_on_other_data_or_options_is_refused_with_what_differs(tmp_path, signal_at_step, other, expected):
    X, y = data()
    checkpoint = stopped_checkpoint(tmp_path, signal_at_step, X, y)
    before = checkpoint.read_bytes()
    X2, y2 = other.get("rows", (X, y))
    reg = GPRegressor(checkpoint=checkpoint, resume=True, **{**FIT, **other.get("options", {})})
    with pytest.raises(CheckpointError, match="Cannot resume from .*" + re.escape(expected)):
        reg.fit(X2, y2)
    assert checkpoint.read_bytes() == before  # refused before anything is written
    assert not hasattr(reg, "model_")


def test_another_width_is_refused_in_one_sentence(tmp_path, signal_at_step):
    X, y = data()
    checkpoint = stopped_checkpoint(tmp_path, signal_at_step, X, y)
    with pytest.raises(CheckpointError, match="on 300 rows x 2 features, this fit has 300 x 3"):
        GPRegressor(checkpoint=checkpoint, resume=True, **FIT).fit(np.c_[X, X[:, :1]], y)


@pytest.mark.parametrize("content", ["torch", "text", "empty"])
def test_a_file_that_is_not_a_checkpoint_is_one_line_on_the_command_line(tmp_path, capsys, content):
    table, checkpoint = tmp_path / "train.csv", tmp_path / "fit.ckpt"
    write_csv(table, *data())
    if content == "torch":
        torch.save({"model": {"weight": torch.ones(2)}, "epoch": 3}, checkpoint)
    else:
        checkpoint.write_text("not a checkpoint\n" if content == "text" else "")
    code = main(["fit", str(table), *CLI_FIT, "-o", str(tmp_path / "m.gps"), "--checkpoint", str(checkpoint),
                 "--resume"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"gpscale: error: {checkpoint} is not a gpscale checkpoint")


def test_a_fit_that_converged_resumes_to_itself_without_training_further(tmp_path):
    """The checkpoint of a fit that the plateau rule ended says so: resumed (after a stop in the posterior fit, say),
    it trains no further."""
    X, y = data()
    options = {**FIT, "epochs": None}
    checkpoint = tmp_path / "fit.ckpt"
    straight = GPRegressor(checkpoint=checkpoint, **options).fit(X, y)
    assert straight.training_["converged"]
    resumed = GPRegressor(checkpoint=checkpoint, resume=True, **options).fit(X, y)
    assert resumed.training_["steps"] == straight.training_["steps"] and resumed.training_["converged"]
    np.testing.assert_array_equal(resumed.predict(X), straight.predict(X))


def test_a_constant_column_summed_in_another_order_is_the_same_data():
    from gpscale.checkpoint import _data_differences

    saved = {"n": 4, "d": 1, "mean": torch.tensor([0.1, 0.0]), "std": torch.tensor([1e-9, 1.0]),
             "rows": torch.arange(4), "sample": torch.tensor([[0.1, 1.0], [0.1, -1.0], [0.1, 1.0], [0.1, -1.0]])}
    now = {**saved, "std": torch.tensor([0.0, 1.0]), "mean": torch.tensor([0.1 + 1e-12, 0.0])}
    assert _data_differences(saved, now) == []
    assert _data_differences(saved, {**now, "mean": torch.tensor([0.2, 0.0])}) != []


def test_a_checkpoint_of_an_earlier_gpscale_is_named_as_such(tmp_path):
    checkpoint = tmp_path / "old.ckpt"
    torch.save({"model": {}, "optimiser": {}, "generator": torch.zeros(1), "history": []}, checkpoint)
    X, y = data()
    with pytest.raises(CheckpointError, match="written by an earlier gpscale"):
        GPRegressor(checkpoint=checkpoint, resume=True, **FIT).fit(X, y)


@pytest.mark.parametrize("other", [dict(seed=2), dict(lr=0.5)])
def test_a_resume_with_another_seed_or_learning_rate_is_refused(tmp_path, signal_at_step, other):
    X, y = data()
    checkpoint = stopped_checkpoint(tmp_path, signal_at_step, X, y)
    name, value = next(iter(other.items()))
    with pytest.raises(CheckpointError, match=f"this fit has {name}={value}"):
        GPRegressor(checkpoint=checkpoint, resume=True, **{**FIT, **other}).fit(X, y)
