import builtins
import errno
import io
import os

import numpy as np
import pytest
import torch


def pytest_configure(config):
    # `make test` runs two pytest-xdist workers on a 2-core machine: each computes on one thread, as do the processes
    # its tests start, because two workers of two threads each on two cores contend (an HVGP test took 6 s alone and
    # 71 s beside another worker, both at two threads)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny matrices: on a shared 2-core machine intra-op threads only add contention (up to 100x
    slower). Use as ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _FillingFile:
    """A file open for writing on a disk with ``disk["room"]`` bytes (or characters) left: a write takes what fits,
    then raises ENOSPC as a full disk does."""

    def __init__(self, file, disk: dict):
        self._file, self._disk = file, disk

    def write(self, data):
        fits = data[:self._disk["room"]]
        self._disk["room"] -= len(fits)
        self._file.write(fits)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(room)``: from then on the disk has ``room`` bytes left, shared by every file opened for writing
    (with ``open``, or ``io.open`` as ``Path.write_text`` and ``os.fdopen`` do); the write that goes past them writes
    what fits and fails with ENOSPC."""
    def fill(room: int) -> None:
        disk = {"room": room}

        def filling(opener):
            def open_(file, mode="r", *args, **kwargs):
                f = opener(file, mode, *args, **kwargs)
                return _FillingFile(f, disk) if set(mode) & set("wax+") else f
            return open_

        monkeypatch.setattr(builtins, "open", filling(builtins.open))
        monkeypatch.setattr(io, "open", filling(io.open))
    return fill


def toy_regression(n=200, d=2, seed=0, noise=0.1, dtype=torch.float64):
    """A smooth function of d inputs plus Gaussian noise, with a non-zero mean so offsets show up."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=dtype) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + 0.5 * torch.cos(3 * X[:, -1]) + 0.3
    return X, f + noise * torch.randn(n, generator=g, dtype=dtype)


def sine_problem(n, seed):
    """GRIEF's 2-D problem: X [n, 2] uniform on [-3, 3]^2, f = sin(x1) sin(x2) [n], y = f + N(0, 0.1^2) [n]
    (float64, seeded)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64) * 6 - 3
    f = torch.sin(X[:, 0]) * torch.sin(X[:, 1])
    return X, f, f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


CORNERS = [(0, 0), (0, 5), (5, 0)]  # the top-left pixel of each class's 3 x 3 square in an 8 x 8 image


def square_images(n, seed=0):
    """n noisy 8 x 8 images [n, 64] of 3 classes (labels [n]): class c has a bright 3 x 3 square at CORNERS[c]."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    X = 0.1 * rng.standard_normal((n, 8, 8))
    for i, c in enumerate(labels):
        r, s = CORNERS[c]
        X[i, r:r + 3, s:s + 3] += 1.0
    return X.reshape(n, 64), labels
