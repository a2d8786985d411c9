"""Interruptions lose nothing. Ctrl-C (SIGINT, handlers run), SIGKILL (no handler runs) or a full disk while a model
file or a checkpoint is written leaves the earlier whole file on disk; the next write clears what a killed one left; a fit
interrupted either way resumes from its checkpoint to the model an uninterrupted fit gives, to the bit. (An
interrupted refit of an estimator keeping its earlier model is in test_refused_calls.py.)"""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from gpscale import GPRegressor, load

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _wait_for(path, job, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


def _train_csv(folder, n=300):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (n, 2))
    data = folder / "train.csv"
    np.savetxt(data, np.c_[X, np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(n)], delimiter=",",
               header="a,b,y", comments="")
    return data, X


def _fitted(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return GPRegressor(method="exact", epochs=2, progress=False).fit(X, X[:, 0] + 0.1 * rng.normal(size=n)), X


def test_ctrl_c_in_the_middle_of_a_save_keeps_the_earlier_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    first, X = _fitted()
    first.save(tmp_path / "m.gps")
    second, _ = _fitted(seed=1)

    def interrupted(fd):  # the bytes are written, not yet on disk nor moved into place
        assert len(list(tmp_path.glob(".m.gps.*.tmp"))) == 1
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        second.save(tmp_path / "m.gps")
    monkeypatch.undo()
    np.testing.assert_array_equal(load(tmp_path / "m.gps").predict(X), first.predict(X))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gps"]


def test_a_full_disk_during_a_save_keeps_the_earlier_file_and_says_where_and_what_to_do(tmp_path, full_disk):
    first, _ = _fitted()
    first.save(tmp_path / "m.gps")
    earlier = (tmp_path / "m.gps").read_bytes()
    second, _ = _fitted(seed=1)
    full_disk(1000)
    with pytest.raises(OSError) as caught:
        second.save(tmp_path / "m.gps")
    assert (tmp_path / "m.gps").read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gps"]
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value) == (f"[Errno 28] could not write {tmp_path / 'm.gps'} (No space left on device); the "
                                 "earlier m.gps is left as it was. Free space on that disk (or raise the quota), or "
                                 "write to another folder.")


def test_a_save_clears_only_its_own_files_leftovers_and_checks_its_folder_first(tmp_path):
    reg, _ = _fitted()
    stale = tmp_path / ".m.gps.abc123.tmp"
    stale.write_bytes(b"half a model")
    other = tmp_path / ".other.gps.abc123.tmp"  # another file's: not this save's to remove
    other.write_bytes(b"")
    reg.save(tmp_path / "m.gps")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.gps.abc123.tmp", "m.gps"]


