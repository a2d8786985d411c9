"""The documentation site cannot drift from the code: every page's Python examples run, every ``gpscale`` command on
a page parses, every generated part (options tables, citations, reproduced numbers) renders, and the site builds
in strict mode where mkdocs is installed."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import docs_examples
from tools.griffe_roles import markdown_roles
from tools.mkdocs_hooks import MARKER, RESULTS, expand, lists_apart

ROOT = Path(__file__).resolve().parents[1]
PAGES = docs_examples.pages()


def test_the_site_has_the_pages_its_navigation_names():
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert {p.name for p in PAGES} == set(nav)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_example_of_the_page_runs_and_every_command_parses(page, tmp_path, monkeypatch):
    monkeypatch.delenv("GPSCALE_DATA", raising=False)  # the examples use generated data only
    docs_examples.run_page(page, tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_generated_part_of_the_page_renders(page):
    markdown = page.read_text()
    rendered = expand(markdown)
    assert not MARKER.search(rendered)
    for kind, name in MARKER.findall(markdown):
        if kind == "results":
            assert (RESULTS / f"{name}.sqlite").is_file()


def test_a_results_marker_for_a_missing_store_fails_the_build():
    with pytest.raises(ValueError, match="no results store"):
        expand("<!-- gpscale:results no-such-store -->\n")


def test_code_blocks_fenced_indented_and_continuations():
    page = ("text\n\n```python\nx = 1\n```\n\n    gpscale bench --protocol quick \\\n      --out r\n\n"
            "- a list item\n    continued, not code\n\n~~~bash\ngpscale data list\n~~~\n")
    blocks = docs_examples.code_blocks(page)
    assert [(b.lang, b.code) for b in blocks] == [
        ("python", "x = 1"), ("", "gpscale bench --protocol quick \\\n  --out r"), ("bash", "gpscale data list")]
    assert [argv for _, argv in docs_examples.gpscale_commands(page)] == [
        ["bench", "--protocol", "quick", "--out", "r"], ["data", "list"]]


@pytest.mark.parametrize("argv, problem", [
    (["bench", "--protocol", "no-such-protocol"], "no protocol"),
    (["bench", "--protocol", "quick", "[--out", "r]"], "does not parse"),
    (["fit", "data.csv"], "does not parse"),  # --target and -o are required
])
def test_a_command_that_would_fail_is_refused(argv, problem):
    with pytest.raises(ValueError, match=problem):
        docs_examples.check_command(argv)


def test_the_site_builds_in_strict_mode(tmp_path):
    """Every link, anchor, generated part and API docstring of the site, as `make docs` builds it; the figures the
    examples draw (`make docs` runs them first) stand in as empty files, since the example test draws them."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("generated"))
    for page in PAGES:
        for figure in re.findall(r"\]\((generated/[^)]+)\)", page.read_text()):
            (docs / figure).parent.mkdir(parents=True, exist_ok=True)
            (docs / figure).write_bytes(b"")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("tools/mkdocs_hooks.py", str(ROOT / "tools" / "mkdocs_hooks.py"))
    config = config.replace("tools/griffe_roles.py", str(ROOT / "tools" / "griffe_roles.py"))
    (tmp_path / "mkdocs.yml").write_text(config)
    environment = {k: v for k, v in os.environ.items() if k != "GPSCALE_DATA"} | {"NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "softki" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "<code>Kernel</code>" in api and not re.search(r":(func|class|meth|data|mod):", api)


def test_sphinx_roles_become_the_code_sphinx_would_show():
    text = ":func:`gpscale.train.fit`, :class:`~gpscale.kernels.Kernel`, :ref:`the guide <routing>` and :py:meth:`x.y`"
    assert markdown_roles(text) == "`gpscale.train.fit`, `Kernel`, `the guide` and `x.y`"
    assert markdown_roles("``literal`` and `code`") == "``literal`` and `code`"


def test_a_list_right_after_text_becomes_a_list_as_on_github_but_not_inside_code():
    page = "Options:\n- a\n- b\n\n```text\nnot a list:\n- x\n```\n"
    assert lists_apart(page) == "Options:\n\n- a\n- b\n\n```text\nnot a list:\n- x\n```\n"
    assert lists_apart("| a |\n- b\n") == "| a |\n- b\n"  # only after paragraph text


def test_a_titled_block_runs_as_a_script_by_its_command_and_must_succeed(tmp_path):
    ok = tmp_path / "ok.md"
    ok.write_text('```python title="hello.py"\n# run as: python hello.py\nopen("said", "w").write("hi")\n```\n')
    docs_examples.run_page(ok, tmp_path / "out")
    assert (tmp_path / "out" / "ok" / "said").read_text() == "hi"
    failing = tmp_path / "failing.md"
    failing.write_text('```python title="fail.py"\nraise SystemExit(3)\n```\n')
    with pytest.raises(RuntimeError, match="fail.py at line 1 .* exited with 3"):
        docs_examples.run_page(failing, tmp_path / "out")
