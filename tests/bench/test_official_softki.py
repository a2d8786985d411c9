"""The ``softki-official`` peer: where it finds the SoftKI authors' code, that it trains and predicts a mean near
the data with their code when it is found, and that the runner records a skip with a note when it is not."""
from pathlib import Path

import numpy as np
import pytest
import torch

from gpscale.bench.official_softki import (FOLDER_NAME, PEERS_ENV, PeerUnavailable, candidate_folders,
                                           find_official_code)
from gpscale.bench.protocols import MethodSpec, Protocol
from gpscale.bench.report import write_report
from gpscale.bench.runner import run_one, run_protocol
from gpscale.bench.store import ResultsStore
from gpscale.data import load_dataset

pytest.importorskip("gpytorch")


def _official_code_or_skip() -> Path:
    try:
        return find_official_code()
    except PeerUnavailable as missing:
        pytest.skip(str(missing))


def _fake_official_code(folder: Path) -> None:
    """Make ``folder`` one that the lookup takes for a holder of the official code (nothing in it is imported)."""
    model = folder / FOLDER_NAME / "gp" / "softki" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("")


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """The three places the lookup searches, all empty: $GPSCALE_PEERS = env-peers, <GPSCALE_DATA>/../peers =
    store/peers and, from the working directory work/cwd, ../shared/peers = work/shared/peers."""
    for name in ("env-peers", "store/data", "work/cwd"):
        (tmp_path / name).mkdir(parents=True)
    monkeypatch.setenv(PEERS_ENV, str(tmp_path / "env-peers"))
    monkeypatch.setenv("GPSCALE_DATA", str(tmp_path / "store" / "data"))
    monkeypatch.chdir(tmp_path / "work" / "cwd")
    return tmp_path


def test_the_lookup_prefers_the_env_var_then_the_data_folders_sibling_then_the_working_directorys(nowhere,
                                                                                                  monkeypatch):
    assert candidate_folders() == [nowhere / "env-peers", nowhere / "store" / "data" / ".." / "peers",
                                   Path("../shared/peers")]
    with pytest.raises(PeerUnavailable):
        find_official_code()
    for folder in (nowhere / "work" / "shared" / "peers", nowhere / "store" / "peers", nowhere / "env-peers"):
        _fake_official_code(folder)  # each one found before the ones made earlier
        assert find_official_code() == (folder / FOLDER_NAME).resolve()
    monkeypatch.delenv(PEERS_ENV)
    monkeypatch.delenv("GPSCALE_DATA")
    assert candidate_folders() == [Path("../shared/peers")]
    assert find_official_code() == (nowhere / "work" / "shared" / "peers" / FOLDER_NAME).resolve()


def test_without_the_official_code_the_runner_records_a_skip_with_a_note(nowhere):
    protocol = Protocol(name="test-official-skip", version=1, description="the official peer without its code",
                        methods=(MethodSpec("softki-official", {"n_inducing": 8, "epochs": 1, "lr": 0.01}),
                                 MethodSpec("gpytorch-svgp", {"n_inducing": 8, "epochs": 1, "lr": 0.01})),
                        datasets={"friedman1": None}, dataset_options={"friedman1": {"n": 100}})
    lines = []
    path = run_protocol(protocol, out_dir=nowhere / "out", progress=False, log=lines.append)
    skipped, ran = ResultsStore(path).runs()
    assert skipped["status"] == "skipped" and ran["status"] == "ok"
    note = skipped["error"]
    assert PEERS_ENV in note
    for folder in (nowhere / "env-peers", nowhere / "store" / "peers", nowhere / "work" / "shared" / "peers"):
        assert str(folder / FOLDER_NAME) in note
    assert "SKIPPED" in lines[0] and "FAILED" not in lines[0]
    report = write_report(path, nowhere / "report").read_text(encoding="utf-8")
    skipped_section, failed_section = report.split("## Skipped runs")[1].split("## Failed runs")
    assert "friedman1 / softki-official" in skipped_section and failed_section.strip() == "None."


def _smooth_data(n: int = 300, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """X [n, d] uniform on [-2, 2]^d, y [n] a smooth function of the first two inputs plus small noise,
    standardised."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.standard_normal(n)
    return torch.tensor(X, dtype=torch.float32), torch.tensor((y - y.mean()) / y.std(), dtype=torch.float32)


def test_the_official_peer_trains_and_predicts_a_mean_near_the_data():
    _official_code_or_skip()
    from gpscale.bench.peers import make_peer

    X, y = _smooth_data()
    peer = make_peer("softki-official", n_features=4, n_inducing=16, dtype=torch.float32)
    seconds = peer.fit(X, y, epochs=1, lr=0.01, batch_size=1024, seed=0)
    mean, variance = peer.predict(X)
    assert len(seconds) == 1 and seconds[0] > 0 and len(peer.history) == 1
    assert variance is None and mean.shape == (300,) and torch.isfinite(mean).all()
    # a zero mean has RMSE 1 on standardised y; 16 softmax-interpolated points after one Adam step fit about 0.65
    assert ((mean - y) ** 2).mean().sqrt() < 0.8
    assert np.corrcoef(mean.numpy(), y.numpy())[0, 1] > 0.7


def test_the_official_peer_through_the_runner_has_an_rmse_and_no_nlpd():
    _official_code_or_skip()
    ds = load_dataset("friedman1", n=300)
    spec = MethodSpec("softki-official", {"n_inducing": 16, "epochs": 1, "lr": 0.01})
    record = run_one(spec, ds, seed=0, dtype="float32")
    assert record["status"] == "ok", record
    assert 0 < record["rmse"] < 1 and record["seconds_per_epoch"] > 0 and record["epochs"] == 1
    assert record.get("nlpd") is None and record.get("coverage") is None and record.get("calibration") is None
