"""The package's import graph, read from the source: no cycles, and every module imports only from its own layer
or the layers below it, so that each layer can be understood (and tested) without the ones above."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpscale"

# lowest first: numerics and plumbing; kernels and likelihoods; the models (the two engines and the methods on them);
# training; the estimators; the benchmark; the command line
LAYERS = [
    {"_version", "_stack", "device", "linalg", "distributed", "shards", "metrics", "scaling", "defaults", "lbfgs",
     "mcmc", "operators", "io", "data", "options", "cite", "heap", "memory", "iterative",
     "preemption", "checkpoint", "tables", "sources"},
    {"kernels", "likelihoods"},
    {"models", "describe"},
    {"train"},
    {"estimator", "__init__"},
    {"bench"},
    {"cli", "__main__"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The gpscale modules ``path`` imports at run time (imports under ``if TYPE_CHECKING:`` excluded)."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("gpscale"):  # ``from pkg import submodule`` imports the submodule, names the module
                submodules = {f"{target}.{alias.name}" for alias in node.names} & set(MODULES)
                found.update(submodules or {target})
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("gpscale"))
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in imports_of(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else "__init__"
    return next(i for i, members in enumerate(LAYERS) if top in members)


def test_every_module_has_a_layer():
    for name in MODULES:
        layer(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_and_those_below(name):
    above = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
    assert not above, f"{name} imports {above}, which sit above it"


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [name])


MAX_MODULE_LINES = 450


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_has_at_most_450_lines(name):
    """A module has one job: past a few hundred lines it has grown a second one, which wants a module of its own."""
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines: split it along its seams"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_no_private_name_from_another(name):
    """A name starting with ``_`` belongs to its module; another module that needs it wants it public (or moved)."""
    tree = ast.parse(MODULES[name].read_text())
    private = [f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names
               if (node.level or (node.module or "").startswith("gpscale")) and alias.name.startswith("_")
               and not alias.name.startswith("__")]
    assert not private, f"{name} imports private names {private}"
