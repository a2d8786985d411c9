"""The table of option constraints (gpscale.options): what it admits and refuses, that it covers every numeric
option of every registered method, and that the estimator checks it before touching the data."""
import inspect
import math
from pathlib import Path

import numpy as np
import pytest

from gpscale import GPRegressor
from gpscale.models import available_methods, get_model_class
from gpscale.models.base import option_default, option_names
from gpscale.options import CONSTRAINTS, Constraint, check_options, constraints_table


def _estimator_options() -> set[str]:
    return set(inspect.signature(GPRegressor.__init__).parameters) - {"self", "method_options"}


def test_every_numeric_option_of_every_method_has_a_constraint():
    numeric = set()
    for key in available_methods():
        cls = get_model_class(key)
        for name in option_names(cls):
            default = option_default(cls, name)
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                numeric.add(name)
    assert numeric <= set(CONSTRAINTS)


def test_every_constraint_names_an_option_that_exists():
    every = _estimator_options().union(*(option_names(get_model_class(k)) for k in available_methods()))
    assert set(CONSTRAINTS) <= every


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_each_constraint_admits_its_bounds_and_refuses_beyond_them(name):
    rule = CONSTRAINTS[name]
    inside = rule.low + (1 if rule.low_open else 0) if rule.low is not None else 1
    if rule.high is not None and inside > rule.high:
        inside = (rule.low + rule.high) / 2
    check_options({name: inside, "unrelated": -1})  # options without an entry pass
    check_options({name: None})  # None asks for the default
    for bad in [float("nan"), math.inf, True, "many", [inside]]:
        with pytest.raises(ValueError, match=f"^{name} \\(.*\\) must be "):
            check_options({name: bad})
    if rule.low is not None:
        below = rule.low if rule.low_open else rule.low - 1
        with pytest.raises(ValueError, match=f"got {below!r}"):
            check_options({name: below})
    if rule.high is not None:
        with pytest.raises(ValueError):
            check_options({name: rule.high + (0 if rule.high_open else 1)})
    if rule.integer:
        with pytest.raises(ValueError, match="must be an integer"):
            check_options({name: inside + 0.5})
        check_options({name: np.int64(inside)})


def test_descriptions_read_as_the_interval():
    assert Constraint(True, low=1).describe() == "an integer >= 1"
    assert Constraint(False, low=0, high=1, low_open=True).describe() == "a number in (0, 1]"
    assert Constraint(False, low=0, low_open=True, words=("median",)).describe() == "a number > 0 or 'median'"


@pytest.mark.parametrize("options, message", [
    (dict(method="svgp", n_inducing=-5), "n_inducing .* must be an integer >= 1, got -5"),
    (dict(method="svgp", epochs=2.5), "epochs .* must be an integer >= 1, got 2.5"),
    (dict(method="exact", lengthscale=float("nan")), "lengthscale .* must be a number > 0 or 'median', got nan"),
    (dict(method="svgp", chunk_size=0), "chunk_size .* got 0"),
])
def test_the_estimator_refuses_a_bad_value_before_touching_the_data_and_keeps_its_fit(options, message):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 2)), rng.normal(size=40)
    reg = GPRegressor(method="exact", epochs=2, progress=False).fit(X, y)
    before = reg.predict(X[:5])
    reg.set_params(**options)
    with pytest.raises(ValueError, match=message):
        reg.fit(X * 100, y + 50)  # would move the scaling, were it reached
    np.testing.assert_array_equal(reg.predict(X[:5]), before)


def test_the_docs_list_the_table():
    page = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert page.endswith(constraints_table())
