"""Numbers that say how readable the package is, read from its source: ``python -m tools.house_metrics``.

- modules over 450 lines;
- string literals equal to a registry key outside ``models/``, ``cite.py`` and the protocol files (docstrings
  excluded): each is a method's knowledge kept away from its class;
- docstring and comment lines that cite a timing or a measurement (a number with a unit of time or memory, or a
  score such as RMSE, NLPD, accuracy or coverage next to a decimal number): history that goes stale in the code;
- the share of docstring and comment lines among the non-blank lines of ``models/``;
- import cycles between the package's modules, and names starting with ``_`` imported from another module.
"""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpscale"
MAX_LINES = 450
MEASUREMENT = re.compile(
    r"\b\d+(?:[.,]\d+)*\s*(?:s|ms|seconds?|minutes?|hours?|GB|MB|GiB|MiB|KB)\b(?!-)"
    r"|\b(?:RMSE|NLPD|NLL|accuracy|coverage|measured)\b[^.]*\d\.\d", re.IGNORECASE)


def modules() -> dict[str, Path]:
    return {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def doc_and_comment_lines(source: str) -> tuple[list[str], int]:
    """The docstring and comment lines of ``source``, and its non-blank lines."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            for i in range(body[0].lineno, body[0].end_lineno + 1):
                found[i] = lines[i - 1]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.setdefault(tok.start[0], tok.string)
    return [found[i] for i in sorted(found) if found[i].strip()], sum(1 for line in lines if line.strip())


def registry_keys() -> set[str]:
    sys.path.insert(0, str(PACKAGE.parent))
    from gpscale.models import available_methods
    return set(available_methods())


def may_name_methods(rel: str) -> bool:
    """Whether the module at ``rel`` (relative to the package) may name a method by its registry key: the models,
    the citations, and the protocol definitions (the files beside bench/protocols/__init__.py)."""
    return (rel.startswith("models/") or rel == "cite.py"
            or (rel.startswith("bench/protocols/") and rel != "bench/protocols/__init__.py"))


def key_literals(source: str, keys: set[str]) -> list[int]:
    """The lines of the string literals in ``source`` equal to one of ``keys``, docstrings excluded."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value in keys and id(n) not in docstrings]


def module_names() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__.py``)."""
    names = {}
    for rel, path in modules().items():
        parts = ("gpscale/" + rel).removesuffix(".py").split("/")
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Module -> the gpscale modules it imports at run time (imports under ``if TYPE_CHECKING:`` excluded); and
    module -> the private names (``_x``, by their full dotted name) it imports from other modules."""
    names = module_names()
    graph, private = {}, {}
    for name, path in names.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                node.body = []
        edges, private[name] = set(), []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gpscale")):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = {f"{target}.{a.name}" for a in node.names} & set(names)
                edges |= subs or {target}  # ``from pkg import submodule`` imports the submodule
                private[name] += [f"{target}.{a.name}" for a in node.names
                                  if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("gpscale")}
        graph[name] = {m for m in edges if m in names and m != name}
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def main() -> None:
    mods = modules()
    long = {rel: len(p.read_text().splitlines()) for rel, p in mods.items()}
    long = {rel: n for rel, n in long.items() if n > MAX_LINES}
    keys = registry_keys()
    literal_count = 0
    for rel, path in mods.items():
        if may_name_methods(rel):
            continue
        lines = key_literals(path.read_text(), keys)
        if lines:
            literal_count += len(lines)
            print(f"  keys in {rel}: lines {lines}")
    measured, docs_models, nonblank_models = [], 0, 0
    for rel, path in mods.items():
        doc, nonblank = doc_and_comment_lines(path.read_text())
        measured += [(rel, line.strip()) for line in doc if MEASUREMENT.search(line)]
        if rel.startswith("models/"):
            docs_models += len(doc)
            nonblank_models += nonblank
    graph, private = import_graph()
    found = cycles(graph)
    if "-v" in sys.argv:
        for rel, line in measured:
            print(f"  measured {rel}: {line[:110]}")
        for module, names in private.items():
            for name in names:
                print(f"  private import in {module}: {name}")
    print(f"modules over {MAX_LINES} lines: {len(long)} {sorted(long.items(), key=lambda kv: -kv[1])}")
    print(f"registry keys outside models/: {literal_count}")
    print(f"docstring and comment lines citing measurements: {len(measured)}")
    print(f"docstrings and comments in models/: {docs_models / nonblank_models:.0%} "
          f"({docs_models} of {nonblank_models} non-blank lines)")
    print(f"import cycles: {len(found)} {found}")
    print(f"private names imported from another module: {sum(map(len, private.values()))}")


if __name__ == "__main__":
    main()