def test_a_save_killed_mid_write_leaves_the_earlier_file_whole_and_the_next_save_clears_its_leftovers(tmp_path):
    target = tmp_path / "m.gps"
    script = textwrap.dedent(f"""
        import numpy as np
        from gpscale import GPRegressor
        rng = np.random.default_rng(0)
        X = rng.normal(size=(2500, 3))  # an exact GP's cache is 2,500^2 doubles: 50 MB a save
        reg = GPRegressor(method="exact", epochs=1, progress=False).fit(X, X[:, 0])
        while True:
            reg.save({str(target)!r})
    """)
    job = subprocess.Popen([sys.executable, "-c", script], env=ENV)
    try:
        _wait_for(target, job)
        time.sleep(0.3)  # into a later save, most likely mid-write
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
    assert load(target).n_features_in_ == 3  # whole, whatever moment the kill came
    rng = np.random.default_rng(1)
    GPRegressor(method="exact", epochs=1, progress=False).fit(rng.normal(size=(20, 3)), rng.normal(size=20)).save(
        target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gps"]


@pytest.mark.parametrize("method", ["svgp", "sgpr"])
def test_a_fit_killed_mid_training_resumes_from_its_checkpoint_to_the_uninterrupted_model(tmp_path, method):
    data, X = _train_csv(tmp_path)
    state = tmp_path / "state.pt"
    argv = [sys.executable, "-m", "gpscale", "fit", str(data), "--target", "y", "--method", method, "--n-inducing",
            "16", "--batch-size", "16", "--epochs", "20", "--quiet", "--checkpoint", str(state)]
    job = subprocess.Popen(argv + ["-o", str(tmp_path / "m.gps")], env=ENV)
    try:
        _wait_for(state, job)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL and not (tmp_path / "m.gps").exists()
    subprocess.run(argv + ["--resume", "-o", str(tmp_path / "m.gps")], env=ENV, check=True)
    subprocess.run(argv[:-2] + ["-o", str(tmp_path / "whole.gps")], env=ENV, check=True)
    np.testing.assert_array_equal(load(tmp_path / "m.gps").predict(X), load(tmp_path / "whole.gps").predict(X))
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_fit_killed_in_the_middle_of_writing_a_checkpoint_resumes_from_the_one_before(tmp_path):
    data, X = _train_csv(tmp_path)
    state = tmp_path / "state.pt"
    fit = ["fit", str(data), "--target", "y", "--method", "svgp", "--n-inducing", "16", "--batch-size", "32",
           "--epochs", "6", "--quiet", "--checkpoint", str(state)]
    script = textwrap.dedent(f"""
        import os, signal, sys
        from gpscale.cli import main
        writes = []
        def fsync_or_die(fd):  # the third checkpoint's bytes are written but not yet moved into place: kill
            writes.append(fd)
            if len(writes) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        os.fsync = fsync_or_die
        main({fit + ["-o", str(tmp_path / "m.gps")]!r})
    """)
    job = subprocess.run([sys.executable, "-c", script], env=ENV)
    assert job.returncode == -signal.SIGKILL and not (tmp_path / "m.gps").exists()
    assert len(list(tmp_path.glob(".state.pt.*.tmp"))) == 1  # what the kill left
    assert len(torch.load(state, weights_only=False)["history"]) == 2  # the checkpoint before, whole
    command = [sys.executable, "-m", "gpscale"]
    subprocess.run(command + fit + ["--resume", "-o", str(tmp_path / "m.gps")], env=ENV, check=True)
    subprocess.run(command + fit[:-2] + ["-o", str(tmp_path / "whole.gps")], env=ENV, check=True)
    np.testing.assert_array_equal(load(tmp_path / "m.gps").predict(X), load(tmp_path / "whole.gps").predict(X))
    assert not list(tmp_path.glob(".*.tmp"))


def test_ctrl_c_during_a_fit_leaves_a_checkpoint_that_resumes_to_the_uninterrupted_model(tmp_path):
    data, X = _train_csv(tmp_path, n=80)
    checkpoint = tmp_path / "state.pt"
    argv = [sys.executable, "-m", "gpscale", "fit", str(data), "--target", "y", "--method", "svgp",
            "--n-inducing", "10", "--batch-size", "8", "--epochs", "40", "--quiet", "--checkpoint", str(checkpoint)]
    # a terminal's Ctrl-C: SIGINT at its default disposition in the child, whatever this process inherited (a child
    # keeps an ignored SIGINT ignored, and Python then installs no KeyboardInterrupt handler)
    job = subprocess.Popen(argv + ["-o", str(tmp_path / "m.gps")], env=ENV, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(checkpoint, job)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 130, err
    assert "run the same command with --resume" in err and not (tmp_path / "m.gps").exists()
    subprocess.run(argv + ["--resume", "-o", str(tmp_path / "m.gps")], env=ENV, check=True)
    subprocess.run(argv[:-2] + ["-o", str(tmp_path / "whole.gps")], env=ENV, check=True)
    np.testing.assert_array_equal(load(tmp_path / "m.gps").predict(X), load(tmp_path / "whole.gps").predict(X))
