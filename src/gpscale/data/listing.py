"""What the data folder holds, with every upstream UCI set and the generated sets, read from the file headers."""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .folder import KINDS, canonical_name
from .folder import data_dir as resolve_data_dir
from .generated import DEFAULT_N_GENERATED, GENERATED
from .uci import UCI_N_SPLITS, UCI_SIZES


def list_datasets(data_dir=None) -> list[dict]:
    """Every data set in the data folder, every upstream UCI set (``available=False`` until downloaded) and
    the generated sets, as dicts {name, kind, n, d, splits, available}.

    ``splits`` is the number of fixed splits, or None for seeded random splits (any split >= 0).
    Shapes are read from the npz headers, without loading the arrays.
    """
    root = resolve_data_dir(data_dir)
    entries = []
    for kind in (KINDS if root is not None else ()):
        for path in sorted((root / kind).glob("*.npz")):
            entries.append({"name": canonical_name(kind, path), "kind": kind, **_file_info(kind, path),
                            "available": True})
    present = {e["name"] for e in entries if e["kind"] == "uci"}
    entries += [{"name": name, "kind": "uci", "n": n, "d": d, "splits": UCI_N_SPLITS, "available": False}
                for name, (n, d) in UCI_SIZES.items() if name not in present]
    entries += [{"name": name, "kind": "generated", "n": DEFAULT_N_GENERATED, "d": d, "splits": None,
                 "available": True} for name, d in GENERATED.items()]
    return entries


def _file_info(kind: str, path: Path) -> dict:
    """n, d and splits of one file, from its array headers."""
    shapes = _npz_shapes(path)
    if kind == "md":
        n, atoms, _ = shapes["R"]
        return {"n": n, "d": 3 * atoms, "splits": shapes["train_idx"][0]}
    if kind == "geo":
        return {"n": shapes["lat"][0], "d": 3, "splits": None}
    if kind == "images":
        if "train_images" in shapes:  # an official train/test split
            n_train, *pixels = shapes["train_images"]
            return {"n": n_train + shapes["test_images"][0], "d": int(np.prod(pixels)), "splits": 1}
        n, *pixels = shapes["images"]
        return {"n": n, "d": int(np.prod(pixels)), "splits": None}
    n, d = shapes["X"]
    splits = UCI_N_SPLITS if kind == "uci" else shapes["train_idx"][0] if kind == "uci_pbp" else None
    return {"n": n, "d": d, "splits": splits}


def _npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{array name: shape} of an npz file, read from the .npy headers only."""
    shapes = {}
    with zipfile.ZipFile(path) as zf:
        for member in zf.namelist():
            with zf.open(member) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shapes[member.removesuffix(".npy")] = read_header(f)[0]
    return shapes
