"""A process killed outright (SIGKILL: no handler runs) while it writes a model file or a checkpoint loses nothing:
the file on disk is the earlier whole one or the new whole one, the next write clears what the killed one left, and
a fit killed mid-training resumes from its checkpoint to the model an uninterrupted fit gives."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gpscale import GPRegressor, load

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _wait_for(path, job, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


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
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (300, 2))
    data = tmp_path / "train.csv"
    np.savetxt(data, np.c_[X, np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(300)], delimiter=",",
               header="a,b,y", comments="")
    state = tmp_path / "state.pt"
    argv = [sys.executable, "-m", "gpscale", "fit", str(data), "--target", "y", "--method", method, "--n-inducing",
            "16", "--batch-size", "16", "--epochs", "100", "--quiet", "--checkpoint", str(state)]
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
