"""Data sources, transforms and the grain pipeline."""

import logging

import numpy as np
import pytest
from PIL import Image

from vit.data import Augment, eval_batches, open_source, train_iterator
from vit.data import transforms as T
from vit.errors import DataError
from vit.preprocess import Preprocessing, normalize

pytestmark = pytest.mark.timeout(120)

PRE8 = Preprocessing(size=(8, 8), mean=(0.5,) * 3, std=(0.5,) * 3)


def test_digits_splits_are_fixed_stratified_and_disjoint():
    from sklearn.datasets import load_digits

    splits = {s: open_source("digits", s) for s in ("train", "validation", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 1293, "validation": 144,
                                                      "test": 360}
    raw = load_digits()
    first = splits["test"][0]
    assert first["image"].shape == (8, 8, 3) and first["image"].dtype == np.uint8
    # Each image is one of the originals, scaled 0..16 -> 0..255, grey in all three channels.
    matches = np.flatnonzero((np.abs(raw.images * 255 / 16 - first["image"][..., 0]) < 0.51)
                             .all(axis=(1, 2)))
    assert first["label"] in raw.target[matches]
    key = lambda src: {src[i]["image"].tobytes() + bytes([src[i]["label"]])  # noqa: E731
                       for i in range(len(src))}
    train, val, test = (key(splits[s]) for s in ("train", "validation", "test"))
    assert not (test & train) and not (test & val)
    counts = np.bincount([splits["test"][i]["label"] for i in range(360)])
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: ~36 per class
    assert splits["train"].class_names == [str(d) for d in range(10)]


def test_train_iterator_resumes_exactly_and_shuffles_per_epoch():
    src = open_source("digits", "validation")  # 144 images: an epoch is 4.5 batches of 32
    aug = Augment(shift=1.5, rotate=10, scale=0.1, label_smoothing=0.1, mixup=0.2)
    make = lambda: train_iterator(src, PRE8, aug, batch_size=32, seed=3,  # noqa: E731
                                  num_classes=10, num_threads=2)
    it = make()
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    rest = [next(it) for _ in range(6)]
    resumed = make()
    resumed.set_state(state)
    for a, b in zip(rest, [next(resumed) for _ in range(6)], strict=True):
        for k in ("image", "label", "target"):
            np.testing.assert_array_equal(a[k], b[k])
    batch = first[0]
    assert batch["image"].shape == (32, 8, 8, 3) and batch["image"].dtype == np.float32
    np.testing.assert_allclose(batch["target"].sum(1), 1.0, rtol=1e-5)
    # Two epochs' worth of labels: each epoch visits every example once, in a new order.
    plain = train_iterator(src, PRE8, Augment(), batch_size=16, seed=0, num_classes=10)
    labels = np.concatenate([next(plain)["label"] for _ in range(18)])
    want = np.sort([src[i]["label"] for i in range(len(src))])
    np.testing.assert_array_equal(np.sort(labels[:144]), want)
    np.testing.assert_array_equal(np.sort(labels[144:]), want)
    assert not np.array_equal(labels[:144], labels[144:])


def test_eval_batches_match_preprocessing_of_a_png(tmp_path):
    src = open_source("digits", "test")
    batches = list(eval_batches(src, PRE8, batch_size=100))
    assert [b["image"].shape[0] for b in batches] == [100] * 4
    assert sum(b["mask"].sum() for b in batches) == 360
    Image.fromarray(src[5]["image"]).save(tmp_path / "d.png")
    with Image.open(tmp_path / "d.png") as im:
        np.testing.assert_array_equal(PRE8(im), batches[0]["image"][5])


@pytest.mark.parametrize("shard", [(0, 1), (1, 2)])
def test_eval_batches_of_arrays_at_size_equal_the_per_example_transform(shard):
    """In-memory images at the model's size are normalised a batch at a time: every image,
    label and mask equals what `Preprocessing` makes of each example as a PIL image."""
    src = open_source("digits", "test")
    pre = Preprocessing(size=(8, 8), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                        rescale_factor=1 / 127.5)
    from vit.data.pipeline import _as_is_for_eval

    assert _as_is_for_eval(src, pre, None)  # the batch-at-a-time path is the one tested
    index = np.arange(len(src))[shard[0]::shard[1]]
    batches = list(eval_batches(src, pre, batch_size=64, shard_index=shard[0],
                                shard_count=shard[1]))
    assert [len(b["mask"]) for b in batches] == [64] * -(-len(index) // 64)
    images = np.concatenate([b["image"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    assert mask.sum() == len(index) and not mask[len(index):].any()
    want = np.stack([pre(Image.fromarray(src[int(i)]["image"])) for i in index])
    np.testing.assert_array_equal(images[:len(index)], want)
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches])[:len(index)],
                                  [src[int(i)]["label"] for i in index])
    assert not images[len(index):].any()  # padding rows are zeros


def test_eval_batches_match_preprocessing_with_resize_and_crop(tmp_path):
    """The two entry points of `vit.preprocess.resize_crop` (arrays in the pipeline, PIL images
    in predict) agree bit for bit when the geometry does real work."""
    src = open_source("digits", "test")
    pre = Preprocessing(size=(12, 12), crop_pct=0.875, resample="bicubic",
                        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    batch = next(iter(eval_batches(src, pre, batch_size=8)))
    for i in range(8):
        Image.fromarray(src[i]["image"]).save(tmp_path / f"{i}.png")
        with Image.open(tmp_path / f"{i}.png") as im:
            np.testing.assert_array_equal(pre(im), batch["image"][i])
    # Training without inception crop: centre_crop per example, normalize per batch.
    crop = T.center_crop(src[0]["image"], pre.size, pre.crop_pct, pre.resample)
    np.testing.assert_array_equal(normalize(crop, pre.mean, pre.std), batch["image"][0])


def test_affine_is_identity_at_zero_and_shifts_by_whole_pixels():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 8, 8, 3)).astype(np.uint8)
    np.testing.assert_allclose(T.random_affine(x, rng), x)
    shifted = T.random_affine(x, np.random.default_rng(1), shift=3.0)
    assert not np.allclose(shifted, x)
    # Against PIL's affine transform with the same translation (independent implementation).
    class Fixed:  # rng stand-in: a shift of exactly (+1, -2) pixels, no rotation or zoom
        def uniform(self, lo, hi, size):
            return np.array([[1.0], [-2.0]]) if size == (2, 1) else np.zeros(size)
    one = x[:1]
    ours = T.random_affine(one, Fixed(), shift=5.0)[0]
    pil = Image.fromarray(one[0]).transform((8, 8), Image.AFFINE, (1, 0, 2.0, 0, 1, -1.0),
                                            resample=Image.BILINEAR)
    np.testing.assert_allclose(ours, np.asarray(pil), atol=1)


def test_mixup_and_label_smoothing():
    t = T.one_hot(np.array([0, 2]), 4, smoothing=0.2)
    np.testing.assert_allclose(t, [[0.85, 0.05, 0.05, 0.05], [0.05, 0.05, 0.85, 0.05]])
    images = np.stack([np.zeros((4, 4, 3)), np.ones((4, 4, 3))]).astype(np.float32)
    mixed, targets = T.mixup_cutmix(images, T.one_hot(np.array([0, 1]), 2),
                                    np.random.default_rng(0), mixup=1.0)
    lam = targets[0, 0]
    np.testing.assert_allclose(mixed[0], 1 - lam, rtol=1e-5)  # mixes with the reversed batch
    mixed, targets = T.mixup_cutmix(images, T.one_hot(np.array([0, 1]), 2),
                                    np.random.default_rng(0), cutmix=1.0)
    np.testing.assert_allclose(mixed[0].mean(), targets[0, 1], rtol=1e-5)  # area == weight


def test_inception_crop_and_center_crop_shapes():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 60, 3)).astype(np.uint8)
    assert T.inception_crop(x, rng, (16, 16)).shape == (16, 16, 3)
    c = T.center_crop(x, (20, 20), crop_pct=0.5)
    pre = Preprocessing(size=(20, 20), crop_pct=0.5, mean=(0, 0, 0), std=(1, 1, 1))
    np.testing.assert_allclose(c / 255.0, pre(Image.fromarray(x)), atol=1e-6)


