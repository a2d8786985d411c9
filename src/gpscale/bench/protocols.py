"""Named, versioned benchmark protocols.

A protocol is a list of method entries (a method key and its options), datasets, splits and seeds, plus the
published numbers of the paper it reproduces, so that a report can print them beside ours. Bump ``version``
whenever a change would alter its numbers; ``--resume`` only skips runs of the same version.

Method keys are gpscale registry keys (``sgpr``, ``svgp``, ...) or GPyTorch peers (``gpytorch-sgpr``,
``gpytorch-svgp``, ``gpytorch-exact``). Options are those of the method plus the training settings ``epochs``,
``batch_size`` and ``lr``. A method entry may carry ``max_n``: datasets with more training points skip it (the
exact GP on large sets).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MethodSpec", "Protocol", "PROTOCOLS", "get_protocol", "register_protocol"]


@dataclass(frozen=True)
class MethodSpec:
    """One method under one set of options. ``label`` names it in reports (default: the key)."""

    key: str
    options: dict = field(default_factory=dict)
    label: str | None = None
    max_n: int | None = None

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


PROTOCOLS: dict[str, Protocol] = {}


def register_protocol(protocol: Protocol) -> Protocol:
    PROTOCOLS[protocol.name] = protocol
    return protocol


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {name!r}. Available: {', '.join(sorted(PROTOCOLS))}.")
    return PROTOCOLS[name]


# SGPR and SVGP with the settings the papers use for their baselines (and GPyTorch's examples).
SGPR_PAPER = dict(n_inducing=512, epochs=50, lr=0.1)
SVGP_PAPER = dict(n_inducing=1024, epochs=50, batch_size=1024, lr=0.01)

register_protocol(Protocol(
    name="baselines",
    version=2,  # v2: hyperparameters start at softplus(0), as GPyTorch's
    description="SGPR (m=512, 50 full-batch Adam steps, lr 0.1) and SVGP (m=1024, 50 epochs, batch 1024, "
                "lr 0.01), ours beside GPyTorch's, on pol and elevators.",
    methods=(
        MethodSpec("sgpr", SGPR_PAPER),
        MethodSpec("gpytorch-sgpr", SGPR_PAPER),
        MethodSpec("svgp", SVGP_PAPER),
        MethodSpec("gpytorch-svgp", SVGP_PAPER),
    ),
    datasets={"pol": None, "elevators": None},
    requires_data=("pol", "elevators"),
))

QUICK_SGPR = dict(n_inducing=256, epochs=30, lr=0.1)
QUICK_SVGP = dict(n_inducing=256, epochs=10, batch_size=1024, lr=0.02)
QUICK_EXACT = dict(epochs=50, lr=0.1)
QUICK_SOFTKI = dict(n_inducing=256, epochs=10, batch_size=1024, lr=0.01)

register_protocol(Protocol(
    name="quick",
    version=3,  # v2: hyperparameters start at softplus(0), as GPyTorch's; v3: SoftKI added
    description="Every implemented method and the GPyTorch peers, with short training, on generated Friedman #1 "
                "(n = 40,000, d = 10) and, when the data folder is there, two small UCI sets.",
    methods=(
        MethodSpec("exact", QUICK_EXACT, max_n=2000),
        MethodSpec("gpytorch-exact", QUICK_EXACT, max_n=2000),
        MethodSpec("sgpr", QUICK_SGPR),
        MethodSpec("gpytorch-sgpr", QUICK_SGPR),
        MethodSpec("svgp", QUICK_SVGP),
        MethodSpec("gpytorch-svgp", QUICK_SVGP),
        MethodSpec("softki", QUICK_SOFTKI),
        MethodSpec("softki", {**QUICK_SOFTKI, "calibrate_noise": True}, label="softki-calibrated"),
    ),
    datasets={"friedman1": None, "energy": None, "concrete": None},
    dataset_options={"friedman1": {"n": 40_000}},
    requires_data=("energy", "concrete"),
))
