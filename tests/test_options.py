"""The table of option constraints (gpscale.options): what it admits and refuses, that it covers every numeric
option of every registered method, and that the estimator checks it before touching the data."""
import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest

from gpscale import GPRegressor
from gpscale.models import available_methods, get_model_class
from gpscale.models.base import option_default, option_names
from gpscale.options import CONSTRAINTS, Constraint, check_options, check_renamed, constraints_table, renamed_table


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


def test_the_docs_list_the_table():
    page = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert page.endswith(constraints_table())


RENAMED = {(key, old): new for key in available_methods()
           for old, new in get_model_class(key).renamed_options.items()}


def test_the_docs_list_the_renamed_options():
    page = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert RENAMED and renamed_table(RENAMED) in page


@pytest.mark.parametrize("method, old", sorted(RENAMED))
def test_a_renamed_option_is_refused_with_its_new_name(method, old):
    cls = get_model_class(method)
    new = RENAMED[(method, old)]
    assert new in option_names(cls) and old not in option_names(cls)
    message = f"option '{old}' of {method} is now '{new}': pass {new}=..."
    with pytest.raises(ValueError, match=re.escape(message)):
        check_renamed(method, cls.renamed_options, [old])
    check_renamed(method, cls.renamed_options, [new])
    with pytest.raises(ValueError, match=re.escape(message)):  # through the estimator, before any training
        GPRegressor(method=method, progress=False, **{old: "auto"}).fit(np.arange(8.0)[:, None], np.arange(8.0) % 3)


def test_the_old_name_of_a_renamed_option_stays_another_methods_option():
    """``solver`` is still the linear engine's: sgpr takes it, and grief (GP-GRIEF-II) never had it."""
    assert "solver" in option_names(get_model_class("sgpr"))
    assert "solver" not in get_model_class("sgpr").renamed_options | get_model_class("grief").renamed_options
