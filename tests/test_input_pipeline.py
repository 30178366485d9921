"""The training pipeline's two roads (in-memory arrays a batch at a time, everything else
example by example) give the same batches of the same examples; the memory made ahead is
bounded."""

import numpy as np
import pytest

from vit.data import Augment, open_source, train_iterator
from vit.data.pipeline import PREFETCH_BYTES, EpochBatches, read_options
from vit.preprocess import Preprocessing, normalize

pytestmark = pytest.mark.timeout(120)

PRE8 = Preprocessing(size=(8, 8), mean=(0.5,) * 3, std=(0.5,) * 3)


class Examples:
    """The same examples behind a plain `len` / `[i]` source: the example-by-example road."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return self.source[i]


def key(image, label):
    return image.tobytes() + bytes([int(label)])


def test_each_epoch_visits_every_example_once_in_a_new_order():
    batches = EpochBatches(np.arange(10, 20), batch_size=4, seed=0)
    stream = np.concatenate([batches[b]["index"] for b in range(10)])  # 40 = four epochs
    epochs = stream.reshape(4, 10)
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(epoch), np.arange(10, 20))
    assert len({e.tobytes() for e in epochs}) == 4
    np.testing.assert_array_equal(batches[7]["index"], EpochBatches(np.arange(10, 20), 4, 0)[7]
                                  ["index"])  # random access: any batch, any time, same answer
    assert not np.array_equal(stream[:10], np.concatenate(
        [EpochBatches(np.arange(10, 20), 4, 1)[b]["index"] for b in range(3)])[:10])


def test_the_array_road_gives_the_batches_the_example_road_gives():
    src = open_source("digits", "validation")  # 144 images: 9 batches of 16 are one epoch
    aug = Augment(label_smoothing=0.1)
    fast = train_iterator(src, PRE8, aug, batch_size=16, seed=0, num_classes=10)
    slow = train_iterator(Examples(src), PRE8, aug, batch_size=16, seed=0, num_classes=10)
    want = {key(src[i]["image"], src[i]["label"]): src[i] for i in range(len(src))}
    for it in (fast, slow):
        seen = []
        for _ in range(9):
            batch = next(it)
            assert batch["image"].dtype == np.float32 and batch["label"].dtype == np.int64
            for image, label, target in zip(batch["image"], batch["label"], batch["target"],
                                            strict=True):
                # Undo the normalisation: the uint8 example it came from.
                raw = np.round((image * 0.5 + 0.5) * 255).astype(np.uint8)
                k = key(raw, label)
                assert k in want
                np.testing.assert_array_equal(image, normalize(want[k]["image"], (0.5,) * 3,
                                                               (0.5,) * 3))
                np.testing.assert_allclose(target[label], 0.91, rtol=1e-6)
                seen.append(k)
        assert sorted(seen) == sorted(want)  # one epoch: every example once
    # One order for both roads: batch for batch the same images, labels and targets.
    fast = train_iterator(src, PRE8, aug, batch_size=16, seed=3, num_classes=10)
    slow = train_iterator(Examples(src), PRE8, aug, batch_size=16, seed=3, num_classes=10)
    for _ in range(12):  # across the epoch's end
        a, b = next(fast), next(slow)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_the_buffer_made_ahead_is_bounded_in_memory():
    for threads, batch, side in ((4, 64, 224), (4, 512, 224), (1, 64, 8), (16, 256, 384)):
        depth = read_options(threads, batch, (side, side)).prefetch_buffer_size
        batch_bytes = batch * side * side * 3 * 4
        assert depth >= max(2, 2 * threads)  # every thread has work while one batch is taken
        assert depth * batch_bytes <= max(PREFETCH_BYTES, 2 * threads * batch_bytes)
    assert read_options(1, 64, (8, 8)).prefetch_buffer_size >= 16  # small batches: deep


def smooth(h, w):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], -1).astype(np.uint8)


def test_a_training_jpeg_decodes_no_larger_than_needed(tmp_path):
    from PIL import Image

    from vit.images import open_image

    Image.fromarray(smooth(1200, 1600)).save(tmp_path / "big.jpg", quality=95)
    Image.fromarray(smooth(1200, 1600)).save(tmp_path / "big.png")
    full = open_image(tmp_path / "big.jpg")
    assert full.size == (1600, 1200) and open_image(tmp_path / "big.png", 300).size == (1600, 1200)
    small = open_image(tmp_path / "big.jpg", min_side=300)
    assert small.size == (400, 300)  # 1/4: the smallest reduction keeping 300 px
    assert open_image(tmp_path / "big.jpg", min_side=700).size == (1600, 1200)  # 1/2 is too small
    # The decoder's scaling averages as a box filter does over the full decode.
    box = np.asarray(full.reduce(4), np.float32)
    assert np.abs(np.asarray(small, np.float32) - box).mean() < 2.0


def test_the_decoded_side_covers_the_smallest_crop_pixel_for_pixel():
    """Draws as `inception_crop` does (area fraction, log-uniform aspect in [3/4, 4/3]) on an
    image whose shorter side is `decode_side`: no accepted crop is smaller than the target."""
    from vit.data.pipeline import decode_side

    rng = np.random.default_rng(0)
    for area_min, size in ((0.05, 224), (0.25, 224), (0.08, 384)):
        pre, aug = Preprocessing(size=(size, size)), Augment(inception_crop=True,
                                                            crop_area=(area_min, 1.0))
        short = decode_side(pre, aug)
        for long in (short, short * 4 // 3, short * 2):
            for _ in range(500):
                target = short * long * rng.uniform(area_min, 1.0)
                aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
                cw, ch = np.sqrt(target * aspect), np.sqrt(target / aspect)
                if cw <= long and ch <= short:
                    assert min(cw, ch) >= size - 1
    assert decode_side(Preprocessing(size=(224, 224), crop_pct=0.875), Augment()) == 256
    assert decode_side(Preprocessing(size=(224, 224)), Augment()) == 224


def test_the_training_copy_of_a_folder_decodes_small_and_evaluation_keeps_every_pixel(tmp_path):
    from PIL import Image

    (tmp_path / "a").mkdir()
    Image.fromarray(smooth(1200, 1600)).save(tmp_path / "a" / "0.jpg", quality=95)
    source = open_source(str(tmp_path), "train", val_fraction=0.0)
    small = source.decoding_at_least(300)
    assert small[0]["image"].shape == (300, 400, 3)
    assert source[0]["image"].shape == (1200, 1600, 3) and source.min_side is None
    batch = next(train_iterator(source, Preprocessing(size=(32, 32)), Augment(inception_crop=True),
                                batch_size=2, seed=0, num_classes=1))
    assert batch["image"].shape == (2, 32, 32, 3)
