"""Tables from files, read by the libraries made for them: CSV and TSV by pyarrow's multithreaded CSV reader, Parquet
and Feather / Arrow IPC by pyarrow, ``.npy`` and ``.npz`` by numpy; the format is chosen by the file's extension.

:func:`read_table` gives the header names and a float64 table (or, with a column of class labels, an object table).
Every cell of the data path is parsed by those libraries, never one at a time in Python. A file they refuse, or whose
cells they read as missing or non-finite (an empty cell, ``nan``, ``inf``), is read again cell by cell to name the
first bad cell's line and column; only a bad file pays for that.

``.npy``: a 2-D array, its columns named ``0``, ``1``, ... (``--target 10``). ``.npz``: each 2-D array ``A`` gives
columns ``A0``, ``A1``, ... and each 1-D array a column of its own name, in the file's order (the data folder's
``X``, ``y`` give ``X0``, ..., ``y``).
"""
from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .shards import row_blocks

__all__ = ["FORMATS", "OUTPUT_FORMATS", "check_output_format", "read_table", "write_table"]

FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet", ".feather": "arrow",
           ".arrow": "arrow", ".ipc": "arrow", ".npy": "npy", ".npz": "npz"}
OUTPUT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}


def read_table(path: Path, shard: tuple[int, int] = (0, 1), text_column: str | None = None,
               columns: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """Header names and a float64 table [rows, columns] of the file at ``path``; non-numeric, non-finite (nan, inf)
    or missing cells are errors that name their position. A UTF-8 byte-order mark before a CSV header is not part
    of the first name.

    ``columns``: only these, in this order (default: all). ``text_column`` (class labels) is kept as the text of its
    cells, so the table is then an object array; a missing label is an error. ``shard=(rank, world_size)``: only
    that process's contiguous block of the data rows (the blocks of ranks 0, 1, ... in order are the file's rows).
    """
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unknown table format {path.suffix!r}; gpscale reads "
                         f"{', '.join(sorted(FORMATS))}.")
    if not path.is_file():
        raise FileNotFoundError(f"No such file: {path}.")
    if kind in ("csv", "tsv"):
        names, table = _read_delimited(path, "," if kind == "csv" else "\t", text_column, columns, shard)
    else:
        names, table = _read_columnar(path, kind, text_column, columns, shard)
    return names, table


def _select(path: Path, names: list[str], columns: list[str] | None) -> list[str]:
    missing = [n for n in columns or () if n not in names]
    if missing:
        raise ValueError(f"{path} lacks the columns {', '.join(missing)}; its columns: {', '.join(names)}.")
    return list(columns) if columns is not None else names


def _read_delimited(path: Path, delimiter: str, text_column, columns, shard) -> tuple[list[str], np.ndarray]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f, delimiter=delimiter), None)
    names = [n.strip() for n in header or ()]
    read = _select(path, names, columns)
    options = dict(read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
                   parse_options=pacsv.ParseOptions(delimiter=delimiter),
                   convert_options=pacsv.ConvertOptions(
                       column_types={n: pa.string() if n == text_column else pa.float64() for n in read},
                       include_columns=read, strings_can_be_null=True))
    try:
        arrow, n_rows = _block_of_rows(path, options, shard)
    except pa.ArrowInvalid:  # a short row, or a cell that is not a number: named by the slow reader below
        arrow, n_rows = None, 0
    if arrow is None or n_rows < 1 or _has_missing_or_non_finite(arrow, text_column):
        _locate_bad_cell(path, delimiter, names, read, text_column)
    return read, _to_numpy(arrow, read, text_column)


