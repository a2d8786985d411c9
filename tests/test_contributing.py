"""The worked example of docs/contributing.md: its code block, run as it stands, adds a method (random Fourier
features on the linear engine) that matches the dense GP of its features, fits a small problem as well as the exact
GP, and keeps a few of the contract's checks (tests/test_contract.py); it is unregistered afterwards."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gpscale import GPRegressor, load
from gpscale.models import available_methods
from gpscale.models.base import unregister

from tests.models.engine_cases import LinearEngineCase

PAGE = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"
F64 = torch.float64


def example_code() -> str:
    """The page's one python code block."""
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1
    return blocks[0]


@pytest.fixture(scope="module")
def rff():
    """The example's class, registered as ``rff`` while this module's tests run."""
    namespace = {"__name__": "contributing_example"}
    exec(compile(example_code(), str(PAGE), "exec"), namespace)
    try:
        yield namespace["RandomFourierFeatures"]
    finally:
        unregister("rff")


def data(n=120, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2
    return X, f + 0.1 * rng.standard_normal(n), f


def test_the_page_counts_the_lines_of_its_example():
    lines = len(example_code().rstrip("\n").splitlines())
    assert f"a new method in {lines} lines" in PAGE.read_text() and f"these {lines} lines" in PAGE.read_text()


def test_the_example_registers_a_method(rff):
    assert "rff" in available_methods() and rff.key == "rff"


class TestTheEngineCases(LinearEngineCase):
    """The linear engine's base cases: the evidence and the predictive against the dense GP of phi."""

    @pytest.fixture(autouse=True)
    def _registered(self, rff):
        self.cls = rff

    def make_model(self):
        X, y, _ = data(40)
        X, y = torch.tensor(X, dtype=F64), torch.tensor(y, dtype=F64)
        model = self.cls(2, n_basis=16, chunk_size=16).double()  # several chunks in every pass
        model.initialise(X, y, seed=3)
        return model, X, y


def test_it_fits_a_small_problem_as_well_as_the_exact_gp(rff):
    X, y, _ = data(80)
    X_test, _, f_test = data(200, seed=1)
    ours = GPRegressor(method="rff", n_basis=64, progress=False).fit(X, y)
    exact = GPRegressor(method="exact", max_steps=50, progress=False).fit(X, y)
    rmse = [np.sqrt(np.mean((reg.predict(X_test) - f_test) ** 2)) for reg in (ours, exact)]
    assert ours.training_["optimizer"] == "lbfgs" and ours.training_["converged"]  # its default_training
    assert rmse[0] < 1.5 * rmse[1] + 0.02, rmse


def test_it_keeps_the_contract(rff, tmp_path):
    """Save and load give identical predictions; variances are finite and non-negative near the data and far from
    it; bad input is refused before any training."""
    X, y, _ = data()
    reg = GPRegressor(method="rff", n_basis=32, epochs=3, progress=False).fit(X, y)
    reg.save(tmp_path / "rff.pt")
    far = np.vstack([X[:5], X[:5] + 100.0])
    np.testing.assert_array_equal(load(tmp_path / "rff.pt").predict(far, return_std=True),
                                  reg.predict(far, return_std=True))
    _, std = reg.predict(far, return_std=True)
    assert np.all(np.isfinite(std)) and np.all(std >= 0)
    holed = X.copy()
    holed[4, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        GPRegressor(method="rff", progress=False).fit(holed, y)
