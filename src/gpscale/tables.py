"""Tables from files, read by the libraries made for them: CSV and TSV by pyarrow's CSV reader, Parquet and Feather /
Arrow IPC by pyarrow, ``.npy`` and ``.npz`` by numpy; the format is chosen by the file's extension.

:func:`read_blocks` gives a table's rows a block at a time (what :class:`gpscale.sources.Table` reads, so that
memory does not grow with the file), :func:`read_table` the whole table, float64 (or, with a column of class labels,
an object table). Every cell of the data path is parsed by those libraries, never one at a time in Python. A file
they refuse, or whose cells they read as missing or non-finite (an empty cell, ``nan``, ``inf``), is read again cell
by cell to name the first bad cell's line and column; only a bad file pays for that.

``.npy``: a 2-D array, its columns named ``0``, ``1``, ... (``--target 10``), memory-mapped. ``.npz``: each 2-D array
``A`` gives columns ``A0``, ``A1``, ... and each 1-D array a column of its own name, in the file's order (the data
folder's ``X``, ``y`` give ``X0``, ..., ``y``); an ``.npz`` is read whole, unlike the other formats.
"""
from __future__ import annotations

import csv
import io
import itertools
import math
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .shards import row_blocks

__all__ = ["BLOCK_ROWS", "FORMATS", "OUTPUT_FORMATS", "check_output_format", "read_blocks", "read_table",
           "table_columns", "write_table"]

FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet", ".feather": "arrow",
           ".arrow": "arrow", ".ipc": "arrow", ".npy": "npy", ".npz": "npz"}
# rows of a block of a columnar file (Parquet, Feather, .npy, .npz); a CSV's blocks are pyarrow's, of _CSV_BLOCK_BYTES
BLOCK_ROWS = 65_536
_CSV_BLOCK_BYTES = 1 << 20
OUTPUT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}


def read_table(path: Path, shard: tuple[int, int] = (0, 1), text_column: str | None = None,
               columns: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """Header names and a float64 table [rows, columns] of the file at ``path``: :func:`read_blocks`'s blocks,
    joined. ``columns``, ``text_column`` and ``shard`` as there."""
    names = table_columns(path)
    read = _select(path, names, columns)
    blocks = list(read_blocks(path, read, text_column, shard))
    return read, np.concatenate(blocks) if len(blocks) > 1 else blocks[0]


def table_columns(path: Path) -> list[str]:
    """The column names of the table file at ``path`` (a CSV's header; see the module docstring for ``.npy`` and
    ``.npz``); ValueError for an unknown extension, FileNotFoundError for a missing file."""
    path, kind = _kind(path)
    if kind in ("csv", "tsv"):
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f, delimiter=_DELIMITERS[kind]), None)
        return [n.strip() for n in header or ()]
    if kind == "arrow":  # the schema alone
        import pyarrow as pa
        import pyarrow.ipc as ipc

        try:
            return list(ipc.open_file(pa.memory_map(str(path))).schema.names)
        except Exception as err:  # noqa: BLE001 - whatever pyarrow says, the file is not one it can read
            raise ValueError(f"{path} is not an Arrow IPC (Feather) file ({type(err).__name__}).") from None
    return _columnar_source(path, kind)[0]


