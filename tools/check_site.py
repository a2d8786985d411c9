"""Check the documentation site that ``mkdocs build`` wrote into ``site/``, as a reader's browser shows it.

Every HTML page of the site (not ``404.html``, not the ``search/`` and ``assets/`` folders) is checked for

* internal links (``<a href>``, resolved against the page's URL) to a file the site lacks, or with a ``#fragment``
  that no element of the target page has as its id: read from the HTML with ``html.parser``, no browser needed;
* images that did not load and console messages of level SEVERE (JavaScript errors, failed loads): the site is served
  over HTTP on a free localhost port and each page opened in headless Chromium through selenium.

Links to other hosts are counted, not fetched, and a resource of another host that the browser cannot reach at all
(the theme's Google fonts on a machine offline) is a note, not a problem. Screenshots 1280 pixels wide of the home,
chooser and SoftKI pages go into the screenshots folder, for a person to look at. Every problem is printed as a
``page: problem`` line and the exit status is 1 where there is one; it is 2 where Chromium, chromedriver or selenium
is missing.

    apt-get install chromium chromium-driver && pip install selenium
    mkdocs build && python -m tools.check_site [--site site] [--screenshots site-check]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1280, 2000
SCREENSHOTS = {"index.html": "home.png", "choosing/index.html": "choosing.png", "softki/index.html": "softki.png"}
MAX_SCREENSHOT_HEIGHT = 16000  # pixels: a page longer than that is cut, to keep the image a sensible size
NOT_PAGES = {"search", "assets"}  # mkdocs' search index and the theme's files
# A made-up address of the site for resolving hrefs without a server: urljoin then resolves a relative href as a
# browser does, and any other host is an external link
ORIGIN = "http://site.invalid/"


class PageParser(HTMLParser):
    """The hrefs of a page's ``<a>`` elements and the ids of all its elements."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href") is not None:
            self.hrefs.append(attrs["href"])
        if attrs.get("id"):
            self.ids.add(attrs["id"])


def parse(file: Path) -> PageParser:
    """The links and ids of the HTML file ``file``."""
    parser = PageParser()
    parser.feed(file.read_text(encoding="utf-8"))
    return parser


def site_pages(site: Path) -> list[Path]:
    """The HTML pages of ``site`` to check."""
    return sorted(page for page in site.rglob("*.html")
                  if page.name != "404.html" and page.relative_to(site).parts[0] not in NOT_PAGES)


def served_file(site: Path, url_path: str) -> Path:
    """The file a static server of ``site`` answers ``url_path`` with: a folder's ``index.html``."""
    file = site / unquote(url_path).lstrip("/")
    return file / "index.html" if file.is_dir() else file


def check_links(site: Path, pages: list[Path]) -> tuple[list[str], int, set[str]]:
    """The problems with the internal links of ``pages``, the number of internal links checked and the set of
    external links."""
    parsed = {page: parse(page) for page in pages}
    problems, internal, external = [], 0, set()
    for page in pages:
        rel = page.relative_to(site).as_posix()
        for href in parsed[page].hrefs:
            url = urlsplit(urljoin(ORIGIN + rel, href))
            if url.scheme not in ("http", "https"):  # mailto:, javascript: and the like lead to no page
                continue
            if url.netloc != urlsplit(ORIGIN).netloc:
                external.add(href)
                continue
            internal += 1
            target = served_file(site, url.path)
            if not target.is_file():
                problems.append(f"{rel}: broken link {href}")
            elif url.fragment and target.suffix == ".html":
                if target not in parsed:  # a page outside the checked ones, 404.html say: its ids are needed too
                    parsed[target] = parse(target)
                if unquote(url.fragment) not in parsed[target].ids:
                    problems.append(f"{rel}: broken anchor {href}")
    return problems, internal, external


def missing_browser() -> str | None:
    """What to install for the browser checks, or None where nothing is missing."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed: pip install selenium"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: apt-get install chromium chromium-driver"
    return None


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # a line per request would bury the problems
        pass


def serve(site: Path) -> ThreadingHTTPServer:
    """Serve ``site`` on a free localhost port, in a thread: a mkdocs site's links work over HTTP, not file://."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_browser():
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # --no-sandbox: Chromium refuses to run as root with its sandbox, and CI and containers run as root
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


