"""The registered benchmark protocols are well-formed: known methods, options their models accept, published
numbers that refer to the protocol's own methods and datasets, and (with a data folder) datasets that load.
Fast: nothing is trained."""
import os

import pytest

from gpscale.bench.protocols import PROTOCOLS, get_protocol
from gpscale.bench.runner import TRAINING_OPTIONS
from gpscale.data import load_dataset
from gpscale.models import available_methods, get_model_class

ALL = sorted(PROTOCOLS)
SOFTKI_PROTOCOLS = ("softki-table1", "softki-table2", "softki-md17", "softki-noise", "softki-scale")


def _peer_keys() -> set[str] | None:
    try:
        from gpscale.bench.peers import PEERS
    except ImportError:  # gpytorch not installed
        return None
    return set(PEERS)


def test_softki_protocols_are_registered():
    for name in SOFTKI_PROTOCOLS:
        assert get_protocol(name).version == 1


@pytest.mark.parametrize("name", ALL)
def test_method_keys_are_models_or_peers(name):
    ours, peers = set(available_methods()), _peer_keys()
    for spec in PROTOCOLS[name].methods:
        if spec.key.startswith("gpytorch-"):
            assert peers is None or spec.key in peers, (name, spec.key)
        else:
            assert spec.key in ours, (name, spec.key)


@pytest.mark.parametrize("name", ALL)
def test_labels_are_unique(name):
    labels = [spec.name for spec in PROTOCOLS[name].methods]
    assert len(labels) == len(set(labels)), labels


@pytest.mark.parametrize("name", ALL)
def test_model_options_are_accepted(name):
    for spec in PROTOCOLS[name].methods:
        if spec.key.startswith("gpytorch-"):
            assert set(spec.options) <= {*TRAINING_OPTIONS, "n_inducing"}, (name, spec.name)
            continue
        options = {k: v for k, v in spec.options.items() if k not in TRAINING_OPTIONS}
        if "n_inducing" in options:
            options["n_inducing"] = min(options["n_inducing"], 8)  # construction only; keep it small
        model = get_model_class(spec.key)(3, **options)
        assert model.n_features == 3


@pytest.mark.parametrize("name", ALL)
def test_training_options_are_sane(name):
    for spec in PROTOCOLS[name].methods:
        for key in ("epochs", "batch_size"):
            if key in spec.options:
                assert isinstance(spec.options[key], int) and spec.options[key] >= 1, (name, spec.name, key)
        if "lr" in spec.options:
            assert spec.options["lr"] > 0


@pytest.mark.parametrize("name", ALL)
def test_published_keys_refer_to_the_protocol(name):
    protocol = PROTOCOLS[name]
    labels = {spec.name for spec in protocol.methods}
    for (label, dataset), numbers in protocol.published.items():
        assert label in labels, (name, label)
        assert dataset in protocol.datasets, (name, dataset)
        assert numbers and all(isinstance(v, float) for v in numbers.values()), (name, label, dataset)
    assert set(protocol.requires_data) <= set(protocol.datasets)


def test_softki_table1_layout():
    protocol = get_protocol("softki-table1")
    expected = {"pol", "elevators", "bike", "kin40k", "protein", "keggdirected", "keggundirected"}
    assert set(protocol.datasets) == expected and len(protocol.datasets) == 7
    assert set(protocol.requires_data) == expected
    assert protocol.splits == (0, 1, 2)
    assert all(splits is None for splits in protocol.datasets.values())
    labels = {spec.name for spec in protocol.methods}
    assert labels == {"softki", "softki-calibrated", "sgpr", "gpytorch-sgpr", "svgp", "gpytorch-svgp",
                      "gpytorch-svgp-512"}
    # every dataset has the paper's RMSE of all three methods and SoftKI's RTX 3090 timing
    for dataset in expected:
        for label in ("softki", "sgpr", "svgp"):
            assert {"rmse", "rmse_std"} <= set(protocol.published[(label, dataset)])
        assert "seconds_per_epoch" in protocol.published[("softki", dataset)]
    assert protocol.published[("softki", "pol")]["rmse"] == 0.195


def test_softki_noise_layout():
    protocol = get_protocol("softki-noise")
    fixed, learned = protocol.methods
    assert fixed.options["learn_noise"] is False and learned.options["learn_noise"] is True
    assert learned.name == "softki-learned-noise"
    assert protocol.splits == (0, 1, 2)
    for dataset in protocol.datasets:
        assert ("softki", dataset) in protocol.published and ("softki-learned-noise", dataset) in protocol.published


def test_softki_md17_has_no_published_numbers():
    protocol = get_protocol("softki-md17")
    assert set(protocol.datasets) == {"rmd17_aspirin", "rmd17_ethanol", "rmd17_malonaldehyde"}
    assert protocol.splits == (0, 1, 2) and not protocol.published


DATA = os.environ.get("GPSCALE_DATA")


@pytest.mark.skipif(not DATA, reason="GPSCALE_DATA not set")
@pytest.mark.parametrize("dataset", sorted({d for name in SOFTKI_PROTOCOLS for d in PROTOCOLS[name].datasets}))
def test_datasets_load(dataset):
    ds = load_dataset(dataset, split=0, data_dir=DATA)
    assert ds.n_train > 0 and ds.n_test > 0
    if dataset.startswith("rmd17_"):
        assert ds.n_train == 1000