def _block_of_rows(path: Path, options: dict, shard: tuple[int, int]):
    """(the rows of process ``rank``'s block (:func:`gpscale.shards.row_blocks`) as an Arrow table, the file's
    rows). One process reads the whole file at once; each of several streams it twice (counting the rows, then
    keeping its block), so that it holds its block and one batch, not the file."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rank, world_size = shard
    if world_size == 1:
        arrow = pacsv.read_csv(path, **options)
        return arrow, arrow.num_rows
    reader = pacsv.open_csv(path, **options)
    schema, n = reader.schema, sum(batch.num_rows for batch in reader)
    first, last = row_blocks(n, world_size)[rank:rank + 2]
    kept, seen = [], 0
    for batch in pacsv.open_csv(path, **options):
        start, stop = max(first - seen, 0), min(last - seen, batch.num_rows)
        if start < stop:
            kept.append(batch.slice(start, stop - start))
        seen += batch.num_rows
    return pa.Table.from_batches(kept, schema=schema), n


def _has_missing_or_non_finite(arrow, text_column) -> bool:
    import pyarrow.compute as pc

    if arrow.num_rows == 0:
        return False
    for name, column in zip(arrow.column_names, arrow.columns):
        if column.null_count:
            return True
        if name == text_column:
            if pc.any(pc.equal(pc.utf8_trim_whitespace(column), "")).as_py():
                return True
        elif not pc.all(pc.is_finite(column)).as_py():
            return True
    return False


def _to_numpy(arrow, read: list[str], text_column) -> np.ndarray:
    if text_column in read:
        table = np.empty((arrow.num_rows, len(read)), dtype=object)
        for j, name in enumerate(read):
            column = arrow.column(name)
            table[:, j] = ([s.strip() for s in column.to_pylist()] if name == text_column
                           else column.to_numpy(zero_copy_only=False))
        return table
    table = np.empty((arrow.num_rows, len(read)), dtype=np.float64)
    for j, name in enumerate(read):
        table[:, j] = arrow.column(name).to_numpy(zero_copy_only=False)
    return table


def _locate_bad_cell(path: Path, delimiter: str, names: list[str], read: list[str], text_column) -> None:
    """Raise ValueError naming the first bad cell of a delimited file (line and column) or its bad shape."""
    index = {n: j for j, n in enumerate(names)}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader, None)
        rows = 0
        for line, row in enumerate(reader, start=2):
            rows += 1
            if len(row) != len(names):
                raise ValueError(f"{path}, line {line}: {len(row)} cells, but the header has {len(names)}.")
            for name in read:
                cell = row[index[name]]
                if name == text_column:
                    if not cell.strip():
                        raise ValueError(f"{path}, line {line}, column {name!r}: the class label is missing.")
                else:
                    _number(path, line, name, cell)
    if rows < 1:
        raise ValueError(f"{path} needs a header row and at least one data row.")
    raise ValueError(f"{path} could not be read as a table of numbers.")  # pragma: no cover - pyarrow's own refusal


def _number(path: Path, line: int, column: str, cell: str) -> float:
    """The cell's finite number; text, a missing value and nan or inf (in any spelling ``float`` reads) are errors
    that name the cell's line and column."""
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{path}, line {line}, column {column!r}: {cell!r} is not a number.") from None
    if not np.isfinite(value):
        raise ValueError(f"{path}, line {line}, column {column!r}: {cell!r} is not a finite number. Remove that row "
                         "or impute the cell.")
    return value


def _read_columnar(path: Path, kind: str, text_column, columns, shard) -> tuple[list[str], np.ndarray]:
    """Parquet, Arrow IPC (Feather v2), .npy and .npz: typed columns, so a bad cell is a missing or non-finite value
    (named by its row) or a column of another type."""
    names, n, fetch = _columnar_source(path, kind)
    read = _select(path, names, columns)
    if n < 1:
        raise ValueError(f"{path} needs at least one data row.")
    rank, world_size = shard
    first, last = row_blocks(n, world_size)[rank:rank + 2]
    table = np.empty((last - first, len(read)), dtype=object if text_column in read else np.float64)
    for j, name in enumerate(read):
        values = fetch(name, first, last)
        if name == text_column:
            labels = np.array([None if v is None else str(v).strip() for v in values], dtype=object)
            bad = np.flatnonzero([not v for v in labels])
            if bad.size:
                raise ValueError(f"{path}, row {first + bad[0] + 1}, column {name!r}: the class label is missing.")
            table[:, j] = labels
            continue
        try:
            numbers = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{path}, column {name!r}: not numbers (its values are like {values[0]!r}); only a "
                             "class label column (--classify) may hold text.") from None
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            raise ValueError(f"{path}, row {first + bad[0] + 1}, column {name!r}: {float(numbers[bad[0]])} is not "
                             "a finite number (a missing value, nan or inf). Remove that row or impute the cell.")
        table[:, j] = numbers
    return read, table


