import functools
import gzip
import http.server
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from gpscale import data
from gpscale.data import folder as data_folder
from gpscale.data import load_dataset

N_UCI, N_PMLB, N_MD, N_GEO, N_IMAGES = 60, 50, 40, 30, 20


def _friedman(X):
    return 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tiny data folder with every layout; y of uci/pmlb is the row index, so rows can be traced."""
    monkeypatch.delenv("GPSCALE_DATA", raising=False)
    rng = np.random.default_rng(0)
    for sub in ("uci", "pmlb", "md", "geo", "images"):
        (tmp_path / sub).mkdir()

    fold = (np.arange(N_UCI) % 10).astype(np.int8)
    X = rng.normal(size=(N_UCI, 3))
    X[:, 1] = 7.0  # constant column
    X[fold == 0, 0] += 5.0  # test rows of split 0 are shifted
    np.savez_compressed(tmp_path / "uci" / "tiny.npz", X=X.astype(np.float32),
                        y=np.arange(N_UCI, dtype=np.float32), test_fold=fold)

    np.savez_compressed(tmp_path / "pmlb" / "123_toy.npz", X=rng.normal(size=(N_PMLB, 4)),
                        y=np.arange(N_PMLB, dtype=np.float64), feature_names=np.array(["a", "b", "c", "d"]))

    idx = rng.permutation(N_MD)[:30].reshape(5, 6).astype(np.int32)  # 5 splits of 3 train + 3 test rows
    np.savez_compressed(tmp_path / "md" / "rmd17_mol.npz", z=np.array([6, 1], dtype=np.int8),
                        R=rng.normal(size=(N_MD, 2, 3)).astype(np.float32), E=-1e5 + rng.normal(size=N_MD),
                        train_idx=idx[:, :3], test_idx=idx[:, 3:])

    lat = np.r_[90.0, 0.0, 0.0, rng.uniform(-90, 90, N_GEO - 3)].astype(np.float32)
    lon = np.r_[0.0, 90.0, 180.0, rng.uniform(-180, 180, N_GEO - 3)].astype(np.float32)
    np.savez_compressed(tmp_path / "geo" / "etopo2022_healpix128.npz", lat=lat, lon=lon,
                        elev_mean=rng.normal(100, 1000, N_GEO).astype(np.float32), nside=np.int32(1))

    np.savez_compressed(tmp_path / "images" / "mnist5k.npz",
                        images=rng.integers(0, 256, size=(N_IMAGES, 4, 4), dtype=np.uint8),
                        labels=(np.arange(N_IMAGES) % 10).astype(np.int8))
    return tmp_path


def _row_ids(ds, y):
    """Recover the row index stored as y (y_raw = row index)."""
    return np.rint(y * ds.y_std + ds.y_mean).astype(int)


# ----------------------------------------------------------------------------------------------------- UCI


def test_uci_splits_are_the_folds_disjoint_and_covering(folder):
    fold = np.load(folder / "uci" / "tiny.npz")["test_fold"]
    all_test = []
    for k in range(10):
        ds = load_dataset("tiny", split=k, data_dir=folder)
        train, test = _row_ids(ds, ds.y_train), _row_ids(ds, ds.y_test)
        assert set(test) == set(np.flatnonzero(fold == k))
        assert set(train) | set(test) == set(range(N_UCI)) and not set(train) & set(test)
        all_test.extend(test)
    assert sorted(all_test) == list(range(N_UCI))  # the test folds partition the rows
    with pytest.raises(ValueError, match="0..9"):
        load_dataset("tiny", split=10, data_dir=folder)
    with pytest.raises(ValueError, match="max_train"):
        load_dataset("tiny", n=10, data_dir=folder)


def test_standardisation_uses_training_statistics_only(folder):
    ds = load_dataset("tiny", split=0, data_dir=folder)
    raw = np.load(folder / "uci" / "tiny.npz")
    X, train = raw["X"].astype(np.float64), raw["test_fold"] != 0
    np.testing.assert_allclose(ds.x_mean, X[train].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(ds.X_test, (X[~train] - ds.x_mean) / ds.x_std, rtol=1e-12)
    np.testing.assert_allclose(ds.X_train[:, [0, 2]].mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(ds.X_train[:, [0, 2]].std(axis=0), 1, rtol=1e-12)
    assert ds.X_test[:, 0].mean() > 3  # the shifted test rows stay shifted
    assert ds.y_train.mean() == pytest.approx(0, abs=1e-12) and ds.y_train.std() == pytest.approx(1)


def test_constant_column_becomes_zero_not_nan(folder):
    ds = load_dataset("tiny", data_dir=folder)
    assert ds.x_std[1] == 1.0
    assert np.all(ds.X_train[:, 1] == 0) and np.all(ds.X_test[:, 1] == 0)


def test_max_train_keeps_a_seeded_subset_and_its_statistics(folder):
    full = load_dataset("tiny", split=3, data_dir=folder)
    small = load_dataset("tiny", split=3, data_dir=folder, max_train=20)
    assert small.n_train == 20 and small.n_test == full.n_test
    assert set(_row_ids(small, small.y_train)) < set(_row_ids(full, full.y_train))
    assert small.y_train.mean() == pytest.approx(0, abs=1e-12)  # statistics of the subset
    again = load_dataset("tiny", split=3, data_dir=folder, max_train=20)
    np.testing.assert_array_equal(again.X_train, small.X_train)
    other = load_dataset("tiny", split=3, data_dir=folder, max_train=20, seed=1)
    assert not np.array_equal(other.X_train, small.X_train)


def test_random_split_replaces_the_fixed_folds_seeded_by_split_and_seed(folder):
    ds = load_dataset("tiny", split=0, data_dir=folder, random_split=True, test_fraction=0.2)
    train, test = _row_ids(ds, ds.y_train), _row_ids(ds, ds.y_test)
    assert (ds.n_train, ds.n_test) == (48, 12)
    assert sorted(np.r_[train, test]) == list(range(N_UCI))  # disjoint and covering
    fold = np.load(folder / "uci" / "tiny.npz")["test_fold"]
    assert set(test) != set(np.flatnonzero(fold == 0))  # not the fixed fold
    again = load_dataset("tiny", split=0, data_dir=folder, random_split=True, test_fraction=0.2)
    np.testing.assert_array_equal(again.X_test, ds.X_test)
    for other in (dict(split=1), dict(split=0, seed=1)):
        moved = load_dataset("tiny", data_dir=folder, random_split=True, test_fraction=0.2, **other)
        assert set(_row_ids(moved, moved.y_test)) != set(test)
    beyond = load_dataset("tiny", split=12, data_dir=folder, random_split=True)  # no 0..9 bound
    assert beyond.n_test == 6


def test_minmax_scaling_maps_training_inputs_to_the_unit_box_with_training_statistics(folder):
    ds = load_dataset("tiny", split=0, data_dir=folder, x_scaling="minmax")
    raw = np.load(folder / "uci" / "tiny.npz")
    X, train = raw["X"].astype(np.float64), raw["test_fold"] != 0
    low, high = X[train].min(axis=0), X[train].max(axis=0)
    for j in (0, 2):
        assert ds.X_train[:, j].min() == pytest.approx(-1, abs=1e-12)
        assert ds.X_train[:, j].max() == pytest.approx(1, abs=1e-12)
    np.testing.assert_allclose(ds.x_mean[[0, 2]], ((high + low) / 2)[[0, 2]], rtol=1e-12)
    np.testing.assert_allclose(ds.X_test, (X[~train] - ds.x_mean) / ds.x_std, rtol=1e-12)
    assert ds.X_test[:, 0].mean() > 1  # the shifted test rows lie beyond the training range
    assert ds.x_std[1] == 1.0 and np.all(ds.X_train[:, 1] == 0) and np.all(ds.X_test[:, 1] == 0)
    assert ds.y_train.mean() == pytest.approx(0, abs=1e-12) and ds.y_train.std() == pytest.approx(1)


def test_explicit_scalings_are_recorded(folder):
    raw = load_dataset("tiny", data_dir=folder, x_scaling="none")
    z = np.load(folder / "uci" / "tiny.npz")
    np.testing.assert_array_equal(raw.X_train, z["X"].astype(np.float64)[z["test_fold"] != 0])  # as read
    assert np.all(raw.x_mean == 0) and np.all(raw.x_std == 1) and raw.x_scaling == "none"
    geo = load_dataset("etopo", data_dir=folder, x_scaling="standard")
    np.testing.assert_allclose(geo.X_train.mean(axis=0), 0, atol=1e-12)  # unit vectors z-scored on request
    with pytest.raises(ValueError, match="x_scaling must be one of"):
        load_dataset("tiny", data_dir=folder, x_scaling="unit")


# ----------------------------------------------------------------------------------- PMLB, rMD17, geo, images


def test_pmlb_seeded_90_10_split_by_full_or_short_name(folder):
    ds = load_dataset("toy", split=0, data_dir=folder)
    assert ds.name == "123_toy" and ds.d == 4 and (ds.n_train, ds.n_test) == (45, 5)
    train, test = _row_ids(ds, ds.y_train), _row_ids(ds, ds.y_test)
    assert sorted(np.r_[train, test]) == list(range(N_PMLB))
    same = load_dataset("123_toy", split=0, data_dir=folder)
    np.testing.assert_array_equal(same.X_test, ds.X_test)
    other = load_dataset("toy", split=1, data_dir=folder)
    assert set(_row_ids(other, other.y_test)) != set(test)


def test_pmlb_short_name_must_be_unique(folder):
    np.savez_compressed(folder / "pmlb" / "999_toy.npz", X=np.ones((5, 1)), y=np.ones(5))
    with pytest.raises(ValueError, match="several PMLB"):
        load_dataset("toy", data_dir=folder)


def test_rmd17_features_targets_and_fixed_splits(folder):
    raw = np.load(folder / "md" / "rmd17_mol.npz")
    ds = load_dataset("rmd17_mol", split=2, data_dir=folder)
    assert ds.name == "rmd17_mol" and ds.d == 6 and (ds.n_train, ds.n_test) == (3, 3)
    X_train = ds.X_train * ds.x_std + ds.x_mean
    np.testing.assert_allclose(X_train, raw["R"][raw["train_idx"][2]].reshape(3, 6), rtol=1e-6)
    np.testing.assert_allclose(ds.y_test * ds.y_std + ds.y_mean, raw["E"][raw["test_idx"][2]], rtol=1e-12)
    with pytest.raises(ValueError, match="0..4"):
        load_dataset("rmd17_mol", split=5, data_dir=folder)


def test_rmd17_inverse_distance_features(folder):
    raw = np.load(folder / "md" / "rmd17_mol.npz")
    ds = load_dataset("rmd17_mol", split=2, data_dir=folder, molecule_features="inverse_distances")
    assert ds.d == 1  # two atoms, one pair
    R = raw["R"][raw["train_idx"][2]].astype(np.float64)
    np.testing.assert_allclose(ds.X_train[:, 0] * ds.x_std[0] + ds.x_mean[0],
                               1 / np.linalg.norm(R[:, 0] - R[:, 1], axis=-1), rtol=1e-12)
    with pytest.raises(ValueError, match="rMD17 sets only"):
        load_dataset("toy", data_dir=folder, molecule_features="inverse_distances")
    with pytest.raises(ValueError, match="molecule_features must be one of"):
        load_dataset("rmd17_mol", data_dir=folder, molecule_features="coulomb")


def test_rmd17_short_molecule_name(folder):
    short = load_dataset("mol", split=1, data_dir=folder)
    assert short.name == "rmd17_mol"
    np.testing.assert_array_equal(short.X_train, load_dataset("rmd17_mol", split=1, data_dir=folder).X_train)


def test_geo_inputs_are_unit_vectors_and_not_standardised(folder):
    for name in ("etopo", "elevation"):
        ds = load_dataset(name, data_dir=folder)
        assert ds.name == "etopo" and ds.d == 3 and ds.n_train + ds.n_test == N_GEO
        np.testing.assert_array_equal(ds.x_mean, 0.0)
        np.testing.assert_array_equal(ds.x_std, 1.0)
        X = np.vstack([ds.X_train, ds.X_test])
        np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, rtol=1e-12)
        for point in ([0, 0, 1], [0, 1, 0], [-1, 0, 0]):  # (lat, lon) = (90, 0), (0, 90), (0, 180)
            assert np.isclose(X, point, atol=1e-7).all(axis=1).any()
        assert ds.y_train.mean() == pytest.approx(0, abs=1e-12)


def test_images_flattened_in_unit_interval(folder):
    raw = np.load(folder / "images" / "mnist5k.npz")
    ds = load_dataset("mnist5k", data_dir=folder)
    assert ds.d == 16 and ds.n_test == 2
    X = np.vstack([ds.X_train, ds.X_test])
    pixels = raw["images"].reshape(N_IMAGES, 16) / 255.0
    assert sorted(map(tuple, X)) == sorted(map(tuple, pixels))  # same rows, not standardised
    labels = np.r_[ds.y_train, ds.y_test] * ds.y_std + ds.y_mean
    np.testing.assert_allclose(np.sort(labels), np.sort(raw["labels"]), atol=1e-12)


def test_every_listed_file_loads_with_the_listed_shape(folder):
    listed = [e for e in data.list_datasets(folder) if e["available"] and e["kind"] != "generated"]
    assert {e["name"] for e in listed} == {"tiny", "123_toy", "rmd17_mol", "etopo", "mnist5k"}
    for entry in listed:
        ds = load_dataset(entry["name"], data_dir=folder)
        assert ds.d == entry["d"]
        if entry["kind"] != "md":
            assert ds.n_train + ds.n_test == entry["n"]


# -------------------------------------------------------------------------------------------------- generated


def test_generated_sets_are_seeded():
    for name in ("friedman1", "gp_sample"):
        a = load_dataset(name, n=500, seed=3)
        b = load_dataset(name, n=500, seed=3)
        np.testing.assert_array_equal(a.X_train, b.X_train)
        np.testing.assert_array_equal(a.y_test, b.y_test)
        assert not np.allclose(load_dataset(name, n=500, seed=4).y_mean, a.y_mean)
        assert not np.allclose(load_dataset(name, n=500, seed=3, split=1).y_mean, a.y_mean)
        assert (a.n_train, a.n_test, a.d, a.source) == (450, 50, data.GENERATED[name], "generated")


def test_friedman1_formula_and_unit_noise():
    X, y = data.make_friedman1(1000, 0, noise_std=0.0)
    assert X.shape == (1000, 10) and X.min() >= 0 and X.max() <= 1
    np.testing.assert_allclose(y, _friedman(X), rtol=1e-12)
    ds = load_dataset("friedman1", n=20000)
    X_raw = ds.X_train * ds.x_std + ds.x_mean
    noise = ds.y_train * ds.y_std + ds.y_mean - _friedman(X_raw)
    assert noise.mean() == pytest.approx(0, abs=0.03) and noise.std() == pytest.approx(1, abs=0.03)


def test_friedman1_default_size_is_40000():
    ds = load_dataset("friedman1")
    assert ds.n_train + ds.n_test == 40000 and ds.d == 10


def test_friedman1_d11_adds_one_irrelevant_input_and_keeps_friedman1():
    X, y = data.make_friedman1(1000, 0, noise_std=0.0, d=11)
    assert X.shape == (1000, 11) and X.min() >= 0 and X.max() <= 1
    np.testing.assert_allclose(y, _friedman(X), rtol=1e-12)
    X10, y10 = data.make_friedman1(1000, 0)  # the default is the classic d = 10 set, draws unchanged
    assert X10.shape == (1000, 10) and np.isfinite(y10).all()
    ds = load_dataset("friedman1_d11", n=500, seed=3)
    again = load_dataset("friedman1_d11", n=500, seed=3)
    assert (ds.n_train, ds.n_test, ds.d) == (450, 50, 11) and data.GENERATED["friedman1_d11"] == 11
    np.testing.assert_array_equal(ds.X_train, again.X_train)
    with pytest.raises(ValueError, match="d >= 5"):
        data.make_friedman1(10, 0, d=4)


def test_gp_sample_has_rbf_covariance_and_noise():
    products_0, products_03 = [], []  # f(x) f(x') at |x - x'| = 0 and about 0.3, pooled over draws
    for seed in range(200):
        X, f = data.make_gp_sample(60, seed, noise_std=0.0)
        dist = np.linalg.norm(X[:, None] - X[None], axis=-1)
        products_0.append(f**2)
        products_03.append(np.outer(f, f)[(dist > 0.25) & (dist < 0.35)])
    assert np.mean(np.concatenate(products_0)) == pytest.approx(1.0, abs=0.1)
    assert np.mean(np.concatenate(products_03)) == pytest.approx(np.exp(-0.5), abs=0.1)  # lengthscale 0.3
    _, f = data.make_gp_sample(1000, 0, noise_std=0.0)
    _, y = data.make_gp_sample(1000, 0)
    assert np.std(y - f) == pytest.approx(0.1, rel=0.1)


@pytest.mark.parametrize("nu", [None, 0.5, 1.5, 2.5])
def test_spectral_frequencies_reproduce_the_kernel(nu):
    # Bochner: E cos(omega . r) = k(r) for omega from the spectral density; 400k draws leave ~1e-3 of noise
    lengthscale, d = 0.1, 3
    omega = data.spectral_frequencies(np.random.default_rng(0), d, 400_000, lengthscale, nu)
    for dist in (0.03, 0.1, 0.25):
        r = dist * np.ones(d) / np.sqrt(d)
        t = dist / lengthscale
        k = {None: np.exp(-t**2 / 2), 0.5: np.exp(-t), 1.5: (1 + np.sqrt(3) * t) * np.exp(-np.sqrt(3) * t),
             2.5: (1 + np.sqrt(5) * t + 5 * t**2 / 3) * np.exp(-np.sqrt(5) * t)}[nu]
        assert np.mean(np.cos(r @ omega)) == pytest.approx(k, abs=6e-3)


def test_odvff_synthetic_sets():
    ds = load_dataset("matern32_d5", split=1, n=1200, test_fraction=200 / 1200, x_scaling="none")
    assert (ds.n_train, ds.n_test, ds.d) == (1000, 200, 5) and data.GENERATED["matern32_d5"] == 5
    assert 0 <= ds.X_train.min() and ds.X_train.max() <= 1  # U[0, 1]^D, unscaled
    raw = load_dataset("matern32_d5", split=1, n=1200, test_fraction=200 / 1200, x_scaling="none",
                       standardize_y=False)
    assert (raw.y_mean, raw.y_std) == (0.0, 1.0)
    np.testing.assert_allclose(raw.y_train, ds.y_train * ds.y_std + ds.y_mean)


# ---------------------------------------------------------------------------------------- errors and discovery


def test_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("GPSCALE_DATA", str(tmp_path / "env"))
    assert data.data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert data.data_dir() == tmp_path / "env"
    monkeypatch.delenv("GPSCALE_DATA")
    assert data.data_dir() is None


def test_missing_folder_or_file_says_where_it_looked_and_what_to_do(folder, monkeypatch):
    with pytest.raises(FileNotFoundError, match="GPSCALE_DATA") as err:
        load_dataset("pol")
    assert "gpscale data download pol" in str(err.value)
    missing = folder / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_dataset("pol", data_dir=missing)
    monkeypatch.setenv("GPSCALE_DATA", str(folder))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("pol")
    assert str(folder / "uci" / "pol.npz") in str(err.value) and "gpscale data download pol" in str(err.value)
    with pytest.raises(FileNotFoundError, match="no file for data set 'nonesuch'"):
        load_dataset("nonesuch")


def test_non_finite_values_name_the_file(folder):
    path = folder / "uci" / "broken.npz"
    np.savez_compressed(path, X=np.array([[1.0], [np.nan]]), y=np.ones(2), test_fold=np.array([0, 1]))
    with pytest.raises(ValueError, match="broken.npz"):
        load_dataset("broken", data_dir=folder)


def test_list_datasets_marks_availability(folder):
    entries = {e["name"]: e for e in data.list_datasets(folder)}
    assert entries["tiny"] == {"name": "tiny", "kind": "uci", "n": N_UCI, "d": 3, "splits": 10, "available": True}
    assert entries["rmd17_mol"] == {"name": "rmd17_mol", "kind": "md", "n": N_MD, "d": 6, "splits": 5,
                                    "available": True}
    assert entries["123_toy"]["splits"] is None and entries["123_toy"]["kind"] == "pmlb"
    assert (entries["etopo"]["d"], entries["mnist5k"]["d"]) == (3, 16)
    assert entries["kin40k"] == {"name": "kin40k", "kind": "uci", "n": 40000, "d": 8, "splits": 10,
                                 "available": False}
    assert entries["friedman1"]["available"] and entries["gp_sample"]["kind"] == "generated"
    no_folder = {e["name"]: e for e in data.list_datasets()}  # GPSCALE_DATA unset by the fixture
    assert "tiny" not in no_folder and not no_folder["pol"]["available"] and no_folder["friedman1"]["available"]


# --------------------------------------------------------------------------------------------------- download


@pytest.fixture
def upstream(tmp_path):
    """A loopback HTTP server over tmp_path/"site"; yields (base_url, site folder)."""
    site = tmp_path / "site"
    site.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", site
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _write_upstream(site: Path, name: str, data_rows: np.ndarray, mask_rows: list[str]):
    (site / name).mkdir()
    text = "\n".join(",".join(f"{v:.5g}" for v in row) for row in data_rows) + "\n"
    (site / name / "data.csv.gz").write_bytes(gzip.compress(text.encode()))
    (site / name / "test_mask.csv.gz").write_bytes(gzip.compress(("\n".join(mask_rows) + "\n").encode()))


@pytest.mark.parametrize("true, false", [("True", "False"), ("1", "0")])
def test_download_uci_converts_the_upstream_format(upstream, tmp_path, true, false):
    base_url, site = upstream
    rng = np.random.default_rng(0)
    table = np.c_[rng.normal(size=(30, 2)), np.arange(30.0)]  # two features, then the target
    fold = rng.permutation(np.arange(30) % 10)
    _write_upstream(site, "fixture", table, [",".join(true if k == f else false for k in range(10)) for f in fold])
    dest = tmp_path / "data"
    path = data.download_uci("fixture", dest, base_url=base_url, timeout=5)
    assert path == dest / "uci" / "fixture.npz" and not list(path.parent.glob("*.tmp"))
    z = np.load(path)
    assert (z["X"].dtype, z["y"].dtype, z["test_fold"].dtype) == (np.float32, np.float32, np.int8)
    np.testing.assert_allclose(z["X"], table[:, :2], rtol=1e-4)
    np.testing.assert_array_equal(z["y"], np.arange(30))
    np.testing.assert_array_equal(z["test_fold"], fold)
    ds = load_dataset("fixture", split=4, data_dir=dest)
    np.testing.assert_array_equal(_row_ids(ds, ds.y_test), np.flatnonzero(fold == 4))


def test_download_uci_http_error_names_the_url(upstream, tmp_path):
    base_url, _ = upstream
    with pytest.raises(RuntimeError, match=f"{base_url}/absent/data.csv.gz.*404"):
        data.download_uci("absent", tmp_path / "data", base_url=base_url, timeout=5)
    assert not (tmp_path / "data" / "uci" / "absent.npz").exists()


def test_download_uci_rejects_a_row_in_two_test_folds(upstream, tmp_path):
    base_url, site = upstream
    mask = [",".join("1" if k == i % 10 else "0" for k in range(10)) for i in range(12)]
    mask[3] = "1,1,0,0,0,0,0,0,0,0"
    _write_upstream(site, "bad", np.ones((12, 3)), mask)
    with pytest.raises(RuntimeError, match="exactly one split"):
        data.download_uci("bad", tmp_path / "data", base_url=base_url, timeout=5)


def test_cli_data_download_fetches_and_reports_errors_in_one_line(upstream, tmp_path, capsys):
    from gpscale.cli import main

    base_url, site = upstream
    _write_upstream(site, "cli", np.c_[np.ones((20, 1)), np.arange(20.0)],
                    [",".join("1" if k == i % 10 else "0" for k in range(10)) for i in range(20)])
    dest = tmp_path / "data"
    assert main(["data", "download", "cli", "--data-dir", str(dest), "--base-url", base_url]) == 0
    assert (dest / "uci" / "cli.npz").exists() and "saved" in capsys.readouterr().out
    assert main(["data", "download", "absent", "--data-dir", str(dest), "--base-url", base_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpscale: error:") and "404" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------------- real data


def test_real_pol_split_0():
    root = os.environ.get("GPSCALE_DATA")
    if not root or not (Path(root) / "uci" / "pol.npz").is_file():
        pytest.skip("needs $GPSCALE_DATA with uci/pol.npz")
    ds = load_dataset("pol", split=0)
    assert (ds.n_train, ds.n_test, ds.d) == (13500, 1500, 26)


@pytest.mark.skipif(not os.environ.get("GPSCALE_DATA"), reason="GPSCALE_DATA not set")
@pytest.mark.parametrize("transform", ["roll", "flip"])
def test_image_transforms_move_each_image_by_a_group_element(transform):
    plain = load_dataset("mnist5k", split=0, standardize_y=False)
    moved = load_dataset("mnist5k", split=0, standardize_y=False, image_transform=transform)
    np.testing.assert_array_equal(plain.y_train, moved.y_train)  # same split, labels untouched
    a, b = plain.X_train.reshape(-1, 28, 28), moved.X_train.reshape(-1, 28, 28)
    np.testing.assert_allclose(np.sort(a.reshape(len(a), -1)), np.sort(b.reshape(len(b), -1)))  # same pixels
    changed = (a != b).any(axis=(1, 2)).mean()
    assert changed > 0.6  # most images moved (a roll by (0, 0) or no flip leaves an image as it was)
    i = int(np.argmax((a != b).any(axis=(1, 2))))
    candidates = ([np.roll(a[i], (r, c), axis=(0, 1)) for r in range(28) for c in range(28)] if transform == "roll"
                  else [a[i][::u, ::v] for u in (1, -1) for v in (1, -1)])
    assert any(np.array_equal(b[i], cand) for cand in candidates)
    with pytest.raises(ValueError, match="image sets only"):
        load_dataset("pol", image_transform="roll")
    with pytest.raises(ValueError, match="image sets only"):
        load_dataset("friedman1", n=100, image_transform="flip")


def _fake_fashion_mnist(rng, n_train=12, n_test=5):
    """Arrays laid out as Fashion-MNIST's: 28 x 28 uint8 images and labels 0..9, train and test."""
    return {"train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            "train_labels": rng.integers(0, 10, n_train).astype(np.int8),
            "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
            "test_labels": rng.integers(0, 10, n_test).astype(np.int8)}


