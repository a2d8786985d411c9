"""Named, versioned benchmark protocols, read from the TOML files beside this module.

A protocol is a list of method entries (a method key and its options), datasets, splits and seeds, plus the
published numbers of the paper it reproduces (a CSV file in ``published/``), so that a report can print them beside
ours. A protocol's ``version`` changes whenever a change would alter its numbers; ``--resume`` only skips runs of
the same version.

Method keys are gpscale registry keys (``sgpr``, ``svgp``, ...), ``estimator`` (``GPRegressor(**options)``) or
peers (:data:`PEER_KEYS`: the GPyTorch ``gpytorch-sgpr``, ``gpytorch-svgp``, ``gpytorch-exact``, and the SoftKI
authors' code, ``softki-official``). Options are those of the method plus the training settings ``epochs``,
``batch_size`` and ``lr``, and, for gpscale methods only, ``val_fraction`` and ``patience`` (early stopping on the
validation NLPD, see :func:`gpscale.train.fit`; the peers train for a fixed number of epochs). A method entry may
carry ``max_n``: datasets with more training points skip it.

The file format, one ``[[protocol]]`` table per protocol::

    [[protocol]]
    name = "quick"
    version = 7
    description = "..."
    datasets = ["friedman1", "energy"]      # run in this order, on the protocol's splits
    dataset_splits = { energy = [0, 1] }    # optional: other splits for some datasets
    splits = [0, 1, 2]                      # default [0]; seeds likewise
    dtype = "float32"                       # default float64; "auto": each estimator's (a method's auto_dtype)
    requires_data = true                    # or a list: datasets skipped, with a note, when not on disk
    published = "quick.csv"                 # optional: label, dataset, then one column per metric
    source = "..."                          # where the published numbers come from
    time_reference = "softki"               # optional: the report gives every method's s/epoch over this one's
    [protocol.dataset_options]              # keyword arguments of gpscale.data.load_dataset, per dataset
    friedman1 = { n = 40_000 }
    [[protocol.method]]
    key = "softki"
    label = "softki-calibrated"             # default: the key
    options = { n_inducing = 256, none = ["calibrate_noise"] }
    max_n = 2000                            # optional
    [protocol.method.dataset_overrides]     # options that replace or extend ``options`` on one dataset
    energy = { epochs = 30 }

TOML has no null: an options table's ``none`` lists the options whose value is None. Arrays become tuples.
"""
from __future__ import annotations

import csv
import tomllib
from dataclasses import dataclass, field, replace
from importlib.resources import files
from importlib.resources.abc import Traversable

from ...kernels import SOFTPLUS_ZERO
from ...models import available_methods, get_model_class

__all__ = ["MethodSpec", "Protocol", "PROTOCOLS", "PEER_KEYS", "is_peer", "get_protocol", "register_protocol",
           "read_protocols"]

# The method keys of the peers (gpscale.bench.peers.PEERS, which needs gpytorch to import): other code, not gpscale's,
# that the runner trains on the same data for a fixed number of epochs.
PEER_KEYS = frozenset({"gpytorch-exact", "gpytorch-sgpr", "gpytorch-svgp", "softki-official"})


def is_peer(key: str) -> bool:
    """Whether a method key names a peer rather than a gpscale method or the estimator."""
    return key in PEER_KEYS


@dataclass(frozen=True)
class MethodSpec:
    """One method under one set of options. ``label`` names it in reports (default: the key). ``dataset_overrides``
    maps a dataset name to options that replace or extend ``options`` on that dataset (the runner merges them and
    records the merged options with each run)."""

    key: str
    options: dict = field(default_factory=dict)
    label: str | None = None
    max_n: int | None = None
    dataset_overrides: dict[str, dict] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.key


@dataclass(frozen=True)
class Protocol:
    """An experiment. ``datasets`` maps a dataset name to the splits to run (``None``: the protocol's
    ``splits``); ``dataset_options`` are passed to :func:`gpscale.data.load_dataset` (e.g. ``n`` for generated
    sets, ``max_train``). ``published`` maps (method label, dataset) to {metric: value} from the paper."""

    name: str
    version: int
    description: str
    methods: tuple[MethodSpec, ...]
    datasets: dict[str, tuple[int, ...] | None]
    splits: tuple[int, ...] = (0,)
    seeds: tuple[int, ...] = (0,)
    dtype: str = "float64"
    dataset_options: dict[str, dict] = field(default_factory=dict)
    requires_data: tuple[str, ...] = ()  # datasets skipped (with a note) when the data folder lacks them
    published: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    source: str = ""  # where the published numbers come from
    time_reference: str | None = None  # a method label: the report adds each method's s/epoch over this one's