def _columnar_source(path: Path, kind: str):
    """(names, rows, fetch): ``fetch(name, first, last)`` the values of rows first..last-1 of column ``name`` (a
    float array, or a list where a column holds text or missing values)."""
    if kind in ("npy", "npz"):
        arrays = _numpy_columns(path, kind)
        names = list(arrays)

        def fetch(name, first, last):
            return arrays[name][first:last]

        return names, len(next(iter(arrays.values()))) if arrays else 0, fetch
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if kind == "parquet":
        source = pq.ParquetFile(path)
        names = list(source.schema_arrow.names)
        ends = np.cumsum([source.metadata.row_group(g).num_rows for g in range(source.num_row_groups)])

        def fetch(name, first, last):
            # only the row groups that hold rows first..last-1
            groups = [g for g in range(len(ends)) if ends[g] > first and ends[g] - source.metadata.row_group(g)
                      .num_rows < last]
            start = int(ends[groups[0]] - source.metadata.row_group(groups[0]).num_rows) if groups else first
            column = source.read_row_groups(groups, columns=[name]).column(0)
            return _arrow_values(column.slice(first - start, last - first))

        return names, int(ends[-1]) if len(ends) else 0, fetch
    import pyarrow as pa

    try:  # Feather v2 is Arrow IPC's file format: memory-mapped, a slice of it reads only its pages
        whole = ipc.open_file(pa.memory_map(str(path))).read_all()
    except Exception as err:  # noqa: BLE001 - whatever pyarrow says, the file is not one it can read
        raise ValueError(f"{path} is not an Arrow IPC (Feather) file ({type(err).__name__}).") from None

    def fetch(name, first, last):
        return _arrow_values(whole.column(name).slice(first, last - first))

    return list(whole.column_names), whole.num_rows, fetch


def _arrow_values(column):
    """A float array where the column is numeric and complete; else its Python values (text, None)."""
    import pyarrow as pa

    if (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)) and column.null_count == 0:
        return column.to_numpy(zero_copy_only=False)
    return column.to_pylist()


def _numpy_columns(path: Path, kind: str) -> dict[str, np.ndarray]:
    """A .npy's 2-D array as columns ``0``, ``1``, ...; a .npz's arrays as columns (see the module docstring)."""
    loaded = np.load(path, allow_pickle=False, mmap_mode="r" if kind == "npy" else None)
    arrays = {"": loaded} if kind == "npy" else {key: loaded[key] for key in loaded.files}
    columns: dict[str, np.ndarray] = {}
    for key, array in arrays.items():
        if array.ndim == 1:
            columns[key or "0"] = array
        elif array.ndim == 2:
            columns.update({f"{key}{j}": array[:, j] for j in range(array.shape[1])})
        else:
            raise ValueError(f"{path}: array {key or '(the file)'} has {array.ndim} dimensions; a table needs 1 or 2.")
    lengths = {len(a) for a in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"{path}: its arrays have different numbers of rows ({sorted(lengths)}).")
    return columns


def check_output_format(path: Path) -> str:
    """The format :func:`write_table` writes at ``path``, by its extension; ValueError for another extension."""
    kind = OUTPUT_FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: gpscale writes tables as {', '.join(sorted(OUTPUT_FORMATS))}; give the output "
                         "one of these extensions.")
    return kind


def write_table(path: Path, names: list[str], chunks: Iterable[list[np.ndarray]]) -> int:
    """Write the columns ``names`` to ``path`` (CSV, TSV or Parquet, by its extension) one chunk of rows at a time:
    each chunk is a list of column arrays, written as it comes, so that the rows are never all in memory. The file is
    written atomically (:func:`gpscale.io.write_atomically`). Returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from .io import write_atomically

    kind = check_output_format(path)
    written = {"rows": 0}

    def write(f) -> None:
        writer = None
        for columns in chunks:
            batch = pa.table({name: pa.array(np.asarray(column)) for name, column in zip(names, columns)})
            if writer is None and kind == "parquet":
                writer = pq.ParquetWriter(f, batch.schema)
            elif writer is None:  # the header as the csv module writes it: names quoted only where they must be
                delimiter = "," if kind == "csv" else "\t"
                header = io.StringIO()
                csv.writer(header, delimiter=delimiter, lineterminator="\n").writerow(names)
                f.write(header.getvalue().encode("utf-8"))
                writer = pacsv.CSVWriter(f, batch.schema, write_options=pacsv.WriteOptions(
                    include_header=False, delimiter=delimiter, quoting_style="needed"))
            writer.write_table(batch)
            written["rows"] += batch.num_rows
        if writer is not None:
            writer.close()

    write_atomically(path, write)
    return written["rows"]
