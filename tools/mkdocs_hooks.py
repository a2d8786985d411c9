"""mkdocs hooks: the parts of the documentation that are generated from the code and the results stores.

A page asks for them with one-line markers, replaced when the site is built:

- ``<!-- gpscale:options KEY -->``: the table of every option of ``GPRegressor(method=KEY)`` with its default
  (:func:`gpscale.describe.options_table`);
- ``<!-- gpscale:cite KEY -->``: the BibTeX of the papers behind the method (:func:`gpscale.cite`);
- ``<!-- gpscale:results NAME -->``: the reproduced numbers of the results store ``docs/results/NAME.sqlite``, with
  the commands, commit, machine and dates of its runs (:func:`gpscale.bench.report.results_section`, what
  ``gpscale report STORE --section`` prints).

A marker naming an unknown method or a missing store fails the build.

The pages are also written to read on GitHub, whose markdown starts a list right after a line of text; Python-Markdown
would run such a list into the paragraph, so the hook puts a blank line before it (outside code blocks).
"""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
MARKER = re.compile(r"^<!-- gpscale:(?P<kind>options|cite|results) (?P<name>[\w-]+) -->$", re.M)


def render(kind: str, name: str) -> str:
    """The markdown a marker stands for."""
    if kind == "options":
        from gpscale.describe import options_table

        return options_table(name)
    if kind == "cite":
        from gpscale import cite

        return f"```bibtex\n{cite(name)}\n```"
    from gpscale.bench.report import results_section

    store = RESULTS / f"{name}.sqlite"
    if not store.is_file():
        raise ValueError(f"no results store {store} for the marker 'gpscale:results {name}'")
    return results_section(store)


def expand(markdown: str) -> str:
    return MARKER.sub(lambda m: render(m["kind"], m["name"]), markdown)


_LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")
_FENCE = re.compile(r"^\s*(```|~~~)")


def lists_apart(markdown: str) -> str:
    """A blank line before every list that follows a line of paragraph text directly."""
    lines, out, in_code = markdown.split("\n"), [], False
    for line in lines:
        if _FENCE.match(line):
            in_code = not in_code
        previous = out[-1] if out else ""
        if (not in_code and _LIST_ITEM.match(line) and previous.strip() and not _LIST_ITEM.match(previous)
                and not previous.startswith((" ", "|", "#", ">"))):
            out.append("")
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, **_) -> str:
    return lists_apart(expand(markdown))