PROTOCOLS: dict[str, Protocol] = {}

# The estimators start a stationary kernel's lengthscales at the median distance between training rows unless they
# are given a lengthscale (gpscale.defaults); the papers, GPyTorch and the models themselves start at softplus(0) =
# ln 2. Every entry of a gpscale method whose kernel would start at the median (an RBF or Matérn built by name, where
# its class says ``lengthscale_starts_at_median``: not the separable Matérns of the Fourier-feature methods, nor a
# deep basis kernel) is given that start explicitly at registration, so that its recorded options are the estimator
# call that reproduces the run.
_STATIONARY_KERNELS = ("rbf", "matern12", "matern32", "matern52")
PAPER_START = {"lengthscale": SOFTPLUS_ZERO}


def _with_paper_start(spec: MethodSpec) -> MethodSpec:
    ours = spec.key in available_methods() and get_model_class(spec.key).lengthscale_starts_at_median
    if not ours or "lengthscale" in spec.options or spec.options.get("kernel", "rbf") not in _STATIONARY_KERNELS:
        return spec
    return replace(spec, options={**spec.options, **PAPER_START})


def register_protocol(protocol: Protocol) -> Protocol:
    """Add ``protocol`` to the registry, its gpscale entries starting their lengthscales as the papers do."""
    protocol = replace(protocol, methods=tuple(_with_paper_start(spec) for spec in protocol.methods))
    PROTOCOLS[protocol.name] = protocol
    return protocol


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {name!r}. Available: {', '.join(sorted(PROTOCOLS))}.")
    return PROTOCOLS[name]


# --- reading the files -------------------------------------------------------------------------------------------
def _value(value):
    return tuple(_value(item) for item in value) if isinstance(value, list) else value


def _options(table: dict) -> dict:
    """An options table as the estimator takes it: arrays as tuples, the names listed under ``none`` as None."""
    options = {name: _value(value) for name, value in table.items() if name != "none"}
    return {**options, **dict.fromkeys(table.get("none", ()))}


def _method(table: dict) -> MethodSpec:
    return MethodSpec(key=table["key"], options=_options(table.get("options", {})), label=table.get("label"),
                      max_n=table.get("max_n"),
                      dataset_overrides={name: _options(options)
                                         for name, options in table.get("dataset_overrides", {}).items()})


def _published(path: Traversable) -> dict[tuple[str, str], dict[str, float]]:
    """A paper's numbers: one row per (label, dataset), one column per metric, empty where the paper has none."""
    with path.open(newline="") as fh:
        return {(row.pop("label"), row.pop("dataset")): {metric: float(value) for metric, value in row.items()
                                                         if value != ""}
                for row in csv.DictReader(fh)}


def _protocol(table: dict, folder: Traversable) -> Protocol:
    splits = table.get("dataset_splits", {})
    datasets = {name: tuple(splits[name]) if name in splits else None for name in table["datasets"]}
    unknown = set(splits) - set(datasets)
    if unknown:
        raise ValueError(f"Protocol {table['name']!r}: dataset_splits names {sorted(unknown)}, which are not among "
                         "its datasets.")
    requires = table.get("requires_data", False)
    methods = tuple(_method(method) for method in table["method"])
    reference = table.get("time_reference")
    if reference is not None and reference not in {spec.name for spec in methods}:
        raise ValueError(f"Protocol {table['name']!r}: time_reference {reference!r} is not one of its method labels.")
    return Protocol(
        name=table["name"], version=table["version"], description=table["description"],
        methods=methods,
        datasets=datasets,
        splits=tuple(table.get("splits", (0,))),
        seeds=tuple(table.get("seeds", (0,))),
        dtype=table.get("dtype", "float64"),
        dataset_options={name: _options(options) for name, options in table.get("dataset_options", {}).items()},
        requires_data=tuple(datasets) if requires is True else tuple(requires or ()),
        published=_published(folder / "published" / table["published"]) if "published" in table else {},
        source=table.get("source", ""),
        time_reference=reference,
    )


def read_protocols(folder: Traversable) -> list[Protocol]:
    """Every protocol of the ``*.toml`` files in ``folder``, in file-name order, then in each file's order."""
    protocols = []
    for path in sorted((p for p in folder.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name):
        with path.open("rb") as fh:
            protocols += [_protocol(table, folder) for table in tomllib.load(fh).get("protocol", [])]
    return protocols


def _register_the_files() -> None:
    for protocol in read_protocols(files(__name__)):
        register_protocol(protocol)


_register_the_files()
