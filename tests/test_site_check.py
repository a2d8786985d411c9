"""tools/check_site.py on a hand-made site of two pages: a good link, a broken link, a broken anchor, a missing image.

The link check is pure Python and runs everywhere; the browser check is skipped where selenium or Chromium is
missing (CI has no Chromium)."""
import pytest

from tools import check_site

# a page with no icon of its own has Chromium ask for /favicon.ico, one more failed load
ICON = '<link rel="icon" href="data:,">'
INDEX = f"""<!doctype html><html><head><title>home</title>{ICON}</head><body>
<a href="other/">good link</a>
<a href="other/index.html#here">good anchor</a>
<a href="missing.html">broken link</a>
<a href="other/#nowhere">broken anchor</a>
<a href="https://example.org/x">external</a>
<a href="mailto:someone@example.org">mail</a>
<img src="missing.png" alt="missing">
</body></html>"""
OTHER = f"""<!doctype html><html><head><title>other</title>{ICON}</head><body>
<h1 id="here">Here</h1><a href="../">home</a><a href="#here">self</a>
</body></html>"""

LINK_PROBLEMS = ["index.html: broken link missing.html", "index.html: broken anchor other/#nowhere"]


@pytest.fixture
def site(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "index.html").write_text(INDEX)
    (tmp_path / "other" / "index.html").write_text(OTHER)
    (tmp_path / "404.html").write_text('<a href="not-checked.html">a page that is skipped</a>')
    return tmp_path


def test_links_and_anchors(site):
    pages = check_site.site_pages(site)
    assert [page.relative_to(site).as_posix() for page in pages] == ["index.html", "other/index.html"]
    problems, internal, external = check_site.check_links(site, pages)
    assert problems == LINK_PROBLEMS
    assert internal == 6  # four on the home page, two on the other; mailto: is no link to a page
    assert external == {"https://example.org/x"}


def test_in_browser(site, capsys):
    pytest.importorskip("selenium")
    missing = check_site.missing_browser()
    if missing:
        pytest.skip(missing)
    shots = site / "shots"
    assert check_site.main(["--site", str(site), "--screenshots", str(shots)]) == 1
    lines = capsys.readouterr().out.splitlines()
    problems, summary = lines[:-1], lines[-1]
    # the missing image twice: not loaded, and its failed load in the console
    console = [line for line in problems if line.startswith("index.html: console SEVERE: /missing.png - ")]
    assert len(console) == 1
    assert sorted(set(problems) - set(console)) == sorted([*LINK_PROBLEMS, "index.html: image not loaded: missing.png"])
    assert summary.endswith(": 4 problems") and "6 internal links and 1 images checked" in summary
    assert (shots / "home.png").stat().st_size > 0
