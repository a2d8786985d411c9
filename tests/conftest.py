import numpy as np
import pytest
import torch


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


def toy_regression(n=200, d=2, seed=0, noise=0.1, dtype=torch.float64):
    """A smooth function of d inputs plus Gaussian noise, with a non-zero mean so offsets show up."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=dtype) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + 0.5 * torch.cos(3 * X[:, -1]) + 0.3
    return X, f + noise * torch.randn(n, generator=g, dtype=dtype)
