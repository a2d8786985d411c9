"""Rows that stay on disk: a table file given to ``fit`` and ``predict`` in place of arrays (:class:`Table`), and the
scaled copy of its rows that training reads (:class:`MappedRows`).

A fit from a :class:`Table` reads the file twice, a block at a time, and never holds its rows:

1. one streamed pass counts the rows and gathers what scaling and checking need: the columns' moments
   (:class:`~gpscale.scaling.ColumnMoments`), the targets' moments and a sample of them for the outlier check (a
   regressor), or the set of class labels (a classifier);
2. a second pass writes the rows, scaled and in the model's dtype, to an unnamed temporary file (in ``$TMPDIR``,
   else the system's temporary folder; the space is set aside before the first row is written, so a full disk is an
   error that names the folder, not a crash), memory-mapped as the tensors X [n, d] and y [n] that training indexes.

A minibatch step reads its rows from that file by row (:meth:`MappedRows.take`), copies of 1,024 rows, so the
process maps none of the file's pages, and its memory does not grow with n but for the epoch's permutation of the
row indices (8 bytes a row). Passes over the rows read them through the mapping: the initialisation's sample gives
its pages back after each chunk, and a method whose training or posterior passes over every row (sgpr, the exact
GP, DBK) maps at most the file while it passes, its pages given back after (:meth:`MappedRows.release`; they stay
in the operating system's file cache). A ``$TMPDIR`` on a tmpfs keeps the staged file in memory: point it at a
disk. The file is removed when the fit ends, however it ends (the operating system frees an unnamed file when its
last user closes it).
"""
from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from .memory import gib
from .scaling import ColumnMoments, Scaling, outlying, warn_outliers
from .tables import BLOCK_ROWS, read_blocks, table_columns

__all__ = ["TARGET_SAMPLE", "ArrayRows", "MappedRows", "StagedRows", "Table", "TableScan"]

# targets kept by a scan for the median and spread of the outlier check: every target up to this many, beyond a
# sample of every k-th row
TARGET_SAMPLE = 1 << 18


