"""Sharded reading: the ranks' blocks of rows concatenate to the table, from .npz (compressed or not), .npy and
directories of files of different lengths, reading the rows before a block in pieces."""
import numpy as np
import pytest

import gpscale.shards as shards
from gpscale.shards import load_shard, row_blocks


@pytest.fixture
def table():
    rng = np.random.default_rng(0)
    return rng.normal(size=(23, 3)), rng.normal(size=23), rng.integers(0, 9, size=(23, 2, 2))


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_blocks_of_an_npz_concatenate_to_its_arrays(tmp_path, table, save, world_size, monkeypatch):
    monkeypatch.setattr(shards, "_CHUNK_BYTES", 40)  # skip the rows before a block in several pieces
    X, y, images = table
    save(tmp_path / "data.npz", X=X, y=y, images=images)
    blocks = [load_shard(tmp_path / "data.npz", rank, world_size, keys=("X", "y", "images"))
              for rank in range(world_size)]
    assert [len(b[0]) for b in blocks] == np.diff(row_blocks(23, world_size)).tolist()
    for got, expected in zip(zip(*blocks), table):
        np.testing.assert_array_equal(np.concatenate(got), expected)
        assert np.concatenate(got).dtype == expected.dtype


def test_a_directory_is_one_table_in_file_order(tmp_path, table):
    X, y, _ = table
    np.savez_compressed(tmp_path / "b.npz", X=X[15:], y=y[15:])
    np.savez(tmp_path / "a.npz", X=X[:15], y=y[:15])
    (tmp_path / "notes.txt").write_text("ignored")
    blocks = [load_shard(tmp_path, rank, 3) for rank in range(3)]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), X)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)


def test_npy_files_are_memory_mapped_by_rows(tmp_path, table):
    X = table[0]
    np.save(tmp_path / "X.npy", X)
    (block,) = load_shard(tmp_path / "X.npy", 1, 2, keys=("X",))
    np.testing.assert_array_equal(block, X[12:])


def test_more_ranks_than_rows_gives_empty_blocks(tmp_path, table):
    np.savez(tmp_path / "d.npz", X=table[0][:2], y=table[1][:2])
    X, y = load_shard(tmp_path / "d.npz", 0, 4)
    assert X.shape == (0, 3) and y.shape == (0,)


def test_bad_input_is_named(tmp_path, table):
    X, y, _ = table
    np.savez(tmp_path / "d.npz", X=X, y=y[:5])
    with pytest.raises(ValueError, match="different numbers of rows"):
        load_shard(tmp_path / "d.npz", 0, 2)
    with pytest.raises(KeyError, match="no array 'Z'; it holds X, y"):
        load_shard(tmp_path / "d.npz", 0, 2, keys=("Z",))
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        load_shard(tmp_path / "d.npz", 2, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .npz or .npy"):
        load_shard(tmp_path / "empty", 0, 1)
