"""A griffe extension for the API reference: Sphinx roles in the docstrings shown as code.

The docstrings follow the numpy convention, where a reference to another object is a Sphinx role
(``:func:`gpscale.train.fit```, ``:class:`~gpscale.kernels.Kernel```); ``help()`` and IDEs show them as written, but
Markdown has no roles, so the site would print the colons and the tilde. This rewrites each role to inline code of
the name a reader of the Sphinx output would see: the target, its last component when the target starts with ``~``,
or the title of a ``title <target>`` role.
"""
from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|obj|exc|const|term|ref):`([^`]+)`")


def _shown_name(target: str) -> str:
    """What Sphinx prints for a role's text: ``title <target>`` -> title, ``~a.b.c`` -> c, ``a.b.c`` -> a.b.c."""
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", target)
    if titled:
        return titled.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


def markdown_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by inline code of the name it shows."""
    return ROLE.sub(lambda match: f"`{_shown_name(match.group(1))}`", text)


class SphinxRolesAsCode(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring griffe loads (see the module's docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_roles(obj.docstring.value)