def read_blocks(path: Path, columns: list[str] | None = None, text_column: str | None = None,
                shard: tuple[int, int] = (0, 1), rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
    """The file's rows as consecutive blocks of at most ``rows`` rows each (a CSV's blocks are pyarrow's, usually
    fewer rows), float64 [b, columns] (an object array where ``text_column``, class labels kept as text, is among
    them), read as they are consumed: the memory is a block's, whatever the file's size. The checks of
    :func:`read_table` apply to every block; the first block is read before the first is given, so an empty file
    fails at once.

    ``columns``: only these, in this order (default: all). ``shard=(rank, world_size)``: only that process's
    contiguous block of the data rows (:func:`gpscale.shards.row_blocks`), read from the file's rows or row groups
    that hold it (a CSV is streamed twice: counting its rows, then keeping the block)."""
    path, kind = _kind(path)
    read = _select(path, table_columns(path), columns)
    if kind in ("csv", "tsv"):
        blocks = _delimited_blocks(path, _DELIMITERS[kind], text_column, read, shard)
    else:
        blocks = _columnar_blocks(path, kind, text_column, read, shard, rows)
    first = next(blocks, None)
    if first is None:
        raise ValueError(f"{path} needs a header row and at least one data row." if kind in ("csv", "tsv")
                         else f"{path} needs at least one data row.")
    return itertools.chain([first], blocks, _released_arrow_memory())


def _released_arrow_memory() -> Iterator[np.ndarray]:
    """Nothing, after returning the memory pyarrow's allocator kept from the blocks to the system (it keeps freed
    pages for reuse, which after a pass over a large file are the pages of its largest row group)."""
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    yield from ()


_DELIMITERS = {"csv": ",", "tsv": "\t"}


def _kind(path) -> tuple[Path, str]:
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unknown table format {path.suffix!r}; gpscale reads "
                         f"{', '.join(sorted(FORMATS))}.")
    if not path.is_file():
        raise FileNotFoundError(f"No such file: {path}.")
    return path, kind


def _select(path: Path, names: list[str], columns: list[str] | None) -> list[str]:
    missing = [n for n in columns or () if n not in names]
    if missing:
        raise ValueError(f"{path} lacks the columns {', '.join(missing)}; its columns: {', '.join(names)}.")
    return list(columns) if columns is not None else names


def _delimited_blocks(path: Path, delimiter: str, text_column, read, shard) -> Iterator[np.ndarray]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = table_columns(path)
    options = dict(read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=_CSV_BLOCK_BYTES),
                   parse_options=pacsv.ParseOptions(delimiter=delimiter),
                   convert_options=pacsv.ConvertOptions(
                       column_types={n: pa.string() if n == text_column else pa.float64() for n in read},
                       include_columns=read, strings_can_be_null=True))
    rank, world_size = shard
    try:
        if world_size > 1:
            n = sum(batch.num_rows for batch in pacsv.open_csv(path, **options))
            first, last = row_blocks(n, world_size)[rank:rank + 2]
        else:
            n, first, last = None, 0, math.inf
        seen, given = 0, False
        for batch in pacsv.open_csv(path, **options):
            start, stop = max(first - seen, 0), min(last - seen, batch.num_rows)
            seen += batch.num_rows
            if start >= stop:
                continue
            batch = batch.slice(start, stop - start)
            if _has_missing_or_non_finite(batch, text_column):
                _locate_bad_cell(path, delimiter, names, read, text_column)
            given = True
            yield _to_numpy(batch, read, text_column)
    except pa.ArrowInvalid:  # a short row, or a cell that is not a number: named by the slow reader below
        _locate_bad_cell(path, delimiter, names, read, text_column)
    if seen < 1:
        _locate_bad_cell(path, delimiter, names, read, text_column)
    if not given:  # a process whose block of a short file is empty
        yield _to_numpy(None, read, text_column)


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
    """An Arrow batch's columns ``read`` as a table [rows, columns] (None: no rows)."""
    if arrow is None:
        return np.empty((0, len(read)), dtype=object if text_column in read else np.float64)
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


def _columnar_blocks(path: Path, kind: str, text_column, read, shard, rows: int) -> Iterator[np.ndarray]:
    """Parquet, Arrow IPC (Feather v2), .npy and .npz: typed columns, so a bad cell is a missing or non-finite value
    (named by its row) or a column of another type."""
    names, n, blocks = _columnar_source(path, kind)
    if n < 1:
        raise ValueError(f"{path} needs at least one data row.")
    rank, world_size = shard
    first, last = row_blocks(n, world_size)[rank:rank + 2]
    if first == last:
        yield np.empty((0, len(read)), dtype=object if text_column in read else np.float64)
        return
    for start, values in blocks(read, int(first), int(last), rows):
        yield _checked_block(path, read, text_column, start, values)


