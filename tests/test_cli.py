import csv
import warnings

import numpy as np
import pytest

from gpscale.cli import main


@pytest.fixture
def train_csv(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(80, 3))
    y = np.sin(5 * X[:, 0]) + X[:, 1]
    path = tmp_path / "train.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "target"])
        w.writerows(np.c_[X, y].tolist())
    return path, X, y


def test_fit_then_predict_writes_mean_and_std_matching_the_python_api(tmp_path, train_csv, capsys):
    path, X, _ = train_csv
    model = tmp_path / "m.gps"
    assert main(["fit", str(path), "--target", "target", "--method", "sgpr", "-o", str(model),
                 "--n-inducing", "10", "--epochs", "5", "--quiet", "--option", "solver=qr"]) == 0
    new = tmp_path / "new.csv"
    with open(new, "w", newline="") as f:  # columns in another order, target absent
        w = csv.writer(f)
        w.writerow(["c", "a", "b"])
        w.writerows(X[:4][:, [2, 0, 1]].tolist())
    out = tmp_path / "out.csv"
    with warnings.catch_warnings():  # the columns are matched by name: no warning of arrays without names
        warnings.simplefilter("error")
        assert main(["predict", str(model), str(new), "-o", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    from gpscale import load
    reg = load(model)
    assert reg.solver == "qr" and list(reg.feature_names_in_) == ["a", "b", "c"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's: arrays carry no feature names
        mean, std = reg.predict(X[:4], return_std=True)
    np.testing.assert_allclose([float(r["mean"]) for r in rows], mean, rtol=1e-12)
    np.testing.assert_allclose([float(r["std"]) for r in rows], std, rtol=1e-12)


def test_fit_classify_then_predict_writes_labels_and_probabilities(tmp_path, train_csv):
    path, X, y = train_csv
    labelled = tmp_path / "labelled.csv"
    with open(labelled, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "label"])
        w.writerows(np.c_[X, (y > np.median(y)).astype(int)].tolist())
    model, out = tmp_path / "c.gps", tmp_path / "out.csv"
    assert main(["fit", str(labelled), "--target", "label", "--classify", "-o", str(model), "--n-inducing", "10",
                 "--epochs", "30", "--batch-size", "40", "--quiet"]) == 0
    assert main(["predict", str(model), str(labelled), "-o", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    from gpscale import GPClassifier, load
    clf = load(model)
    assert isinstance(clf, GPClassifier) and clf.method_ == "svgp" and list(rows[0]) == ["label", "p_0.0", "p_1.0"]
    np.testing.assert_allclose([[float(r["p_0.0"]), float(r["p_1.0"])] for r in rows], clf.predict_proba(X),
                               rtol=1e-12)
    assert [r["label"] for r in rows] == clf.predict(X).tolist()  # the labels as the file wrote them


@pytest.mark.parametrize("labels", [["cat", "dog"], [2, 5]])
def test_the_classifier_takes_any_labels_and_writes_them_back_as_they_came(tmp_path, train_csv, labels):
    path, X, y = train_csv
    labelled = tmp_path / "labelled.csv"
    given = [labels[int(v > np.median(y))] for v in y]
    with open(labelled, "w", newline="", encoding="utf-8-sig") as f:  # with a byte-order mark, as Excel writes
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "label"])
        w.writerows([[*x, label] for x, label in zip(X.tolist(), given)])
    model, out = tmp_path / "c.gps", tmp_path / "out.csv"
    assert main(["fit", str(labelled), "--target", "label", "--classify", "-o", str(model), "--n-inducing", "10",
                 "--epochs", "3", "--batch-size", "40", "--quiet"]) == 0
    assert main(["predict", str(model), str(labelled), "-o", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == ["label", *(f"p_{label}" for label in sorted(map(str, labels)))]
    assert {r["label"] for r in rows} <= set(map(str, labels))
    from gpscale import load
    assert load(model).metadata_["feature_names"] == ["a", "b", "c"]  # no byte-order mark in the first name


@pytest.mark.parametrize("text, value", [("no", False), ("False", False), ("0", False), ("off", False),
                                         ("yes", True), ("true", True), ("1", True), ("ON", True)])
def test_boolean_options_parse_strictly(tmp_path, train_csv, text, value):
    from gpscale import load

    path, _, _ = train_csv
    model = tmp_path / "m.gps"
    assert main(["fit", str(path), "--target", "target", "--method", "exact", "--epochs", "2", "-o", str(model),
                 "--quiet", "--option", f"ard={text}"]) == 0
    reg = load(model)
    assert reg.ard is value and reg.model_.kernel.ard is value


def test_data_list_runs_without_a_data_folder(monkeypatch, capsys):
    monkeypatch.delenv("GPSCALE_DATA", raising=False)
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "friedman1" in out and "pol" in out


def test_a_shard_parses_only_its_block_of_rows_and_locates_errors_by_file_line(tmp_path, train_csv):
    from gpscale.tables import read_table

    path, X, y = train_csv
    blocks = [read_table(path, shard=(rank, 3)) for rank in range(3)]
    assert all(names == ["a", "b", "c", "target"] for names, _ in blocks)
    assert [len(table) for _, table in blocks] == [27, 26, 27]
    np.testing.assert_array_equal(np.concatenate([table for _, table in blocks]), np.c_[X, y])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,y\n1,2\n3,4\nx,3\n")
    with pytest.raises(ValueError, match="line 4"):
        read_table(bad, shard=(1, 2))


def test_step_time_times_a_minibatch_method(capsys):
    assert main(["step-time", "odvff", "--d", "2", "--steps", "2", "--batch-size", "50",
                 "--option", "n_frequencies=3", "--option", "n_mean_inducing=5"]) == 0
    assert "CPU s per step" in capsys.readouterr().out



def test_a_full_disk_while_writing_predictions_keeps_the_earlier_file_and_says_where_and_what_to_do(
        tmp_path, train_csv, full_disk, capsys):
    path, _, _ = train_csv
    model, out = tmp_path / "m.gps", tmp_path / "out.csv"
    assert main(["fit", str(path), "--target", "target", "--method", "exact", "--epochs", "2", "--quiet", "-o",
                 str(model)]) == 0
    earlier = b"mean,std\r\n1.5,0.25\r\n"  # predictions of an earlier run
    out.write_bytes(earlier)
    capsys.readouterr()
    full_disk(30)  # room for the header and part of the first row
    assert main(["predict", str(model), str(path), "-o", str(out)]) == 2
    assert out.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gps", "out.csv", "train.csv"]  # no temporary file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("gpscale: error: [Errno 28] could not write ")
    assert f"{out} (No space left on device); the earlier out.csv is left as it was" in err[0]
    assert "Free space on that disk" in err[0]


@pytest.mark.parametrize("column, cell", [("b", "NaN"), ("b", "-inf"), ("target", "nan"), ("target", "Infinity")])
def test_a_non_finite_cell_is_refused_with_its_line_and_column(tmp_path, train_csv, capsys, column, cell):
    path, _, _ = train_csv
    lines = path.read_text().splitlines()
    names = lines[0].split(",")
    row = lines[5].split(",")
    row[names.index(column)] = cell
    lines[5] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")
    model = tmp_path / "m.gps"
    assert main(["fit", str(path), "--target", "target", "--method", "exact", "--epochs", "2", "--quiet", "-o",
                 str(model)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [(f"gpscale: error: {path}, line 6, column {column!r}: {cell!r} is not a finite number. Remove "
                    "that row or impute the cell.")]
    assert not model.exists()


def test_written_files_keep_the_permissions_a_plain_open_gives(tmp_path):
    import os

    from gpscale.io import write_atomically

    fresh, kept = tmp_path / "fresh.csv", tmp_path / "kept.csv"
    kept.write_text("old\n")
    kept.chmod(0o640)
    umask = os.umask(0o022)
    try:
        write_atomically(fresh, lambda f: f.write(b"new\n"))
        write_atomically(kept, lambda f: f.write(b"new\n"))
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644 and kept.stat().st_mode & 0o777 == 0o640
