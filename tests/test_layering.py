"""The package's import graph, read from the source: no cycles, and every module imports only from its own layer
or the layers below it, so that each layer can be understood (and tested) without the ones above; no module over
450 lines and none importing another's private name. The graph is read by ``tools.house_metrics``, which reports the
same numbers."""
import pytest

from tools.house_metrics import MAX_LINES, cycles, import_graph, module_names

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


MODULES = module_names()
GRAPH, PRIVATE = import_graph()


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
    assert not cycles(GRAPH), f"import cycles: {cycles(GRAPH)}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_has_at_most_450_lines(name):
    """A module has one job: past a few hundred lines it has grown a second one, which wants a module of its own."""
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it along its seams"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_no_private_name_from_another(name):
    """A name starting with ``_`` belongs to its module; another module that needs it wants it public (or moved)."""
    private = PRIVATE[name]
    assert not private, f"{name} imports private names {private}"
