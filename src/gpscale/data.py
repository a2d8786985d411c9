"""Benchmark data: loaders for the npz layout of the data folder, split protocols, standardisation,
generated data sets and the UCI download.

The data folder (``data_dir=`` / ``--data-dir``, else ``$GPSCALE_DATA``) holds

=====================  ==========================================  ======================================
file                   arrays                                      splits
=====================  ==========================================  ======================================
uci/<name>.npz         X [n, d], y [n], test_fold [n]              10 fixed folds: test = test_fold == k
uci_pbp/<name>.npz     X [n, d], y [n], train_idx/test_idx [S, .]  S fixed splits (rows of the index arrays)
pmlb/<id>_<name>.npz   X [n, d], y [n]                             seeded random 90/10
md/rmd17_<mol>.npz     R [n, A, 3], E [n], train_idx/test_idx      5 fixed splits; X = R flattened [n, 3A]
                                                                   (or 1 / pairwise distances [n, A(A-1)/2])
geo/etopo2022_...npz   lat, lon (degrees), elev_mean [n]           seeded random 90/10; X = unit vectors
images/mnist5k.npz     images [n, 28, 28] uint8, labels [n]        seeded random 90/10; X = pixels / 255
images/fashion_mnist   train_images [60000, 28, 28] uint8,         the official 60,000 / 10,000 (split 0);
 .npz                  train_labels, test_images, test_labels      X = pixels / 255
=====================  ==========================================  ======================================

Names: a UCI name (``pol``), a PMLB file name with or without its number (``564_fried`` or ``fried``),
``rmd17_aspirin`` or ``aspirin``, ``etopo`` / ``elevation``, ``mnist5k``, ``fashion_mnist`` / ``fmnist``, or
``<folder>/<file stem>`` for any file (``uci_pbp/boston``). Fashion-MNIST is also read from Debian's
``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``: its four IDX files under
/usr/share/datasets/fashion-mnist) when the data folder does not hold it. ``friedman1``, ``friedman1_d11``,
``gp_sample`` and ``matern32_d1`` / ``_d5`` / ``_d10`` are generated and need no data folder.

``load_dataset(..., random_split=True)`` replaces a file's fixed splits by a seeded random one, and
``x_scaling='minmax'`` maps the inputs to [-1, 1] instead of z-scoring them (both for protocols of papers that
did so, e.g. the Deep Basis Kernel paper's random 70/10/20 splits of [-1, 1]-scaled UCI sets).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import re
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from .io import write_atomically
from .scaling import SCALINGS, fit_scaling

UCI_BASE_URL = "https://raw.githubusercontent.com/treforevans/uci_datasets/master/uci_datasets"

# (n, d) of every set in the upstream UCI collection (treforevans/uci_datasets), for listings and error hints.
UCI_SIZES = {
    "3droad": (434874, 3), "airfoil": (1503, 5), "autompg": (392, 7), "autos": (159, 25), "bike": (17379, 17),
    "breastcancer": (194, 33), "buzz": (583250, 77), "challenger": (23, 4), "concrete": (1030, 8),
    "concreteslump": (103, 7), "elevators": (16599, 18), "energy": (768, 8), "fertility": (100, 9),
    "forest": (517, 12), "gas": (2565, 128), "houseelectric": (2049280, 11), "housing": (506, 13),
    "keggdirected": (48827, 20), "keggundirected": (63608, 27), "kin40k": (40000, 8), "machine": (209, 7),
    "parkinsons": (5875, 20), "pendulum": (630, 9), "pol": (15000, 26), "protein": (45730, 9),
    "pumadyn32nm": (8192, 32), "servo": (167, 4), "skillcraft": (3338, 19), "slice": (53500, 385),
    "sml": (4137, 26), "solar": (1066, 10), "song": (515345, 90), "stock": (536, 11),
    "tamielectric": (45781, 3), "wine": (1599, 11), "yacht": (308, 6),
}
UCI_N_SPLITS = 10
MOLECULE_FEATURES = ("cartesian", "inverse_distances")
IMAGE_TRANSFORMS = ("roll", "flip")
KINDS = ("uci", "uci_pbp", "pmlb", "md", "geo", "images")
GENERATED = {"friedman1": 10, "friedman1_d11": 11, "gp_sample": 2,
             "matern32_d1": 1, "matern32_d5": 5, "matern32_d10": 10}  # name -> d
DEFAULT_N_GENERATED = 40_000
# Short names of single files; the first name of each file is the one listed.
_ALIASES = {"etopo": "geo/etopo2022_healpix128", "elevation": "geo/etopo2022_healpix128", "mnist5k": "images/mnist5k",
            "fashion_mnist": "images/fashion_mnist", "fmnist": "images/fashion_mnist"}
# where Debian's dataset-fashion-mnist package installs the IDX files, read when the data folder lacks the npz
FASHION_MNIST_PACKAGE = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_IDX = {"train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
                     "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}
_UNSTANDARDISED_X = ("geo", "images")  # inputs already on a natural scale (unit vectors, pixel intensities)


@dataclass
class Dataset:
    """A train/test split, scaled with training statistics.

    ``X_train`` [n, d], ``y_train`` [n], ``X_test`` [n*, d], ``y_test`` [n*] are float64 and scaled:
    X = (X_raw - x_mean) / x_std and y = (y_raw - y_mean) / y_std, with ``x_mean``, ``x_std`` [d] and the scalars
    ``y_mean``, ``y_std`` computed on the training rows only (a zero std is replaced by 1, so constant columns
    become 0). With ``x_scaling='minmax'`` (see :func:`load_dataset`) ``x_mean`` and ``x_std`` are instead the
    training midrange and half-range of each column, so that the training inputs span [-1, 1]; with ``'none'``
    they are 0 and 1. Multiply an RMSE by ``y_std`` to report it in original units. ``source`` is the file read,
    or ``"generated"``.
    """

    name: str
    X_train: np.ndarray = field(repr=False)
    y_train: np.ndarray = field(repr=False)
    X_test: np.ndarray = field(repr=False)
    y_test: np.ndarray = field(repr=False)
    x_mean: np.ndarray = field(repr=False)
    x_std: np.ndarray = field(repr=False)
    y_mean: float
    y_std: float
    split: int
    source: str
    x_scaling: str = "standard"  # how X was scaled (gpscale.scaling.SCALINGS)
    standardize_y: bool = True
    kind: str = "generated"  # the file's kind ("uci", "geo", "images", ...), which decides the default x_scaling

    def rescaled(self, x_scaling: str | None = None, standardize_y: bool = True) -> Dataset:
        """This split, held unscaled (``x_scaling='none'``, ``standardize_y=False``), scaled with its training
        statistics as :func:`load_dataset` scales it (``x_scaling=None``: the kind's default), to the bit."""
        if self.x_scaling != "none" or self.standardize_y:
            raise ValueError(f"{self.name} is scaled already (x_scaling={self.x_scaling!r}, standardize_y="
                             f"{self.standardize_y}); load it with x_scaling='none', standardize_y=False to rescale.")
        if x_scaling is None:
            x_scaling = "none" if self.kind in _UNSTANDARDISED_X else "standard"
        x = fit_scaling(self.X_train, x_scaling)
        y = fit_scaling(self.y_train, "standard" if standardize_y else "none")
        return Dataset(self.name, x.apply(self.X_train), y.apply(self.y_train), x.apply(self.X_test),
                       y.apply(self.y_test), x.shift, x.scale, float(y.shift), float(y.scale), self.split, self.source,
                       x_scaling, standardize_y, self.kind)

    @property
    def n_train(self) -> int:
        return self.X_train.shape[0]

    @property
    def n_test(self) -> int:
        return self.X_test.shape[0]

    @property
    def d(self) -> int:
        return self.X_train.shape[1]


def data_dir(explicit=None) -> Path | None:
    """The data folder: ``explicit`` if given, else ``$GPSCALE_DATA`` if set, else None."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("GPSCALE_DATA")
    return Path(env) if env else None


_data_dir = data_dir  # load_dataset and list_datasets take a keyword of the same name


# ----------------------------------------------------------------------------------------------------- generated


def make_friedman1(n: int, rng=None, noise_std: float = 1.0, d: int = 10):
    """Friedman #1: x ~ U[0, 1]^d, y = 10 sin(pi x1 x2) + 20 (x3 - 0.5)^2 + 10 x4 + 5 x5 + noise_std * eps.

    ``rng``: a numpy Generator or seed. Returns (X [n, d], y [n]); x6..xd are irrelevant inputs (d >= 5; the
    classic set has d = 10, ``friedman1_d11`` has d = 11, the size of GP-GRIEF's electric set).
    """
    if d < 5:
        raise ValueError(f"Friedman #1 needs d >= 5 inputs, got d={d}.")
    rng = np.random.default_rng(rng)
    X = rng.uniform(size=(n, d))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    return X, f + noise_std * rng.standard_normal(n)


def make_gp_sample(n: int, rng=None, d: int = 2, lengthscale: float = 0.3, noise_std: float = 0.1,
                   n_features: int = 2000, chunk: int = 8192, nu: float | None = None):
    """A draw from a zero-mean GP with a unit-variance stationary kernel on x ~ U[0, 1]^d, plus Gaussian noise:
    the RBF k(x, x') = exp(-|x - x'|^2 / (2 l^2)) (``nu=None``) or the isotropic Matérn-nu of lengthscale l.

    The draw uses F = ``n_features`` random Fourier features, f(x) = sqrt(2 / F) sum_j w_j cos(omega_j.x + b_j)
    with b_j ~ U[0, 2 pi], w_j ~ N(0, 1) and omega_j from the kernel's spectral density: N(0, I / l^2) for the
    RBF, a multivariate t with 2 nu degrees of freedom for the Matérn (omega = g / l sqrt(2 nu / u), g ~ N(0, I),
    u ~ chi^2_{2 nu}); the covariance tends to k as F grows. Cost O(n F d), memory O(chunk F).
    Returns (X [n, d], y [n]).
    """
    rng = np.random.default_rng(rng)
    X = rng.uniform(size=(n, d))
    omega = spectral_frequencies(rng, d, n_features, lengthscale, nu)  # [d, F]
    b = rng.uniform(0, 2 * np.pi, n_features)  # [F]
    w = rng.standard_normal(n_features) * np.sqrt(2 / n_features)  # [F]
    f = np.concatenate([np.cos(X[i:i + chunk] @ omega + b) @ w for i in range(0, n, chunk)])
    return X, f + noise_std * rng.standard_normal(n)


def spectral_frequencies(rng: np.random.Generator, d: int, n: int, lengthscale: float,
                         nu: float | None = None) -> np.ndarray:
    """n draws [d, n] from the spectral density of the unit-variance RBF (``nu=None``) or Matérn-nu kernel of
    lengthscale l, so that mean_j cos(omega_j . r) -> k(r) (Bochner)."""
    omega = rng.standard_normal((d, n)) / lengthscale
    if nu is not None:
        omega *= np.sqrt(2 * nu / rng.chisquare(2 * nu, n))
    return omega


# The ODVFF paper's synthetic sets (Azzimonti et al., Section 5.1): an isotropic Matérn-3/2 draw, l = 0.1, unit
# variance, noise std 0.2 (the paper's text reads "variance 0.2", but its 1-D RMSE of 0.21 and log-likelihood above
# 0.1 are only reachable with std 0.2), in d = 1, 5 and 10 dimensions.
_MATERN_SAMPLES = {f"matern32_d{d}": partial(make_gp_sample, d=d, lengthscale=0.1, noise_std=0.2, nu=1.5)
                   for d in (1, 5, 10)}

_GENERATORS = {"friedman1": make_friedman1, "friedman1_d11": partial(make_friedman1, d=11),
               "gp_sample": make_gp_sample, **_MATERN_SAMPLES}


# ------------------------------------------------------------------------------------------------------ loading


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
            synthetic draws, where one draw's sample std is far from the kernel's: 0.60 for the 1-D draw of split
            0, so a z-scored RMSE would read 0.34 where the noise alone gives 0.20).
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
    if n is not None and name not in _GENERATORS:
        raise ValueError(f"n= sets the size of a generated set ({sorted(_GENERATORS)}), not of {name!r}; "
                         "use max_train= to subsample.")
    if molecule_features not in MOLECULE_FEATURES:
        raise ValueError(f"molecule_features must be one of {MOLECULE_FEATURES}, got {molecule_features!r}.")
    if image_transform is not None and image_transform not in IMAGE_TRANSFORMS:
        raise ValueError(f"image_transform must be one of {IMAGE_TRANSFORMS} or None, got {image_transform!r}.")
    if x_scaling is not None and x_scaling not in SCALINGS:
        raise ValueError(f"x_scaling must be one of {SCALINGS} or None, got {x_scaling!r}.")
    rng = np.random.default_rng([seed, split])
    if name in _GENERATORS and image_transform is not None:
        raise ValueError(f"image_transform applies to image sets only, not to the generated {name!r}.")
    if name in _GENERATORS:
        X, y = _GENERATORS[name](DEFAULT_N_GENERATED if n is None else n, rng)
        kind, source = "generated", "generated"
        train, test = _random_split(len(y), test_fraction, rng)
    else:
        kind, path = _locate(name, _data_dir(data_dir))
        name, source = _canonical_name(kind, path), str(path)
        if molecule_features != "cartesian" and kind != "md":
            raise ValueError(f"molecule_features applies to rMD17 sets only, not to {name!r} ({kind}).")
        if image_transform is not None and kind != "images":
            raise ValueError(f"image_transform applies to image sets only, not to {name!r} ({kind}).")
        with _arrays(path) as z:
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


def _locate(name: str, root: Path | None) -> tuple[str, Path]:
    """Map a data-set name to (kind, path of its npz file), or raise FileNotFoundError saying where it looked."""
    if _ALIASES.get(name) == _ALIASES["fashion_mnist"] and (root is None or not root.is_dir()) \
            and _holds_fashion_mnist_idx(FASHION_MNIST_PACKAGE):
        return "images", FASHION_MNIST_PACKAGE
    if root is None:
        raise FileNotFoundError(f"data set {name!r} needs a data folder and none is set: "
                                + _how_to_fix(name))
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {root} does not exist (looked for data set {name!r}): "
                                + _how_to_fix(name))
    name = _ALIASES.get(name, name)
    if "/" in name:
        kind, stem = name.split("/", 1)
        if kind not in KINDS:
            raise ValueError(f"unknown data folder {kind!r} in {name!r}; expected one of {KINDS}.")
        candidates = [(kind, root / kind / f"{stem}.npz")]
    else:
        mol = name.removeprefix("rmd17_")
        candidates = [("uci", root / "uci" / f"{name}.npz"), ("md", root / "md" / f"rmd17_{mol}.npz"),
                      ("pmlb", root / "pmlb" / f"{name}.npz"), ("pmlb", _pmlb_short_name(root, name))]
    if name == _ALIASES["fashion_mnist"]:  # else from the Debian package's files
        candidates.append(("images", FASHION_MNIST_PACKAGE))
    for kind, path in candidates:
        if path.is_file() or (path == FASHION_MNIST_PACKAGE and _holds_fashion_mnist_idx(path)):
            return kind, path
    looked = ", ".join(str(path) for _, path in candidates)
    raise FileNotFoundError(f"no file for data set {name!r}; looked for {looked}. " + _how_to_fix(name))


def _pmlb_short_name(root: Path, name: str) -> Path:
    """The PMLB file ``<id>_<name>.npz``; a placeholder path naming the pattern when there is none."""
    pattern = rf"\d+_{re.escape(name)}"
    matches = sorted(p for p in (root / "pmlb").glob(f"*_{name}.npz") if re.fullmatch(pattern, p.stem))
    if len(matches) > 1:
        raise ValueError(f"{name!r} matches several PMLB files {[p.stem for p in matches]}; use the full name.")
    return matches[0] if matches else root / "pmlb" / f"<id>_{name}.npz"


def _how_to_fix(name: str) -> str:
    hint = ("pass data_dir= (CLI: --data-dir) or set GPSCALE_DATA to the folder holding uci/, pmlb/, md/, ...; "
            "gpscale.data.list_datasets() shows what is there.")
    if name in UCI_SIZES:
        hint += f" UCI sets can be fetched with `gpscale data download {name}` (writes <data folder>/uci/{name}.npz)."
    if _ALIASES.get(name, name) == _ALIASES["fashion_mnist"]:
        hint += (" Fashion-MNIST also comes from Debian's package: `apt-get install dataset-fashion-mnist` installs "
                 f"its IDX files in {FASHION_MNIST_PACKAGE}, which gpscale reads when the data folder lacks "
                 "images/fashion_mnist.npz.")
    return hint


def _canonical_name(kind: str, path: Path) -> str:
    """The name list_datasets shows for a file: its stem for uci/pmlb/md, else an alias or ``<folder>/<stem>``."""
    if kind in ("uci", "pmlb", "md"):
        return path.stem
    key = f"{kind}/{path.stem}"
    return next((alias for alias, target in _ALIASES.items() if target == key), key)


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


@contextlib.contextmanager
def _arrays(path: Path):
    """The named arrays of an npz file, or of the Fashion-MNIST IDX files in a folder (Debian's package)."""
    if path.is_dir():
        yield {key: _read_idx(path / file) for key, file in FASHION_MNIST_IDX.items()}
        return
    with np.load(path) as z:
        yield z


def _holds_fashion_mnist_idx(folder: Path) -> bool:
    return all((folder / file).is_file() for file in FASHION_MNIST_IDX.values())


def _read_idx(path: Path) -> np.ndarray:
    """An array from a gzipped IDX file (the MNIST format): two zero bytes, a type code (8: unsigned bytes), the
    number of dimensions, each size as a big-endian int32, then the values."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes; reinstall dataset-fashion-mnist.")
    ndim = data[3]
    shape = tuple(int(v) for v in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if values.size != math.prod(shape):
        raise ValueError(f"{path} holds {values.size} values for the shape {shape}; reinstall dataset-fashion-mnist.")
    return values.reshape(shape)


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


# ------------------------------------------------------------------------------------------------------ listing


def list_datasets(data_dir=None) -> list[dict]:
    """Every data set in the data folder, every upstream UCI set (``available=False`` until downloaded) and
    the generated sets, as dicts {name, kind, n, d, splits, available}.

    ``splits`` is the number of fixed splits, or None for seeded random splits (any split >= 0).
    Shapes are read from the npz headers, without loading the arrays.
    """
    root = _data_dir(data_dir)
    entries = []
    for kind in (KINDS if root is not None else ()):
        for path in sorted((root / kind).glob("*.npz")):
            entries.append({"name": _canonical_name(kind, path), "kind": kind, **_file_info(kind, path),
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


# ----------------------------------------------------------------------------------------------------- download


def download_uci(name: str, dest_dir, base_url: str = UCI_BASE_URL, timeout: float = 60) -> Path:
    """Fetch a UCI set from treforevans/uci_datasets and write ``dest_dir/uci/<name>.npz``.

    Upstream files: ``<base_url>/<name>/data.csv.gz`` (no header; numeric columns, the last one is y) and
    ``<base_url>/<name>/test_mask.csv.gz`` ([n, 10] of 0/1 or True/False; column k marks split k's test rows).
    Writes X float32 [n, d], y float32 [n], test_fold int8 [n] (the one split each row is a test row of),
    atomically. Returns the path written.

    Raises:
        RuntimeError: the download failed or the content is malformed (the message names the URL).
        OSError: the file could not be written (the message names it and what to do).
    """
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"invalid UCI data-set name {name!r}; known names: {sorted(UCI_SIZES)}.")
    data_url, mask_url = (f"{base_url.rstrip('/')}/{name}/{file}" for file in ("data.csv.gz", "test_mask.csv.gz"))
    data = _parse_csv(_fetch_gz(data_url, timeout), data_url, np.float64)
    mask = _parse_bool(_parse_csv(_fetch_gz(mask_url, timeout), mask_url, str), mask_url)
    if data.shape[1] < 2 or not np.isfinite(data).all():
        raise RuntimeError(f"{data_url}: expected finite numeric columns (features then target), got shape "
                           f"{data.shape}.")
    if mask.shape != (data.shape[0], UCI_N_SPLITS):
        raise RuntimeError(f"{mask_url}: expected a test mask of shape {(data.shape[0], UCI_N_SPLITS)}, "
                           f"got {mask.shape}.")
    if not (mask.sum(axis=1) == 1).all():
        raise RuntimeError(f"{mask_url}: every row must be a test row of exactly one split; "
                           f"{int((mask.sum(axis=1) != 1).sum())} rows are not.")
    dest = Path(dest_dir) / "uci" / f"{name}.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(dest, lambda f: np.savez_compressed(f, X=data[:, :-1].astype(np.float32),
                                                         y=data[:, -1].astype(np.float32),
                                                         test_fold=mask.argmax(axis=1).astype(np.int8)))
    return dest


def _fetch_gz(url: str, timeout: float) -> str:
    """Download a gzip file and return its text."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            raw = response.read()
    except OSError as err:  # HTTPError, URLError and timeouts are all OSErrors
        raise RuntimeError(f"could not download {url}: {err}. Check the name and your connection, or pass "
                           "another base_url.") from err
    try:
        return gzip.decompress(raw).decode("ascii")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise RuntimeError(f"{url} is not a gzip-compressed text file: {err}.") from err


def _parse_csv(text: str, url: str, dtype) -> np.ndarray:
    """A comma-separated table without header as a 2-D array of ``dtype``."""
    try:
        table = np.loadtxt(io.StringIO(text), delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as err:
        raise RuntimeError(f"{url}: malformed CSV ({err}).") from err
    if table.shape[0] == 0:
        raise RuntimeError(f"{url}: the table is empty.")
    return table


def _parse_bool(cells: np.ndarray, url: str) -> np.ndarray:
    """Cells 1/0 or True/False (any case) as a bool array."""
    cells = np.char.lower(np.char.strip(cells))
    true, false = np.isin(cells, ("1", "1.0", "true")), np.isin(cells, ("0", "0.0", "false"))
    if not (true | false).all():
        raise RuntimeError(f"{url}: test-mask cells must be 0/1 or True/False, got e.g. {cells[~(true | false)][0]!r}.")
    return true