class Table:
    """A table file as the rows of ``fit`` or ``predict``, read a block at a time: CSV, TSV, Parquet, Feather /
    Arrow IPC, ``.npy`` or ``.npz``, by its extension (:mod:`gpscale.tables`).

    ``GPRegressor().fit(Table("train.parquet", target="y"))`` trains on every column but ``y`` as features and ``y``
    as the target, as ``gpscale fit train.parquet --target y`` does; ``predict(Table("test.parquet"))`` reads the
    features the model was fitted on by name, and no other column.

    Args:
        path: the file.
        target: the target column (class labels for a classifier); None for rows to predict at.
        features: the feature columns, in order (default: every column but ``target``).
    """

    def __init__(self, path: str | os.PathLike, target: str | None = None, features: list[str] | None = None):
        self.path = Path(path)
        columns = table_columns(self.path)  # checks the format and that the file exists
        if target is not None and target not in columns:
            raise ValueError(f"{self.path} has no column {target!r} (the target); its columns: {', '.join(columns)}.")
        if features is None:
            features = [c for c in columns if c != target]
        missing = [f for f in features if f not in columns]
        if missing:
            raise ValueError(f"{self.path} lacks the feature columns {', '.join(map(repr, missing))}; its columns: "
                             f"{', '.join(columns)}.")
        if target in features:
            raise ValueError(f"Column {target!r} is the target and cannot also be a feature.")
        if not features:
            raise ValueError(f"{self.path} has no feature column besides the target {target!r}.")
        self.target, self.features = target, list(features)

    def __repr__(self) -> str:
        return f"Table({str(self.path)!r}, target={self.target!r})"

    def blocks(self, shard: tuple[int, int] = (0, 1), labels: bool = False, rows: int = BLOCK_ROWS,
               features: list[str] | None = None,
               target: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Consecutive blocks (X [b, d] float64, y [b] or None) of the file's rows, or of process
        ``shard = (rank, world_size)``'s block of them (:func:`gpscale.tables.read_blocks`), with its checks.
        ``labels``: the target as class labels, the text of its cells. ``features``: these columns instead of
        the table's own (the names a model was fitted on). ``target=False``: the features only, the target column
        not read (y None), as for a table without one."""
        features = self.features if features is None else list(features)
        with_target = target and self.target is not None
        columns = features + ([self.target] if with_target else [])
        text = self.target if labels and with_target else None
        for block in read_blocks(self.path, columns, text_column=text, shard=shard, rows=rows):
            X = block[:, :len(features)].astype(np.float64, copy=False)
            yield X, (block[:, -1] if with_target else None)


class TableScan:
    """What the first pass over a table's rows (this process's block) finds: the rows ``n``, the features'
    moments, and either the targets' moments and a sample of them (``labels=False``) or the class labels seen.
    Both passes read blocks of at most ``rows`` rows."""

    def __init__(self, table: Table, shard: tuple[int, int], labels: bool, rows: int = BLOCK_ROWS):
        if table.target is None:
            raise ValueError(f"fit needs a target: Table({str(table.path)!r}, target=COLUMN).")
        self.table, self.shard, self.labels, self.rows = table, shard, labels, rows
        self.x_moments, self.y_moments = ColumnMoments((len(table.features),)), ColumnMoments()
        self.n, self.classes, sample, stride = 0, set(), [], 1
        for X, y in table.blocks(shard, labels=labels, rows=rows):
            self.x_moments.add(X)
            if labels:
                self.classes.update(y.tolist())
            else:
                y = y.astype(np.float64)
                self.y_moments.add(y)
                sample.append(y[(-self.n) % stride::stride])
                if sum(map(len, sample)) > TARGET_SAMPLE:  # keep every other of the kept rows from here on
                    kept = np.concatenate(sample)
                    sample, stride = [kept[::2]], 2 * stride
            self.n += len(X)
        self.y_sample = np.concatenate(sample) if sample else np.empty(0)

    @property
    def d(self) -> int:
        return len(self.table.features)

    def stage(self, x_scale: Scaling, targets: Callable[[np.ndarray], np.ndarray], dtype: torch.dtype,
              folder: str | None = None, outliers: tuple[float, float] | None = None,
              offset: int = 0) -> MappedRows:
        """The second pass: the rows as :class:`MappedRows`, X scaled by ``x_scale``, y as ``targets(y)`` gives
        (scaled targets, or class codes), both in ``dtype``. With ``outliers = (centre, spread)``, the targets over
        :data:`~gpscale.scaling.OUTLIER_THRESHOLD` spreads from the centre are counted into ``self.outlying`` and
        the first five kept, as (global row, value) with this process's rows starting at ``offset``, in
        ``self.outlying_shown``."""
        rows = MappedRows(self.n, self.d, dtype, folder)
        start, self.outlying, self.outlying_shown = 0, 0, []
        for X, y in self.table.blocks(self.shard, labels=self.labels, rows=self.rows):
            if outliers is not None:
                far = outlying(y, *outliers)
                self.outlying += far.size
                self.outlying_shown += [(offset + start + i, float(y[i])) for i in far[:5]]
            rows.write(start, x_scale.apply(X), targets(y))
            start += len(X)
        if start != self.n:
            raise ValueError(f"{self.table.path} changed while it was read: {start:,} rows now, {self.n:,} before.")
        return rows


class MappedRows:
    """Rows X [n, d] and y [n] in ``dtype``, held in an unnamed temporary file in ``folder`` (default: ``$TMPDIR``
    or the system's temporary folder) and memory-mapped: ``X`` and ``y`` are tensors whose pages are read from the
    file when touched. Raises OSError naming the folder, before anything is written, where it lacks the room."""

    def __init__(self, n: int, d: int, dtype: torch.dtype, folder: str | None = None):
        itemsize = torch.empty((), dtype=dtype).element_size()
        size = n * (d + 1) * itemsize
        self._map, self._dtype, self._itemsize, self._d = None, _numpy_dtype(dtype), itemsize, d
        if size == 0:  # a process without rows
            self.X, self.y = torch.empty(n, d, dtype=dtype), torch.empty(n, dtype=dtype)
            return
        folder = folder or tempfile.gettempdir()
        # open while the rows live (take reads it); unnamed, so removed however the process ends
        self._file = tempfile.TemporaryFile(dir=folder, prefix="gpscale-rows-")  # noqa: SIM115
        try:  # the blocks now: writing to a mapped page of a full disk would kill the process
            os.posix_fallocate(self._file.fileno(), 0, size)
        except OSError as error:
            self._file.close()
            raise OSError(error.errno, f"could not set aside {gib(size)} in {folder} for the training rows "
                                       f"({os.strerror(error.errno)}): set TMPDIR to a folder with that much "
                                       "room.") from None
        self._map = mmap.mmap(self._file.fileno(), size)
        values = torch.from_numpy(np.frombuffer(self._map, dtype=self._dtype))
        self.X, self.y = values[:n * d].view(n, d), values[n * d:]

    def write(self, start: int, X: np.ndarray, y: np.ndarray) -> None:
        """Set rows ``start .. start + len(X) - 1``, then give their pages back (:meth:`release`)."""
        stop = start + len(X)
        self.X[start:stop] = torch.from_numpy(np.ascontiguousarray(X))
        self.y[start:stop] = torch.from_numpy(np.ascontiguousarray(y))
        self.release()

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the rows ``rows`` [b] (X [b, d], y [b]), read from the file row by row (one ``pread`` each of
        a row of X and of its target) rather than through the mapping: a random minibatch touches a page (or a
        whole large page-cache folio, which the kernel maps at once) for nearly every row it reads, so through the
        mapping a step of 1,024 random rows maps most of a file of 10^7 rows."""
        index = rows.tolist()
        if not index:  # (a process without rows of this batch)
            return self.X[:0].clone(), self.y[:0].clone()
        fd, row, item = self._file.fileno(), self._d * self._itemsize, self._itemsize
        y_start = self.X.numel() * item
        X = b"".join([os.pread(fd, row, i * row) for i in index])
        y = b"".join([os.pread(fd, item, y_start + i * item) for i in index])
        return (torch.from_numpy(np.frombuffer(X, dtype=self._dtype).reshape(len(index), self._d).copy()),
                torch.from_numpy(np.frombuffer(y, dtype=self._dtype).copy()))

    def release(self) -> None:
        """Unmap the pages read so far from this process, which keeps them in the file cache (they are read again
        from there when touched): the memory the process holds does not grow with the rows read."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


class ArrayRows:
    """Training rows given as arrays: X [n, d] (float64 or float32, never copied whole) and the model's targets [n].
    What the estimators train on, as :class:`StagedRows` for a table."""

    def __init__(self, X: np.ndarray, targets: np.ndarray):
        self.X, self.targets = X, targets
        self.n, self.d = X.shape

    def x_moments(self) -> ColumnMoments:
        return ColumnMoments((self.d,)).add(self.X)

    def tensors(self, x_scale: Scaling, dtype: torch.dtype, device: torch.device):
        """(X scaled [n, d], targets [n]) as tensors in ``dtype`` on ``device``, and None: no mapped rows."""
        X = x_scale.apply_into(self.X, torch.empty(self.n, self.d, dtype=dtype))
        return X.to(device), torch.tensor(self.targets, dtype=dtype, device=device), None


class StagedRows:
    """Training rows of a table after its first pass (:class:`TableScan`), whose ``tensors`` make the second: the
    rows scaled into :class:`MappedRows`, the targets as ``targets(y)`` gives them."""

    def __init__(self, scan: TableScan, targets: Callable[[np.ndarray], np.ndarray],
                 outliers: tuple[float, float] | None = None, offset: int = 0):
        self.scan, self.targets, self.outliers, self.offset = scan, targets, outliers, offset
        self.n, self.d = scan.n, scan.d

    def x_moments(self) -> ColumnMoments:
        return self.scan.x_moments

    def tensors(self, x_scale: Scaling, dtype: torch.dtype, device: torch.device):
        """(X, y, rows): on the CPU memory-mapped tensors and the :class:`MappedRows` that holds them (for
        :func:`gpscale.train.fit`'s ``mapped``); on another device the rows copied there, and None."""
        rows = self.scan.stage(x_scale, self.targets, dtype, outliers=self.outliers, offset=self.offset)
        warn_outliers(self.scan.outlying, self.scan.outlying_shown)
        if device.type == "cpu":
            return rows.X, rows.y, rows
        return rows.X.to(device), rows.y.to(device), None
