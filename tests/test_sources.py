"""Rows that stay on disk (gpscale.sources): a Table fits and predicts as its arrays do, its statistics come from one
streamed pass, the staged rows are memory-mapped and give their pages back, and each misuse is named."""
import errno
import os
import tracemalloc
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_tables import write

from gpscale import GPClassifier, GPRegressor, OutlierWarning, Table
from gpscale.scaling import ColumnMoments, fit_scaling
from gpscale.sources import ArrayRows, MappedRows, TableScan


def data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


def parquet(path, X, y, row_group_size=64):
    columns = {"a": X[:, 0], "b": X[:, 1], "y": y}
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


FAST = dict(progress=False, max_steps=20, n_inducing=16)


@pytest.mark.parametrize("method", ["svgp", "sgpr", "softki", "exact"])
def test_a_table_fits_and_predicts_as_its_arrays(tmp_path, method):
    X, y = data()
    path = parquet(tmp_path / "t.parquet", X, y, row_group_size=None)  # one block: the arrays' statistics exactly
    options = dict(method=method, **({} if method == "exact" else {"n_inducing": 16}), progress=False, max_steps=20)
    from_arrays = GPRegressor(**options).fit(X, y)
    from_table = GPRegressor(**options).fit(Table(path, target="y"))
    np.testing.assert_array_equal(from_table.x_mean_, from_arrays.x_mean_)
    assert from_table.y_std_ == from_arrays.y_std_
    expected = from_arrays.predict(X, return_std=True)
    for got in (from_table.predict(Table(path), return_std=True),  # the fitted columns by name: y is not read
                GPRegressor.load(_saved(from_table, tmp_path)).predict(Table(path), return_std=True)):
        np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(got[1], expected[1], rtol=0, atol=1e-12)
    assert list(from_table.feature_names_in_) == ["a", "b"] and from_table.training_["rows"] == len(X)


def _saved(estimator, folder):
    estimator.save(folder / "m.gps")
    return folder / "m.gps"


def test_a_classifier_takes_its_labels_from_the_tables_text(tmp_path):
    X, y = data()
    labels = np.where(y > 0, "up", "down")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "label": labels}), path, row_group_size=50)
    options = dict(progress=False, max_steps=10, n_inducing=8)
    from_table = GPClassifier(**options).fit(Table(path, target="label"))
    from_arrays = GPClassifier(**options).fit(X, labels)
    assert from_table.classes_.tolist() == ["down", "up"]
    np.testing.assert_allclose(from_table.predict_proba(Table(path)), from_arrays.predict_proba(X), atol=1e-12)
    assert (from_table.predict(Table(path)) == from_arrays.predict(X)).all()


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "feather", "npy", "npz"])
def test_every_format_gives_the_same_blocks(tmp_path, fmt):
    table = np.random.default_rng(1).normal(size=(50, 3))
    path = write(tmp_path, table, fmt)
    target = {"npy": "2", "npz": "y"}.get(fmt, "y")
    blocks = list(Table(path, target=target).blocks(rows=16))
    np.testing.assert_array_equal(np.concatenate([X for X, _ in blocks]), table[:, :2])
    np.testing.assert_array_equal(np.concatenate([y for _, y in blocks]).astype(float), table[:, 2])
    second = list(Table(path, target=target).blocks(shard=(1, 2), rows=16))  # rows 25..49
    np.testing.assert_array_equal(np.concatenate([X for X, _ in second]), table[25:, :2])


def test_a_scan_gathers_the_statistics_of_its_processs_rows_in_one_pass(tmp_path):
    X, y = data(300)
    path = parquet(tmp_path / "t.parquet", X, y, row_group_size=40)
    reads = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        reads.append(kwargs["row_groups"])
        return iter_batches(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pq.ParquetFile, "iter_batches", spy)
        scan = TableScan(Table(path, target="y"), (1, 2), labels=False)
    assert reads == [[3], [4], [5], [6], [7]]  # one pass, a row group at a time, those that hold rows 150..299
    assert scan.n == 150
    np.testing.assert_allclose(scan.x_moments.mean, X[150:].mean(0), rtol=1e-13)
    np.testing.assert_allclose(scan.y_moments.scaling("standard").scale, y[150:].std(), rtol=1e-13)
    np.testing.assert_array_equal(scan.y_sample, y[150:])  # fewer than TARGET_SAMPLE: every target