def _write_idx(path, array):
    """A gzipped IDX file: two zero bytes, type 8 (unsigned bytes), the number of dimensions, big-endian sizes."""
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_loads_the_official_split_from_the_folder_or_the_debian_package(tmp_path, monkeypatch):
    arrays = _fake_fashion_mnist(np.random.default_rng(0))
    (tmp_path / "images").mkdir()
    np.savez(tmp_path / "images" / "fashion_mnist.npz", **arrays)
    package = tmp_path / "package"
    package.mkdir()
    for key, file in data.FASHION_MNIST_IDX.items():
        _write_idx(package / file, arrays[key])
    monkeypatch.setattr(data_folder, "FASHION_MNIST_PACKAGE", package)
    from_folder = load_dataset("fashion_mnist", data_dir=tmp_path, standardize_y=False)
    from_package = load_dataset("fmnist", data_dir=tmp_path / "missing", standardize_y=False)
    for ds in (from_folder, from_package):
        assert (ds.n_train, ds.n_test, ds.d) == (12, 5, 784) and ds.kind == "images"
        np.testing.assert_array_equal(ds.X_train, arrays["train_images"].reshape(12, -1) / 255.0)  # not z-scored
        np.testing.assert_array_equal(ds.y_test, arrays["test_labels"])
    listed = {row["name"]: row for row in data.list_datasets(tmp_path)}["fashion_mnist"]
    assert (listed["n"], listed["d"], listed["splits"]) == (17, 784, 1)
    with pytest.raises(ValueError, match="split must be 0 for this image set's official train/test split"):
        load_dataset("fashion_mnist", split=1, data_dir=tmp_path)
    monkeypatch.setattr(data_folder, "FASHION_MNIST_PACKAGE", tmp_path / "not-installed")
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", data_dir=tmp_path / "missing")
