"""The exact GP's cost measurement (experiments.exact_cost) at a tiny size: every number is there, CG reaches each
tolerance with alpha as close to the factor's, and the larger Lanczos cache is the closer to the factor's variances."""
import pytest

from experiments.exact_cost import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_cost_record_holds_every_measurement_and_cg_meets_its_tolerances():
    record = main(["--n", "300", "--evidence-rows", "100"])
    assert record["n"] == 300 and record["product_seconds"] > 0
    for run in record["cg"]:
        assert run["iterations"] >= 1 and run["alpha_error"] < 1e3 * run["tol"]
    assert record["cg_unpreconditioned"]["iterations"] >= record["cg"][1]["iterations"]
    low, high = record["lanczos"]  # ranks 64 and 256 of 300 rows: the larger all but Khat^{-1} on the data
    assert high["variance_error_max"] < min(1e-3, low["variance_error_max"])
    assert high["variance_error_median"] >= 0  # the cache errs on the large side