def test_column_moments_combine_blocks_without_losing_the_offsets_digits():
    rng = np.random.default_rng(2)
    A = 1e8 + rng.standard_normal((5000, 3))  # a running sum of squares loses every digit of the spread here
    whole = fit_scaling(A)
    blocks = ColumnMoments((3,))
    for part in np.array_split(A, [1, 7, 1000, 1001, 4000]):
        blocks.add(part)
    for how in ("standard", "minmax", "center"):
        expected, got = fit_scaling(A, how), blocks.scaling(how)
        np.testing.assert_allclose(got.shift, expected.shift, rtol=1e-14)
        np.testing.assert_allclose(got.scale, expected.scale, rtol=1e-7)  # the values themselves hold 1e-8
    np.testing.assert_allclose(whole.scale, A.std(0), rtol=1e-7)
    np.testing.assert_allclose(whole.shift, A.mean(0), rtol=1e-15)


def test_float32_arrays_are_scaled_block_by_block_without_a_float64_copy():
    X = np.random.default_rng(3).normal(size=(400_000, 8)).astype(np.float32)  # 12.8 MB; in float64 25.6 MB
    rows = ArrayRows(X, np.zeros(len(X)))
    tracemalloc.start()
    x_scale = rows.x_moments().scaling("standard")
    scaled, _, _ = rows.tensors(x_scale, torch.float32, torch.device("cpu"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 12e6, peak  # blocks of 65,536 rows, not a copy of X
    np.testing.assert_array_equal(scaled.numpy(), x_scale.apply(X).astype(np.float32))


def _rss_file_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the process's memory from /proc")
def test_mapped_rows_give_the_pages_they_read_back(tmp_path):
    n, d = 1 << 20, 15  # 64 MB of float32
    rows = MappedRows(n, d, torch.float32, str(tmp_path))
    assert not list(tmp_path.iterdir())  # an unnamed file: nothing is left behind, however the process ends
    for start in range(0, n, 1 << 18):
        block = np.arange(start, start + (1 << 18), dtype=np.float64)
        rows.write(start, np.repeat(block[:, None], d, axis=1), block)
    before = _rss_file_bytes()
    assert float(rows.X[:, 3].sum(dtype=torch.float64)) == n * (n - 1) / 2  # touches every page
    touched = _rss_file_bytes()
    rows.release()
    after = _rss_file_bytes()
    assert touched - before > 48e6 and touched - after > 48e6, (before, touched, after)
    assert float(rows.y[-1]) == n - 1 and float(rows.X[12345, 7]) == 12345  # read again from the file cache


def test_a_folder_without_room_is_named_before_anything_is_written(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=f"could not set aside .* in {tmp_path} for the training rows .*TMPDIR"):
        MappedRows(1000, 4, torch.float64, str(tmp_path))
    X, y = data()
    path = parquet(tmp_path / "t.parquet", X, y)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
    earlier = GPRegressor(method="svgp", **{k: v for k, v in FAST.items() if k != "progress"}, progress=False)
    earlier.fit(X, y)
    mean = earlier.predict(X)
    with pytest.raises(OSError, match="No space left"):
        earlier.fit(Table(path, target="y"))
    np.testing.assert_array_equal(earlier.predict(X), mean)  # the failed fit kept the earlier model


def test_training_from_a_table_reads_its_minibatches_by_row_and_maps_none(tmp_path, monkeypatch):
    X, y = data(600)
    path = parquet(tmp_path / "t.parquet", X, y)
    taken = []
    take = MappedRows.take

    def spy(self, rows):
        taken.append(rows)
        got = take(self, rows)
        torch.testing.assert_close(got, (self.X[rows], self.y[rows]), rtol=0, atol=0)  # the rows, by pread
        return got

    monkeypatch.setattr(MappedRows, "take", spy)
    est = GPRegressor(method="svgp", epochs=2, batch_size=100, **{k: v for k, v in FAST.items()
                                                                    if k != "max_steps"})
    est.fit(Table(path, target="y"))
    assert est.training_["steps"] == 12 and len(taken) == 12
    assert sorted(torch.cat(taken[:6]).tolist()) == list(range(600))  # an epoch: every row once


def test_misuse_of_a_table_is_named(tmp_path):
    X, y = data(50)
    path = parquet(tmp_path / "t.parquet", X, y)
    with pytest.raises(ValueError, match="has no column 'z' \\(the target\\); its columns: a, b, y"):
        Table(path, target="z")
    with pytest.raises(ValueError, match="lacks the feature columns 'c'"):
        Table(path, target="y", features=["a", "c"])
    with pytest.raises(ValueError, match="'y' is the target and cannot also be a feature"):
        Table(path, target="y", features=["a", "y"])
    with pytest.raises(ValueError, match="takes y from the table's target column 'y': pass no y"):
        GPRegressor(**FAST).fit(Table(path, target="y"), y)
    with pytest.raises(ValueError, match="fit needs a target"):
        GPRegressor(**FAST).fit(Table(path))
    est = GPRegressor(method="svgp", **FAST).fit(Table(path, target="y"))
    pq.write_table(pa.table({"a": X[:, 0], "c": X[:, 1]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="lacks the columns b; its columns: a, c"):
        est.predict(Table(tmp_path / "other.parquet"))
    with pytest.raises(ValueError, match="return_cov=True forms the covariance of all the rows at once"):
        est.predict(Table(path), return_cov=True)
    one = tmp_path / "one.parquet"
    parquet(one, X[:1], y[:1])
    with pytest.raises(ValueError, match="has 1 data row; a fit needs at least 2"):
        GPRegressor(**FAST).fit(Table(one, target="y"))


def test_an_outlying_target_in_a_table_is_named_by_its_row(tmp_path):
    X, y = data(400)
    y[321] = 1e7
    path = parquet(tmp_path / "t.parquet", X, y)
    with pytest.warns(OutlierWarning, match=r"1 target lies .* \(y\[321\] = 1e\+07\)"):
        GPRegressor(method="svgp", **FAST).fit(Table(path, target="y"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierWarning)
        GPRegressor(method="svgp", **FAST).fit(Table(parquet(tmp_path / "u.parquet", *data(400)), target="y"))
    # under data parallelism, process 1 of 2 holds rows 200..399 and names the row by its place in the file
    scan = TableScan(Table(path, target="y"), (1, 2), labels=False, rows=50)  # blocks of 50 rows
    centre, spread = np.median(y[200:]), 1.0
    scan.stage(fit_scaling(X), lambda t: t, torch.float64, outliers=(centre, spread), offset=200)
    assert scan.outlying == 1 and scan.outlying_shown == [(321, 1e7)]


def test_refit_posterior_asks_for_arrays(tmp_path):
    X, y = data(100)
    path = parquet(tmp_path / "t.parquet", X, y)
    est = GPRegressor(method="softki", **FAST).fit(Table(path, target="y"))
    with pytest.raises(ValueError, match="refit_posterior takes the training rows as arrays"):
        est.refit_posterior(Table(path, target="y"), None, calibrate_noise="variance")


def test_a_validation_split_of_a_table_trains_on_the_rows_the_arrays_do(tmp_path):
    X, y = data(300)
    path = parquet(tmp_path / "t.parquet", X, y, row_group_size=None)
    options = dict(method="svgp", val_fraction=0.3, epochs=2, batch_size=50, n_inducing=8, progress=False)
    expected = GPRegressor(**options).fit(X, y).predict(X[:40])
    np.testing.assert_allclose(GPRegressor(**options).fit(Table(path, target="y")).predict(X[:40]), expected,
                               rtol=0, atol=1e-12)


def test_predicting_at_a_table_reads_no_target_and_warns_of_no_names(tmp_path):
    X, y = data(100)
    est = GPRegressor(method="svgp", **FAST).fit(Table(parquet(tmp_path / "t.parquet", X, y), target="y"))
    labelled = tmp_path / "labelled.parquet"
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "y": ["?"] * len(X)}), labelled)  # a target not numbers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(est.predict(Table(labelled, target="y")), est.predict(Table(labelled)))
