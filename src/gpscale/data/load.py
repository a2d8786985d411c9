"""Loading one train/test split of a data set: its inputs and targets, the split protocol and the scaling."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..scaling import SCALINGS
from .dataset import Dataset
from .folder import arrays, canonical_name, locate
from .folder import data_dir as resolve_data_dir
from .generated import DEFAULT_N_GENERATED, GENERATORS
from .uci import UCI_N_SPLITS

MOLECULE_FEATURES = ("cartesian", "inverse_distances")
IMAGE_TRANSFORMS = ("roll", "flip")


def load_dataset(name: str, split: int = 0, data_dir: str | Path | None = None, seed: int = 0,
                 test_fraction: float = 0.1, max_train: int | None = None, n: int | None = None,
                 molecule_features: str = "cartesian", random_split: bool = False,
                 x_scaling: str | None = None, standardize_y: bool = True,
                 image_transform: str | None = None) -> Dataset:
    """Load one train/test split of a data set, scaled with training statistics.

    Args:
        name: see the module docstring (``pol``, ``fried``, ``aspirin``, ``etopo``, ``friedman1``, ...).
        split: fixed split index (UCI 0..9, rMD17 0..4), else the seed of a random split (any int >= 0).
        data_dir: data folder; default ``$GPSCALE_DATA``. Not needed for generated sets.
        seed: with ``split``, seeds random splits, generated data and the ``max_train`` subset.
        test_fraction: test share of random splits (ignored by fixed splits).
        max_train: keep a random subset of this many training points (quick runs); statistics use the subset.
        n: number of points of a generated set (default 40,000).
        molecule_features: inputs of an rMD17 set: ``'cartesian'`` (the flattened coordinates, as the SoftKI
            paper's MD22 experiments) or ``'inverse_distances'`` (1 / r_ij for every atom pair: invariant to
            rotations and translations of the molecule, which an RBF on raw coordinates is not).
        random_split: draw a random split (seeded by ``seed`` and ``split``, test share ``test_fraction``) even
            for a file with fixed splits (UCI folds, uci_pbp, rMD17), for papers that draw their own splits;
            ``split`` is then any int >= 0.
        x_scaling: ``'standard'`` (z-score each input column; the default), ``'minmax'`` (map each column
            affinely so that the training inputs span [-1, 1]), ``'center'`` (subtract each column's mean: the HKD
            paper's images) or ``'none'``; the default for geo and image sets,
            whose inputs are on a natural scale (unit vectors, pixel intensities), is ``'none'``. Targets are
            z-scored unless ``standardize_y=False``.
        image_transform: for image sets, move every image (train and test) by a random group element, seeded:
            ``'roll'`` rolls it cyclically by offsets drawn uniformly from 0..H-1 and 0..W-1 (the HVGP paper's
            Translate-MNIST), ``'flip'`` flips it up-down and left-right by independent fair coins (Flip-MNIST).
        standardize_y: z-score the targets (default). ``False`` keeps them as they are (``y_mean`` 0, ``y_std``
            1), for protocols whose published numbers are on raw targets of a known scale (the ODVFF paper's
            synthetic draws, where one draw's sample std is far from the kernel's, so that a z-scored RMSE would
            not be on the scale of the noise).
    Raises:
        FileNotFoundError: no data folder or no file for ``name`` (the message says where it looked).
        ValueError: bad split or option, or non-finite values in the file.
    """
    if not (isinstance(split, (int, np.integer)) and split >= 0):
        raise ValueError(f"split must be an int >= 0, got {split!r}.")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
    if max_train is not None and max_train < 1:
        raise ValueError(f"max_train must be >= 1 or None, got {max_train}.")
    if n is not None and name not in GENERATORS:
        raise ValueError(f"n= sets the size of a generated set ({sorted(GENERATORS)}), not of {name!r}; "
                         "use max_train= to subsample.")
    if molecule_features not in MOLECULE_FEATURES:
        raise ValueError(f"molecule_features must be one of {MOLECULE_FEATURES}, got {molecule_features!r}.")
    if image_transform is not None and image_transform not in IMAGE_TRANSFORMS:
        raise ValueError(f"image_transform must be one of {IMAGE_TRANSFORMS} or None, got {image_transform!r}.")
    if x_scaling is not None and x_scaling not in SCALINGS:
        raise ValueError(f"x_scaling must be one of {SCALINGS} or None, got {x_scaling!r}.")
    rng = np.random.default_rng([seed, split])
    if name in GENERATORS and image_transform is not None:
        raise ValueError(f"image_transform applies to image sets only, not to the generated {name!r}.")
    if name in GENERATORS:
        X, y = GENERATORS[name](DEFAULT_N_GENERATED if n is None else n, rng)
        kind, source = "generated", "generated"
        train, test = _random_split(len(y), test_fraction, rng)
    else:
        kind, path = locate(name, resolve_data_dir(data_dir))
        name, source = canonical_name(kind, path), str(path)
        if molecule_features != "cartesian" and kind != "md":
            raise ValueError(f"molecule_features applies to rMD17 sets only, not to {name!r} ({kind}).")
        if image_transform is not None and kind != "images":
            raise ValueError(f"image_transform applies to image sets only, not to {name!r} ({kind}).")
        with arrays(path) as z:
            X, y = _features(kind, z, molecule_features)
            if image_transform is not None:
                moves = np.random.default_rng([seed, split, 2])
                X = _transform_images(X, z["images"].shape[1:], image_transform, moves)
            if not (np.isfinite(X).all() and np.isfinite(y).all()):
                raise ValueError(f"{path} contains non-finite values; re-create or re-download the file.")
            if _has_fixed_split(kind, z) and not random_split:
                train, test = _fixed_split(kind, z, split)
            else:
                train, test = _random_split(len(y), test_fraction, rng)
    X_train, y_train, X_test, y_test = X[train], y[train], X[test], y[test]
    if max_train is not None and max_train < len(y_train):
        keep = np.random.default_rng([seed, split, 1]).choice(len(y_train), max_train, replace=False)
        X_train, y_train = X_train[keep], y_train[keep]
    d = X_train.shape[1]
    raw = Dataset(name, X_train.astype(np.float64), y_train.astype(np.float64), X_test.astype(np.float64),
                  y_test.astype(np.float64), np.zeros(d), np.ones(d), 0.0, 1.0, int(split), source, "none", False, kind)
    return raw.rescaled(x_scaling, standardize_y)


def _features(kind: str, z, molecule_features: str = "cartesian") -> tuple[np.ndarray, np.ndarray]:
    """Inputs X [n, d] and targets y [n] (float64) of one loaded npz file."""
    if kind == "md":
        R = z["R"].astype(np.float64)
        if molecule_features == "inverse_distances":
            i, j = np.triu_indices(R.shape[1], k=1)
            return 1.0 / np.linalg.norm(R[:, i] - R[:, j], axis=-1), z["E"].astype(np.float64)
        return R.reshape(R.shape[0], -1), z["E"].astype(np.float64)
    if kind == "geo":
        lat, lon = np.deg2rad(z["lat"].astype(np.float64)), np.deg2rad(z["lon"].astype(np.float64))
        X = np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)
        return X, z["elev_mean"].astype(np.float64)
    if kind == "images":
        if "train_images" in z:  # an official train/test split: the training rows first
            images = np.concatenate([z["train_images"], z["test_images"]])
            labels = np.concatenate([z["train_labels"], z["test_labels"]])
        else:
            images, labels = z["images"], z["labels"]
        return images.reshape(images.shape[0], -1) / 255.0, labels.astype(np.float64)
    return z["X"].astype(np.float64), z["y"].astype(np.float64)


def _has_fixed_split(kind: str, z) -> bool:
    """Whether the file's own splits are used: UCI folds, uci_pbp and rMD17 index rows, an image set's official
    train/test split."""
    return kind in ("uci", "uci_pbp", "md") or (kind == "images" and "train_images" in z)


def _transform_images(X: np.ndarray, shape: tuple[int, int], transform: str, rng: np.random.Generator) -> np.ndarray:
    """Each flattened image of X [n, H W] rolled by random offsets, or flipped by random coins (see load_dataset)."""
    images = X.reshape(-1, *shape).copy()
    n, H, W = images.shape
    if transform == "roll":
        rows, cols = rng.integers(0, H, n), rng.integers(0, W, n)
        for i in range(n):
            images[i] = np.roll(images[i], (rows[i], cols[i]), axis=(0, 1))
    else:
        up_down, left_right = rng.random(n) < 0.5, rng.random(n) < 0.5
        images[up_down] = images[up_down, ::-1]
        images[left_right] = images[left_right, :, ::-1]
    return images.reshape(n, H * W)


def _fixed_split(kind: str, z, split: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row selections of fixed split ``split``: UCI test folds, train_idx/test_idx rows, or an image
    set's one official split (its training rows first)."""
    if kind == "images":
        if split != 0:
            raise ValueError(f"split must be 0 for this image set's official train/test split, got {split}; pass "
                             "random_split=True for a seeded random split.")
        n_train = len(z["train_labels"])
        return np.arange(n_train), np.arange(n_train, n_train + len(z["test_labels"]))
    n_splits = UCI_N_SPLITS if kind == "uci" else z["train_idx"].shape[0]
    if split >= n_splits:
        raise ValueError(f"split must be in 0..{n_splits - 1} for this {kind} data set, got {split}.")
    if kind == "uci":
        test = z["test_fold"] == split
        return ~test, test
    return z["train_idx"][split], z["test_idx"][split]


def _random_split(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of a random permutation, with round(test_fraction * n) >= 1 test points."""
    perm = rng.permutation(n)
    n_test = max(1, round(test_fraction * n))
    return perm[n_test:], perm[:n_test]
