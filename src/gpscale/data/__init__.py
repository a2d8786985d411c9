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
from .dataset import Dataset
from .folder import FASHION_MNIST_IDX, FASHION_MNIST_PACKAGE, KINDS, data_dir
from .generated import DEFAULT_N_GENERATED, GENERATED, make_friedman1, make_gp_sample, spectral_frequencies
from .listing import list_datasets
from .load import IMAGE_TRANSFORMS, MOLECULE_FEATURES, load_dataset
from .uci import UCI_BASE_URL, UCI_N_SPLITS, UCI_SIZES, download_uci

__all__ = ["Dataset", "load_dataset", "list_datasets", "data_dir", "download_uci", "make_friedman1", "make_gp_sample",
           "spectral_frequencies", "GENERATED", "DEFAULT_N_GENERATED", "KINDS", "MOLECULE_FEATURES",
           "IMAGE_TRANSFORMS", "FASHION_MNIST_PACKAGE", "FASHION_MNIST_IDX", "UCI_BASE_URL", "UCI_SIZES",
           "UCI_N_SPLITS"]
