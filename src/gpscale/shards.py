"""Each data-parallel process reads only its block of rows, from ``.npy`` / ``.npz`` files or a directory of them.

The rows of all files, in sorted file order, form one global table. Rank r of W takes the contiguous block
``[round(r N / W), round((r + 1) N / W))``, the same blocks that ``gpscale fit --distributed`` takes of a CSV. So
the blocks of ranks 0, 1, ... concatenate to the table, and :func:`gpscale.train.fit` on the blocks equals one
process on the table. Arrays are streamed from the file: an ``.npz`` member, compressed or not, is decompressed
up to the block's end, holding one chunk of the rows before it at a time. A ``.npy`` file is memory-mapped. The
memory is therefore O(block), whatever the file's size.

    from gpscale.shards import load_shard
    X, y = load_shard("train/", comm.rank, comm.world_size, keys=("X", "y"))
"""
from __future__ import annotations

import os
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

__all__ = ["load_shard", "row_blocks"]

_CHUNK_BYTES = 1 << 24  # rows before a block are read and dropped in pieces of about 16 MB


def row_blocks(n: int, world_size: int) -> np.ndarray:
    """Block boundaries [W + 1]: rank r holds rows ``bounds[r] .. bounds[r + 1] - 1`` of n."""
    return np.linspace(0, n, world_size + 1).round().astype(int)


def load_shard(path: str | os.PathLike, rank: int, world_size: int,
               keys: tuple[str, ...] = ("X", "y")) -> tuple[np.ndarray, ...]:
    """This rank's block of rows of the arrays ``keys`` (which share their first axis).

    Args:
        path: an ``.npz`` file holding ``<key>.npy`` members; a directory of such files (sorted by name); or,
            for one key, an ``.npy`` file.
        rank, world_size: this process and the number of processes.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}.")
    path = Path(path)
    files = sorted(f for f in path.iterdir() if f.suffix in (".npz", ".npy")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path} holds no .npz or .npy files.")
    counts = [_n_rows(f, keys) for f in files]
    bounds = row_blocks(sum(counts), world_size)
    first, last = int(bounds[rank]), int(bounds[rank + 1])
    parts: list[list[np.ndarray]] = [[] for _ in keys]
    start = 0
    for f, n in zip(files, counts):  # the part of each file that overlaps [first, last)
        lo, hi = max(first - start, 0), min(last - start, n)
        if lo < hi:
            for part, key in zip(parts, keys):
                part.append(_read_rows(f, key, lo, hi))
        start += n
    return tuple(np.concatenate(part) if part else _empty(files[0], key) for part, key in zip(parts, keys))


@contextmanager
def _open_array(f: Path, key: str):
    """A binary stream at the .npy magic of array ``key`` of file f, and its (shape, dtype) read off the header."""
    with ExitStack() as stack:
        if f.suffix == ".npy":
            stream = stack.enter_context(open(f, "rb"))
        else:
            archive = stack.enter_context(zipfile.ZipFile(f))
            if f"{key}.npy" not in archive.namelist():
                held = ", ".join(n.removesuffix(".npy") for n in archive.namelist())
                raise KeyError(f"{f} has no array {key!r}; it holds {held}.")
            stream = stack.enter_context(archive.open(f"{key}.npy"))
        major, _ = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(stream)
        if fortran and len(shape) > 1:
            raise ValueError(f"{f}: Fortran-ordered arrays cannot be read by rows; save them C-ordered.")
        yield stream, shape, dtype


def _n_rows(f: Path, keys: tuple[str, ...]) -> int:
    counts = set()
    for key in keys:
        with _open_array(f, key) as (_, shape, _):
            counts.add(shape[0])
    if len(counts) > 1:
        raise ValueError(f"The arrays {keys} of {f} have different numbers of rows: {sorted(counts)}.")
    return counts.pop()


def _read_rows(f: Path, key: str, lo: int, hi: int) -> np.ndarray:
    """Rows lo .. hi - 1 of array ``key`` of f, read sequentially (the rows before lo in pieces, dropped)."""
    if f.suffix == ".npy":
        return np.array(np.load(f, mmap_mode="r")[lo:hi])
    with _open_array(f, key) as (stream, shape, dtype):
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        skip = lo * row_bytes
        while skip:
            skip -= len(stream.read(min(skip, _CHUNK_BYTES)))
        data = stream.read((hi - lo) * row_bytes)
    return np.frombuffer(data, dtype=dtype).reshape(hi - lo, *shape[1:]).copy()


def _empty(f: Path, key: str) -> np.ndarray:
    with _open_array(f, key) as (_, shape, dtype):
        return np.empty((0, *shape[1:]), dtype=dtype)
