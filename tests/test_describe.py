"""gpscale.describe: every option of every method with the default a fit without options uses, from the code."""
import pytest

from gpscale.describe import method_defaults, options_table
from gpscale.models import available_methods, get_model_class
from gpscale.models.base import option_default, option_names


@pytest.mark.parametrize("key", available_methods())
def test_every_option_of_the_method_is_listed_with_its_default_and_meaning(key):
    cls = get_model_class(key)
    rows = {row.name: row for row in method_defaults(key)}
    assert option_names(cls) <= set(rows)
    for name in option_names(cls) - {"lengthscale"}:
        assert rows[name].default == (f"`{option_default(cls, name):.4g}`" if isinstance(option_default(cls, name),
                                      float) else f"`{option_default(cls, name)!r}`"), name
        assert rows[name].means, f"{key}: option {name} has no meaning in any docstring"
    train = cls.training_defaults()
    assert rows["max_steps"].default == f"`{train.max_steps}`" and rows["lr"].default == f"`{train.lr:g}`"
    assert cls.auto_dtype in rows["dtype"].default
    assert ("batch_size" in rows) == (not cls.full_batch)


@pytest.mark.parametrize("key", ["exact", "softki", "hvgp", "dbk", "odvff", "vff", "vff-svgp", "svdbk"])
def test_the_lengthscale_row_says_what_the_estimator_starts_it_at(key):
    cls = get_model_class(key)
    model = cls(4)
    starts_at_median = model.start_lengthscale_at_median()  # what GPRegressor asks of a model given no lengthscale
    row = next(row for row in method_defaults(key) if row.name == "lengthscale")
    assert ("median" in row.default) == starts_at_median


def test_the_table_is_markdown_with_a_row_per_option():
    table = options_table("sgpr").splitlines()
    assert table[0] == "| option | default | what it is |"
    assert len(table) == 2 + len(method_defaults("sgpr"))
    assert all(line.count(" | ") >= 2 for line in table[2:])


def test_an_option_documented_as_another_methods_takes_that_meaning():
    """ODVFF documents its kernel "as VFF": the Matérns VFF takes, not the base class's list with 'rbf' in it."""
    kernel = next(row for row in method_defaults("odvff") if row.name == "kernel")
    assert "matern32" in kernel.means and "rbf" not in kernel.means