def _checked_block(path: Path, read: list[str], text_column, start: int, values: dict) -> np.ndarray:
    """The columns ``values`` (name: values of rows start, start + 1, ...) as a table, checked."""
    size = len(next(iter(values.values())))
    table = np.empty((size, len(read)), dtype=object if text_column in read else np.float64)
    for j, name in enumerate(read):
        column = values[name]
        if name == text_column:
            labels = np.array([None if v is None else str(v).strip() for v in column], dtype=object)
            bad = np.flatnonzero([not v for v in labels])
            if bad.size:
                raise ValueError(f"{path}, row {start + bad[0] + 1}, column {name!r}: the class label is missing.")
            table[:, j] = labels
            continue
        try:
            numbers = np.asarray(column, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{path}, column {name!r}: not numbers (its values are like {column[0]!r}); only a "
                             "class label column (--classify) may hold text.") from None
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            raise ValueError(f"{path}, row {start + bad[0] + 1}, column {name!r}: {float(numbers[bad[0]])} is not "
                             "a finite number (a missing value, nan or inf). Remove that row or impute the cell.")
        table[:, j] = numbers
    return table


def _columnar_source(path: Path, kind: str):
    """(names, rows, blocks): ``blocks(read, first, last, rows)`` yields (start, {name: values}) for consecutive
    pieces of at most ``rows`` of rows first..last-1 of the columns ``read`` (values: a float array, or a list
    where a column holds text or missing values)."""
    if kind in ("npy", "npz"):
        arrays = _numpy_columns(path, kind)

        def slices(read, first, last, rows):
            for start in range(first, last, rows):
                yield start, {name: arrays[name][start:min(start + rows, last)] for name in read}

        return list(arrays), len(next(iter(arrays.values()))) if arrays else 0, slices
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if kind == "parquet":
        source = pq.ParquetFile(path)
        sizes = [source.metadata.row_group(g).num_rows for g in range(source.num_row_groups)]
        ends = np.cumsum(sizes)

        def row_groups(read, first, last, rows):
            # only the row groups that hold rows first..last-1, one at a time (given several, pyarrow decodes them
            # together), a batch at a time
            for group in (g for g in range(len(ends)) if ends[g] > first and ends[g] - sizes[g] < last):
                seen = int(ends[group] - sizes[group])
                for batch in source.iter_batches(batch_size=rows, row_groups=[group], columns=read):
                    start, stop = max(first - seen, 0), min(last - seen, batch.num_rows)
                    if start < stop:
                        part = batch.slice(start, stop - start)
                        yield seen + start, {name: _arrow_values(part.column(name)) for name in read}
                    seen += batch.num_rows

        return list(source.schema_arrow.names), int(ends[-1]) if len(ends) else 0, row_groups
    try:  # Feather v2 is Arrow IPC's file format: memory-mapped, a record batch at a time (decompressed if it is)
        reader = ipc.open_file(pa.memory_map(str(path)))
    except Exception as err:  # noqa: BLE001 - whatever pyarrow says, the file is not one it can read
        raise ValueError(f"{path} is not an Arrow IPC (Feather) file ({type(err).__name__}).") from None
    sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
    ends = np.cumsum(sizes, dtype=int)

    def batches(read, first, last, rows):
        for i in (i for i in range(len(ends)) if ends[i] > first and ends[i] - sizes[i] < last):
            begin = int(ends[i] - sizes[i])
            batch = reader.get_batch(i)
            for start in range(max(first, begin), min(last, int(ends[i])), rows):
                part = batch.slice(start - begin, min(rows, last - start, int(ends[i]) - start))
                yield start, {name: _arrow_values(part.column(name)) for name in read}

    return list(reader.schema.names), int(ends[-1]) if len(ends) else 0, batches


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
