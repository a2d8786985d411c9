"""Tables from files (gpscale.tables): every format gives the same numbers, a shard its block of rows, and each bad
file an error that names the cell (its line in a CSV, its row in a columnar file) or the shape."""
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from gpscale.cli import main
from gpscale.tables import read_table

NAMES = ["a", "b", "y"]


@pytest.fixture
def table():
    rng = np.random.default_rng(0)
    return rng.normal(size=(50, 3))


def write(folder, table, fmt, names=NAMES):
    path = folder / f"t.{fmt}"
    if fmt in ("csv", "tsv"):
        np.savetxt(path, table, delimiter="," if fmt == "csv" else "\t", header=("," if fmt == "csv" else "\t")
                   .join(names), comments="", fmt="%.17g")
    elif fmt in ("parquet", "feather"):
        arrow = pa.table({n: table[:, j] for j, n in enumerate(names)})
        pq.write_table(arrow, path, row_group_size=7) if fmt == "parquet" else feather.write_feather(arrow, path)
    elif fmt == "npy":
        np.save(path, table)
    else:
        np.savez(path, X=table[:, :2], y=table[:, 2])
    return path


FORMATS = {"csv": NAMES, "tsv": NAMES, "parquet": NAMES, "feather": NAMES, "npy": ["0", "1", "2"],
           "npz": ["X0", "X1", "y"]}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_numbers_and_shards_its_rows(tmp_path, table, fmt):
    path = write(tmp_path, table, fmt)
    names, read = read_table(path)
    assert names == FORMATS[fmt]
    np.testing.assert_array_equal(read, table)
    blocks = [read_table(path, shard=(rank, 3))[1] for rank in range(3)]
    assert [len(b) for b in blocks] == [17, 16, 17]
    np.testing.assert_array_equal(np.concatenate(blocks), table)
    names, two = read_table(path, columns=FORMATS[fmt][::-2])
    np.testing.assert_array_equal(two, table[:, ::-2])


@pytest.mark.parametrize("fmt", ["parquet", "feather", "npz"])
def test_a_missing_or_non_finite_value_in_a_typed_file_is_named_by_its_row(tmp_path, table, fmt):
    table[12, 1] = np.nan
    path = write(tmp_path, table, fmt)
    column = FORMATS[fmt][1]
    with pytest.raises(ValueError, match=f"row 13, column '{column}': nan is not a finite number"):
        read_table(path)