# Lazy images load only once scrolled to: have them load now, so that a broken one shows without scrolling
LOAD_LAZY_IMAGES = "document.querySelectorAll('img[loading=lazy]').forEach(img => img.loading = 'eager')"
# After the load event (its handlers too) and with every image done; `complete` is true for a failed image as well
SETTLED = """return performance.getEntriesByType('navigation')[0].loadEventEnd > 0
                  && Array.from(document.images).every(img => img.complete)"""
BROKEN_IMAGES = """return Array.from(document.images).filter(img => !(img.complete && img.naturalWidth > 0))
                                                  .map(img => img.getAttribute('src'))"""
UNREACHABLE = "Failed to load resource: net::"  # no answer at all, unlike "the server responded with a status of"


@dataclass
class BrowserReport:
    """What the browser found on the pages and the number of screenshots it saved."""
    problems: list[str] = field(default_factory=list)
    images: int = 0
    unreachable: set[str] = field(default_factory=set)  # resources of other hosts that did not load
    screenshots: int = 0


def check_page(driver, base: str, rel: str, report: BrowserReport) -> None:
    """Add to ``report`` the images of page ``rel`` that did not load and its SEVERE console messages."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get(base + rel)
    driver.execute_script(LOAD_LAZY_IMAGES)
    try:
        WebDriverWait(driver, 10).until(lambda d: d.execute_script(SETTLED))
    except TimeoutException:  # the images still loading are reported as not loaded below
        pass
    report.images += driver.execute_script("return document.images.length")
    report.problems += [f"{rel}: image not loaded: {src}" for src in driver.execute_script(BROKEN_IMAGES)]
    # the log holds what was logged since it was last read: this page's messages
    for entry in driver.get_log("browser"):
        message = entry["message"]
        if entry["level"] != "SEVERE":
            continue
        if not message.startswith(base) and UNREACHABLE in message:
            # another host out of reach (the theme's Google fonts, offline) says no more about the site than an
            # external link does: noted, not a problem
            report.unreachable.add(message.split(" ")[0])
        else:  # the server's port changes from run to run: name the site's URLs by their path
            report.problems.append(f"{rel}: console SEVERE: {message.replace(base, '/')}")


def screenshot(driver, file: Path) -> None:
    """Save the page as tall as it is (up to MAX_SCREENSHOT_HEIGHT) by making the window that tall for the shot."""
    # the window is taller than the page's viewport, by 143 pixels in headless Chromium 156: add that
    height, frame = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]")
    driver.set_window_size(WIDTH, min(height, MAX_SCREENSHOT_HEIGHT) + frame)
    driver.save_screenshot(str(file))
    driver.set_window_size(WIDTH, HEIGHT)


def check_in_browser(driver, site: Path, pages: list[Path], shots: Path) -> BrowserReport:
    """Open ``pages`` in the browser, served over HTTP, and take the screenshots."""
    server = serve(site)
    base = f"http://127.0.0.1:{server.server_port}/"
    report = BrowserReport()
    try:
        for page in pages:
            rel = page.relative_to(site).as_posix()
            check_page(driver, base, rel, report)
            if rel in SCREENSHOTS:
                shots.mkdir(parents=True, exist_ok=True)
                screenshot(driver, shots / SCREENSHOTS[rel])
                report.screenshots += 1
    finally:
        server.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default="site", type=Path, help="the folder mkdocs built (default: site)")
    parser.add_argument("--screenshots", default="site-check", type=Path, help="where the screenshots go")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"check_site: no {args.site}/index.html: run mkdocs build first", file=sys.stderr)
        return 2
    missing = missing_browser()
    if missing:
        print(f"check_site: {missing}", file=sys.stderr)
        return 2
    from selenium.common.exceptions import WebDriverException

    try:
        driver = start_browser()
    except WebDriverException as error:  # a broken install: one line, not a traceback
        first_line = str(error.msg).splitlines()[0]
        print(f"check_site: cannot start {CHROMIUM} through {CHROMEDRIVER}: {first_line}", file=sys.stderr)
        return 2
    pages = site_pages(args.site)
    problems, links, external = check_links(args.site, pages)
    try:
        report = check_in_browser(driver, args.site, pages, args.screenshots)
    finally:
        driver.quit()
    problems = sorted(problems + report.problems)  # a page's problems together
    notes = [f"note: not reached (another host, not a problem): {url}" for url in sorted(report.unreachable)]
    print("\n".join(problems + notes + [
        f"check_site: {len(pages)} pages, {links} internal links and {report.images} images checked, "
        f"{len(external)} distinct external links seen (not fetched), {report.screenshots} screenshots in "
        f"{args.screenshots}: {len(problems)} problems"]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