def _write_folder(root, bad=0):
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (12, 10, 3)).astype(np.uint8)).save(
                root / c / f"{i}.png")
    for i in range(bad):
        (root / "cat" / f"bad{i}.jpg").write_bytes(b"not an image")


def test_folder_dataset_splits_and_skips_bad_files(tmp_path, caplog):
    _write_folder(tmp_path / "imgs", bad=2)
    train = open_source(str(tmp_path / "imgs"), "train")
    val = open_source(str(tmp_path / "imgs"), "validation")
    assert train.class_names == ["cat", "dog"]
    assert len(train) + len(val) == 12 and len(val) == 2
    with caplog.at_level(logging.WARNING):
        items = [train[i] for i in range(len(train))]
    assert all(it["image"].shape == (12, 10, 3) for it in items)
    assert len(train.bad) == sum("bad" in str(f) for f in train.files)
    if train.bad:
        assert "bad" in caplog.text
    strict = open_source(str(tmp_path / "imgs"), "train", strict=True)
    bad_index = next(i for i, f in enumerate(strict.files) if "bad" in f.name)
    with pytest.raises(DataError, match="not a readable image.*data.strict=false skips"):
        strict[bad_index]


def test_folder_with_split_subfolders(tmp_path):
    _write_folder(tmp_path / "d" / "train")
    _write_folder(tmp_path / "d" / "val")
    assert len(open_source(str(tmp_path / "d"), "validation")) == 10
    with pytest.raises(DataError, match="test"):
        open_source(str(tmp_path / "d"), "test")


