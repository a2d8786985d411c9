"""What ``GPRegressor(method=key)`` uses when it is given no options: every option with its default and meaning.

The rows come from the code (the model's constructor and its docstring, the training defaults and ``auto_dtype``
its class declares, the estimator's own starts), so the options table of each method's documentation page is
generated from them and cannot drift from what a fit does.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from .models.base import GPModel, constructor_parameters, get_model_class, option_names
from .options import CONSTRAINTS

__all__ = ["OptionDefault", "method_defaults", "options_table"]

# what the estimator starts a stationary kernel's lengthscales at when it is given none (GPRegressor.fit)
_MEDIAN = "the median distance between training rows"


@dataclass(frozen=True)
class OptionDefault:
    """One option of a method: its name, the value a fit with no options uses (as text) and what it is."""
    name: str
    default: str
    means: str


def method_defaults(key: str) -> list[OptionDefault]:
    """The options of ``GPRegressor(method=key)``: the training settings first, then the model's options in the order
    its constructors declare them (the method's own before those it shares with every method)."""
    cls = get_model_class(key)
    meanings = _documented_options(cls)
    rows = _training_rows(cls)
    seen = {row.name for row in rows}
    for parameters in constructor_parameters(cls):
        for p in parameters.values():
            if p.name in seen or p.name in ("self", "n_features") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            seen.add(p.name)
            default = _MEDIAN if p.name == "lengthscale" and _starts_at_median(cls) else _shown(p.default)
            rows.append(OptionDefault(p.name, default, _meaning(p.name, meanings)))
    return rows


def options_table(key: str) -> str:
    """:func:`method_defaults` as a markdown table."""
    lines = ["| option | default | what it is |", "|---|---|---|"]
    lines += [f"| `{row.name}` | {row.default} | {row.means} |" for row in method_defaults(key)]
    return "\n".join(lines)


def _training_rows(cls: type[GPModel]) -> list[OptionDefault]:
    train = cls.training_defaults()
    optimizer = "L-BFGS" if train.optimizer == "lbfgs" else "Adam"
    rows = [OptionDefault("dtype", f"`'auto'`: {cls.auto_dtype}", "the dtype of the data-sized work; the "
                          "m x m cores and every solve run in float64 whatever it is"),
            OptionDefault("epochs", "`None`", f"passes over the data with Adam; `None` trains with {optimizer} "
                          "until the objective stops improving (`gpscale.defaults.Convergence`) or `max_steps`"),
            OptionDefault("max_steps", f"`{train.max_steps}`", "the cap of optimiser steps of a fit to convergence"),
            OptionDefault("lr", f"`{train.lr:g}`", f"{optimizer}'s learning rate" if train.optimizer == "adam"
                          else "Adam's learning rate, where `epochs` asks for Adam (L-BFGS takes no rate)")]
    if not cls.full_batch:
        rows.append(OptionDefault("batch_size", f"`{train.batch_size}`", "the number of rows per minibatch"))
    return rows


def _starts_at_median(cls: type[GPModel]) -> bool:
    """Whether a fit given no lengthscale starts it at the median distance: the estimator asks every model
    (:meth:`~gpscale.models.base.GPModel.start_lengthscale_at_median`), and the model's default kernel decides,
    so a small one is built to ask (of 8 x 8 images for the methods that take images)."""
    n_features, images = (64, {"image_shape": (8, 8)}) if "image_shape" in option_names(cls) else (4, {})
    return cls(n_features, **images).start_lengthscale_at_median()


def _shown(value) -> str:
    if value is inspect.Parameter.empty:
        return "required"
    if isinstance(value, float):
        return f"`{value:.4g}`"
    return f"`{value!r}`"


def _meaning(name: str, meanings: dict[str, str]) -> str:
    """The option table's short meaning of a numeric option, else the docstring's sentence, else the sentence of
    another method that documents the same option (an entry "as :class:`VFF`" defers to it)."""
    if name in CONSTRAINTS:
        return CONSTRAINTS[name].means
    if name in meanings:
        return meanings[name]
    from .models.base import available_methods

    for key in available_methods():
        other = _documented_options(get_model_class(key))
        if name in other:
            return other[name]
    return ""


def _documented_options(cls: type[GPModel]) -> dict[str, str]:
    """The first sentence of each option's entry in the ``Args:`` sections of ``cls``'s docstrings and its bases',
    the subclass's first; an entry for ``a, b`` serves both."""
    meanings: dict[str, str] = {}
    for klass in cls.__mro__:
        for doc in (klass.__doc__, klass.__dict__.get("__init__", None).__doc__ if "__init__" in klass.__dict__
                    else None):
            for names, text in _args_entries(inspect.cleandoc(doc or "")):
                for name in names:
                    meaning = _deferred(text, name) if text.startswith("as ") else text
                    if meaning:
                        meanings.setdefault(name, meaning)
    return meanings


def _deferred(text: str, name: str) -> str | None:
    """The meaning an entry "as `Other`" defers to: the option's entry in the registered method class ``Other``."""
    from .models.base import available_methods

    other = re.match(r"as `(\w+)`", text)
    for key in available_methods() if other else ():
        cls = get_model_class(key)
        if cls.__name__ == other[1]:
            return _documented_options(cls).get(name)
    return None


_ENTRY = re.compile(r"^(?P<indent> +)(?P<names>\w+(?:, \w+)*)(?: \([^)]*\))?: (?P<text>.*)$")


def _args_entries(doc: str):
    """(names, first sentence) of each entry of the docstring's ``Args:`` section."""
    lines = doc.splitlines()
    if "Args:" not in [line.strip() for line in lines]:
        return
    start = [line.strip() for line in lines].index("Args:") + 1
    entry, indent = None, None
    for line in lines[start:] + [""]:
        match = _ENTRY.match(line)
        if match and (indent is None or len(match["indent"]) == indent):
            if entry:
                yield entry[0], _first_sentence(" ".join(entry[1]))
            indent = len(match["indent"])
            entry = (match["names"].split(", "), [match["text"]])
        elif entry and line.startswith(" " * ((indent or 0) + 1)):
            entry[1].append(line.strip())
        elif entry:
            yield entry[0], _first_sentence(" ".join(entry[1]))
            entry = None
            if not line.strip():
                continue
            break


def _first_sentence(text: str) -> str:
    """The text's first sentence, its reStructuredText roles and literals as markdown code."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?(\w+)`", r"`\1`", text).replace("``", "`").replace("|", "\\|")
    # the table's default column says what the default is; a docstring's "(default ...)" may be a base class's
    text = re.sub(r"\s*\((?:the )?default[^()]*\)", "", re.sub(r"\(default; ", "(", text))
    match = re.search(r"(?<![ .][a-z])(?<!e\.g)(?<!i\.e)(?<!App)(?<!Sec)(?<!eq)(?<!\.)\.(?!\.)(\s|$)", text)
    return text[:match.start() + 1] if match else text
