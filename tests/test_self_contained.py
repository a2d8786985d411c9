"""The package's docstrings, comments and data files, and the experiment scripts beside it, must stand alone: they may
cite the papers (equations, sections, algorithms, tables), but not the design notes and per-paper specifications
that live outside the package, which a user of gpscale does not have.

A pure text scan of comments and string literals (no imports), so it runs in well under a second.
"""
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpscale"

# A section sign, a path into the unshipped notes, a "spec: <file>" citation, or a numbered pitfall from a spec.
FORBIDDEN = re.compile(r"§|shared/specs|\.\./shared|spec:|pitfall \d", re.IGNORECASE)

# Only comments and string literals are scanned, so that code such as ``def kernel_from_spec(spec: dict)`` passes.
TEXT_TOKENS = {tokenize.COMMENT, tokenize.STRING}


def package_files():
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "experiments").glob("*.py")])


def data_files():
    """The protocols and the papers' tables the benchmark reads (TOML and CSV: every line is text)."""
    return sorted(path for path in PACKAGE.rglob("*") if path.suffix in (".toml", ".csv"))


def references(path: Path) -> list[str]:
    """``path:line: text`` for each forbidden reference in the comments and strings of one file."""
    found = []
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in TEXT_TOKENS:
            continue
        for offset, line in enumerate(token.string.splitlines()):
            if FORBIDDEN.search(line):
                found.append(f"{path.relative_to(ROOT)}:{token.start[0] + offset}: {line.strip()}")
    return found


def data_references(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
            if FORBIDDEN.search(line)]


def test_docstrings_and_comments_do_not_cite_the_unshipped_specs():
    files, data = package_files(), data_files()
    assert len(files) > 10 and len(data) > 5  # the scan found the package and its data
    found = [reference for path in files for reference in references(path)]
    found += [reference for path in data for reference in data_references(path)]
    assert not found, ("State the fact instead of pointing at a spec section or pitfall that users cannot read:\n"
                       + "\n".join(found))


# The documentation states facts in its own words too; it may say "the paper's eq. 24", not "the spec's".
DOCS_FORBIDDEN = re.compile(FORBIDDEN.pattern + r"|\bthe spec\b|\bspec's\b|\bspec check|working reference",
                            re.IGNORECASE)


def documentation_files():
    """The site's pages and configuration, the README, the citation file and the docs tooling."""
    return sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "CITATION.cff",
                   *(ROOT / "tools").glob("*.py")])


def test_the_documentation_does_not_cite_the_unshipped_specs():
    files = documentation_files()
    assert len(files) > 15
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if DOCS_FORBIDDEN.search(line)]
    assert not found, "State the fact instead of pointing at notes that readers do not have:\n" + "\n".join(found)