def test_tfds_source_reads_array_record_with_split_slicing(tiny_tfds):
    full = open_source("tfds:tiny_shapes", "train", data_dir=str(tiny_tfds))
    half = open_source("tiny_shapes", "train[:50%]", data_dir=str(tiny_tfds))
    assert len(full) == 20 and len(half) == 10 and full.class_names == ["a", "b", "c"]
    seen = sorted(int(full[i]["image"][0, 0, 0]) for i in range(20))
    assert seen == list(range(20))
    item = half[0]
    assert item["image"].shape == (6, 6, 3) and item["label"] == item["image"][0, 0, 0] % 3
    with pytest.raises(DataError, match="bad split"):
        open_source("tfds:tiny_shapes", "nosuch", data_dir=str(tiny_tfds))


def test_missing_tfds_dataset_says_how_to_prepare_it(tmp_path):
    with pytest.raises(DataError) as err:
        open_source("tfds:mnist", "train", data_dir=str(tmp_path))
    msg = str(err.value)
    assert "pip install tensorflow" in msg
    assert "tfds build mnist --file_format=array_record" in msg
    # A name TFDS does not know cannot be built either: the names it knows, or a close one.
    with pytest.raises(DataError, match=r"'no_such_dataset_xyz'.*tfds\.list_builders\(\)"):
        open_source("tfds:no_such_dataset_xyz", "train", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="did you mean 'mnist'"):
        open_source("tfds:mnistt", "train", data_dir=str(tmp_path))


def test_tfds_image_bytes_are_decoded_and_a_bad_record_is_named():
    """An undecoded TFDS Image feature (bytes) decodes as a file does; one that does not is a
    DataError naming the dataset and the record, not PIL's error about a buffer."""
    import io

    from vit.data.sources import TfdsSource

    png = io.BytesIO()
    Image.fromarray(np.full((4, 6), 200, np.uint8)).save(png, format="PNG")  # grayscale
    source = object.__new__(TfdsSource)  # the records only; no TFDS builder needed
    source.name, source.image_key, source.label_key = "tfds:x:train", "image", "label"
    source.source = [{"image": png.getvalue(), "label": 3}, {"image": b"not a png", "label": 1}]
    item = source[0]
    assert item["image"].shape == (4, 6, 3) and (item["image"] == 200).all()
    assert item["label"] == 3
    with pytest.raises(DataError, match=r"^tfds:x:train record 1: not a readable image"):
        source[1]


def test_normalize_of_uint8_arrays_is_the_float32_formula():
    """Every uint8 level, and random batches, with the same and with different statistics per
    channel: (x / 255 - mean) / std in float32, as torchvision's `to_tensor` and `Normalize`
    compute it, bit for bit."""
    rng = np.random.default_rng(0)
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1)
    for mean, std in (((0.5,) * 3, (0.5,) * 3), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                      ((0.286,), (0.353,))):
        for x in (levels, rng.integers(0, 256, (4, 9, 7, 3), dtype=np.uint8)):
            want = (x.astype(np.float32) / np.float32(255) - np.asarray(mean, np.float32)) \
                / np.asarray(std, np.float32)
            got = normalize(x, mean, std)
            assert got.dtype == np.float32 and got.shape == x.shape
            np.testing.assert_array_equal(got, want)
