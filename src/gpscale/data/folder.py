"""The data folder: where it is, which file a data-set name means, and the named arrays a file holds."""
from __future__ import annotations

import contextlib
import gzip
import math
import os
import re
from pathlib import Path

import numpy as np

from .uci import UCI_SIZES

KINDS = ("uci", "uci_pbp", "pmlb", "md", "geo", "images")
# Short names of single files; the first name of each file is the one listed.
ALIASES = {"etopo": "geo/etopo2022_healpix128", "elevation": "geo/etopo2022_healpix128", "mnist5k": "images/mnist5k",
            "fashion_mnist": "images/fashion_mnist", "fmnist": "images/fashion_mnist"}
# where Debian's dataset-fashion-mnist package installs the IDX files, read when the data folder lacks the npz
FASHION_MNIST_PACKAGE = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_IDX = {"train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
                     "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}


def data_dir(explicit=None) -> Path | None:
    """The data folder: ``explicit`` if given, else ``$GPSCALE_DATA`` if set, else None."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("GPSCALE_DATA")
    return Path(env) if env else None


def locate(name: str, root: Path | None) -> tuple[str, Path]:
    """Map a data-set name to (kind, path of its npz file), or raise FileNotFoundError saying where it looked."""
    if ALIASES.get(name) == ALIASES["fashion_mnist"] and (root is None or not root.is_dir()) \
            and _holds_fashion_mnist_idx(FASHION_MNIST_PACKAGE):
        return "images", FASHION_MNIST_PACKAGE
    if root is None:
        raise FileNotFoundError(f"data set {name!r} needs a data folder and none is set: "
                                + _how_to_fix(name))
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {root} does not exist (looked for data set {name!r}): "
                                + _how_to_fix(name))
    name = ALIASES.get(name, name)
    if "/" in name:
        kind, stem = name.split("/", 1)
        if kind not in KINDS:
            raise ValueError(f"unknown data folder {kind!r} in {name!r}; expected one of {KINDS}.")
        candidates = [(kind, root / kind / f"{stem}.npz")]
    else:
        mol = name.removeprefix("rmd17_")
        candidates = [("uci", root / "uci" / f"{name}.npz"), ("md", root / "md" / f"rmd17_{mol}.npz"),
                      ("pmlb", root / "pmlb" / f"{name}.npz"), ("pmlb", _pmlb_short_name(root, name))]
    if name == ALIASES["fashion_mnist"]:  # else from the Debian package's files
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
    if ALIASES.get(name, name) == ALIASES["fashion_mnist"]:
        hint += (" Fashion-MNIST also comes from Debian's package: `apt-get install dataset-fashion-mnist` installs "
                 f"its IDX files in {FASHION_MNIST_PACKAGE}, which gpscale reads when the data folder lacks "
                 "images/fashion_mnist.npz.")
    return hint


def canonical_name(kind: str, path: Path) -> str:
    """The name list_datasets shows for a file: its stem for uci/pmlb/md, else an alias or ``<folder>/<stem>``."""
    if kind in ("uci", "pmlb", "md"):
        return path.stem
    key = f"{kind}/{path.stem}"
    return next((alias for alias, target in ALIASES.items() if target == key), key)


@contextlib.contextmanager
def arrays(path: Path):
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
