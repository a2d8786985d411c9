"""The UCI regression sets of treforevans/uci_datasets: their sizes, and their download into the data folder."""
from __future__ import annotations

import gzip
import io
import re
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from ..io import write_atomically

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