def test_a_column_of_text_in_a_typed_file_is_named(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": ["x", "y"], "y": [1.0, 2.0]}), path)
    with pytest.raises(ValueError, match="column 'a': not numbers"):
        read_table(path)
    names, labelled = read_table(path, text_column="a")
    assert labelled[:, 0].tolist() == ["x", "y"] and labelled.dtype == object


def test_class_labels_are_text_and_a_missing_one_is_named(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("a,label\n1, cat\n2,dog\n")
    names, read = read_table(path, text_column="label")
    assert read[:, 1].tolist() == ["cat", "dog"] and read[:, 0].tolist() == [1.0, 2.0]
    path.write_text("a,label\n1,cat\n2, \n")
    with pytest.raises(ValueError, match="line 3, column 'label': the class label is missing"):
        read_table(path, text_column="label")


@pytest.mark.parametrize("content, message", [
    ("a,y\n1,2\n3\n", "line 3: 1 cells, but the header has 2"),
    ("a,y\n1,2\nx,3\n", "line 3, column 'a': 'x' is not a number"),
    ("a,y\n1,2\n,3\n", "line 3, column 'a': '' is not a number"),
    ("a,y\n1,inf\n", "line 2, column 'y': 'inf' is not a finite number"),
    ("a,y\n", "needs a header row and at least one data row"),
])
def test_a_bad_csv_cell_is_named_by_its_line_and_column(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_table(path)


def test_a_byte_order_mark_and_spaces_are_not_part_of_the_names(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeff a , y\n1,2\n".encode("utf-8"))
    assert read_table(path)[0] == ["a", "y"]


def test_an_unknown_extension_names_the_formats(tmp_path):
    path = tmp_path / "t.xlsx"
    path.write_text("")
    with pytest.raises(ValueError, match=r"unknown table format '\.xlsx'; gpscale reads .*\.parquet"):
        read_table(path)


@pytest.mark.parametrize("fmt", ["parquet", "npz"])
def test_the_command_line_fits_and_predicts_from_a_columnar_file(tmp_path, table, fmt, capsys):
    path = write(tmp_path, table, fmt)
    target = FORMATS[fmt][-1]
    model, out = tmp_path / "m.gps", tmp_path / "p.csv"
    assert main(["fit", str(path), "--target", target, "--method", "sgpr", "--n-inducing", "8", "--max-steps", "5",
                 "--quiet", "-o", str(model)]) == 0
    assert main(["predict", str(model), str(path), "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 51


def test_predictions_are_written_a_chunk_at_a_time_as_csv_or_parquet_and_equal_the_whole_call(
        tmp_path, table, monkeypatch):
    import gpscale.cli
    from gpscale import load

    path = write(tmp_path, table, "csv")
    model = tmp_path / "m.gps"
    assert main(["fit", str(path), "--target", "y", "--method", "svgp", "--n-inducing", "8", "--epochs", "2",
                 "--quiet", "-o", str(model)]) == 0
    monkeypatch.setattr(gpscale.cli, "PREDICT_CHUNK_ROWS", 64)  # 50 rows: one chunk; 64 below the table's rows
    big = tmp_path / "big.csv"
    np.savetxt(big, np.tile(table, (3, 1)), delimiter=",", header=",".join(NAMES), comments="", fmt="%.17g")
    for out in (tmp_path / "p.csv", tmp_path / "p.parquet"):
        assert main(["predict", str(model), str(big), "-o", str(out), "--quiet"]) == 0
    whole = np.c_[load(model).predict(np.tile(table, (3, 1))[:, :2], return_std=True)]
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1), whole)
    parquet = pq.read_table(tmp_path / "p.parquet")
    assert parquet.column_names == ["mean", "std"]
    np.testing.assert_array_equal(np.c_[parquet.column("mean").to_numpy(), parquet.column("std").to_numpy()], whole)
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "mean,std"


def test_an_output_of_another_format_is_refused_before_any_work(tmp_path, table, capsys):
    path = write(tmp_path, table, "csv")
    assert main(["predict", str(tmp_path / "no-model.gps"), str(path), "-o", str(tmp_path / "p.xlsx")]) == 2
    assert "gpscale writes tables as .csv, .parquet, .pq, .tsv" in capsys.readouterr().err


def test_a_process_reads_only_the_parquet_row_groups_that_hold_its_rows(tmp_path, table, monkeypatch):
    path = write(tmp_path, table, "parquet")  # row groups of 7 rows
    requested = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self, *args, row_groups=None, **kwargs):
        requested.append(list(row_groups))
        return iter_batches(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    _, block = read_table(path, shard=(2, 3))  # rows 33..49
    np.testing.assert_array_equal(block, table[33:])
    assert requested == [[4], [5], [6], [7]]  # rows 28..55, a row group at a time, every column in one pass


def test_a_bad_cell_in_another_processs_rows_is_named_alike_on_every_process(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,y\n" + "".join(f"{i},{i}\n" for i in range(20)) + "x,1\n")
    for rank in range(2):
        with pytest.raises(ValueError, match="line 22, column 'a': 'x' is not a number"):
            read_table(path, shard=(rank, 2))


@pytest.mark.parametrize("compression", ["lz4", "uncompressed"])
def test_a_feather_file_is_read_a_record_batch_at_a_time(tmp_path, table, compression):
    from gpscale.tables import read_blocks

    path = tmp_path / "t.feather"
    feather.write_feather(pa.table({n: table[:, j] for j, n in enumerate(NAMES)}), path, compression=compression,
                          chunksize=13)
    blocks = list(read_blocks(path, rows=5))
    assert max(map(len, blocks)) == 5
    np.testing.assert_array_equal(np.concatenate(blocks), table)
    for world in (2, 3):
        np.testing.assert_array_equal(np.concatenate([read_table(path, shard=(r, world))[1] for r in range(world)]),
                                      table)
