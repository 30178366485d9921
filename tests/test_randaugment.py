"""RandAugment and random erasing: the properties each must have, alone and in the pipeline."""

import math

import numpy as np
import pytest

from vit.data import Augment, open_source, train_iterator
from vit.data import randaugment as RA
from vit.errors import ConfigError
from vit.preprocess import Preprocessing
from vit.recipes.load import load_config

pytestmark = pytest.mark.timeout(120)

FILL = (128, 128, 128)


def picture(seed=0, h=32, w=32):
    """Smooth gradients plus noise: not already equalised, auto-contrasted or symmetric."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([40 + 4 * x, 60 + 3 * y, 90 + 2 * (x + y) % 100], -1)
    return np.clip(base + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def apply(name, image, magnitude, sign=1):
    from PIL import Image

    return np.asarray(RA.OPS[name](Image.fromarray(image), magnitude / RA.LEVEL_DENOM, sign,
                                   FILL))


WITH_MAGNITUDE = [n for n in RA.OPS if n not in RA.WITHOUT_MAGNITUDE]


def test_the_op_list_is_timms():
    assert set(RA.OPS) == {"AutoContrast", "Equalize", "Invert", "Rotate", "Posterize",
                           "Solarize", "SolarizeAdd", "Color", "Contrast", "Brightness",
                           "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY"}


@pytest.mark.parametrize("name", WITH_MAGNITUDE)
def test_every_op_with_a_magnitude_is_the_identity_at_zero_and_changes_the_image_above(name):
    image = picture()
    for sign in (1, -1):
        np.testing.assert_array_equal(apply(name, image, 0, sign), image)
        assert not np.array_equal(apply(name, image, 9, sign), image)


@pytest.mark.parametrize("name", WITH_MAGNITUDE)
def test_strength_grows_with_the_magnitude(name):
    image = picture().astype(np.int32)
    change = [np.abs(apply(name, image.astype(np.uint8), m).astype(np.int32) - image).mean()
              for m in (0, 3, 9, 15)]
    assert change[0] == 0 and change[1] < change[3] and change[2] <= change[3] + 1e-9, change


def test_pixel_ops_match_their_formulas():
    """Independent references: the textbook definitions on numpy arrays."""
    x = picture()
    np.testing.assert_array_equal(apply("Invert", x, 5), 255 - x)
    # Solarize at M=5: invert every pixel at or above 256 - 128 = 128.
    np.testing.assert_array_equal(apply("Solarize", x, 5), np.where(x >= 128, 255 - x, x))
    # Posterize at M=5: 8 - round(2) = 6 bits kept.
    np.testing.assert_array_equal(apply("Posterize", x, 5), x & 0b11111100)
    # SolarizeAdd at M=5: pixels below 128 gain 55, capped at 255.
    want = np.where(x < 128, np.minimum(x.astype(int) + 55, 255), x)
    np.testing.assert_array_equal(apply("SolarizeAdd", x, 5), want)
    # Brightness at M=5: factor 1 + 0.45.
    want = np.clip(np.round(x * 1.45), 0, 255)
    assert np.abs(apply("Brightness", x, 5).astype(int) - want).max() <= 1
    # TranslateX by a whole number of pixels at M=10: 0.45 * 20 = 9 pixels; the rest is fill.
    x20 = picture(w=20, h=20)
    moved = apply("TranslateX", x20, 10)
    np.testing.assert_array_equal(moved[:, :11], x20[:, 9:])
    assert (moved[:, 11:] == 128).all()


def test_randaugment_is_deterministic_for_a_seed_and_varies_across_seeds():
    aug = RA.RandAugment(2, 9, FILL)
    image = picture()
    one = aug(image, np.random.default_rng(5))
    np.testing.assert_array_equal(one, aug(image, np.random.default_rng(5)))
    outs = {aug(image, np.random.default_rng(s)).tobytes() for s in range(20)}
    assert len(outs) >= 10  # different ops, signs and skips for different seeds
    assert one.shape == image.shape and one.dtype == np.uint8
    np.testing.assert_array_equal(RA.RandAugment(0, 9)(image, np.random.default_rng(0)), image)


@pytest.mark.parametrize("spec", ["2,x", "2,31", "x", "2", "16,9", "-1,9", "2,9,1", "2;9"])
def test_a_bad_randaugment_is_one_line_naming_the_key_and_the_fix(spec):
    with pytest.raises(ConfigError) as err:
        Augment(randaugment=spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"input.randaugment={spec!r}")
    assert "'N,M'" in message and "'2,9'" in message


def test_good_randaugment_specs():
    assert RA.parse("2,9") == (2, 9.0) and RA.parse(" 3, 15 ") == (3, 15.0)
    assert RA.parse("") is None and RA.parse("1,30") == (1, 30.0) and RA.parse("2,0") == (2, 0)


@pytest.mark.parametrize("p", [-0.1, 1.5, "0.25", True])
def test_a_bad_random_erasing_is_refused(p):
    with pytest.raises(ConfigError, match=r"^input.random_erasing="):
        Augment(random_erasing=p)


def test_the_erased_box_follows_timms_distribution():
    """Over many draws: area 0.02 to 1/3 of the image (uniform, so the mean is near
    (0.02 + 1/3) / 2 less the boxes that do not fit), aspect log-uniform in [0.3, 3.3]."""
    rng = np.random.default_rng(0)
    h, w = 64, 64
    boxes = [RA.erase_box(rng, h, w) for _ in range(4000)]
    assert all(b is not None for b in boxes)
    areas = np.array([bh * bw / (h * w) for _, _, bh, bw in boxes])
    aspects = np.array([bh / bw for _, _, bh, bw in boxes])
    # Rounding the sides to whole pixels moves the area a little past the ends.
    assert areas.min() >= 0.015 and areas.max() <= 0.36
    assert 0.15 <= areas.mean() <= (0.02 + 1 / 3) / 2 + 0.005
    assert aspects.min() >= 0.25 and aspects.max() <= 4.0
    # log-uniform: the log aspect's mean is near 0 and its spread that of a uniform law.
    logs = np.log(aspects)
    assert abs(logs.mean()) < 0.05
    assert abs(logs.std() - 2 * math.log(1 / 0.3) / math.sqrt(12)) < 0.08
    for top, left, bh, bw in boxes:  # every box lies inside the image
        assert 0 <= top <= h - bh and 0 <= left <= w - bw


def erased_masks(p, batches, seed=0, size=16):
    """Which pixels of each training image random erasing replaced: the same pipeline run
    without erasing is the reference."""
    src = open_source("digits", "validation")
    pre = Preprocessing(size=(size, size), mean=(0.5,) * 3, std=(0.5,) * 3)

    def images(aug):
        it = train_iterator(src, pre, aug, batch_size=24, seed=seed, num_classes=10,
                            num_threads=0)
        return np.concatenate([next(it)["image"] for _ in range(batches)])

    with_erasing, without = images(Augment(random_erasing=p)), images(Augment())
    return (with_erasing != without).any(-1), with_erasing


def test_random_erasing_in_the_pipeline_erases_with_chance_p_and_noise():
    mask, images = erased_masks(0.25, batches=25)  # 600 images
    erased = mask.any((1, 2))
    # p observed ~ p: 4 standard deviations of a binomial proportion.
    assert abs(erased.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / len(erased))
    fractions = mask[erased].mean((1, 2))
    assert 0.10 <= fractions.mean() <= 0.20 and fractions.max() <= 0.4
    noise = images[mask]
    assert abs(noise.mean()) < 0.1 and abs(noise.std() - 1.0) < 0.1  # N(0, 1), not clipped
    for m in mask[erased]:  # one box each: its rows and columns are contiguous
        rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
        assert m[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()
    everything, _ = erased_masks(1.0, batches=2)
    assert everything.any((1, 2)).all()


def test_pipeline_augmentations_replay_for_a_seed_and_vary_across_seeds():
    src = open_source("digits", "validation")
    pre = Preprocessing(size=(16, 16), mean=(0.5,) * 3, std=(0.5,) * 3)
    aug = Augment(randaugment="2,9", random_erasing=0.25, flip=True)

    def first(seed, state=None):
        it = train_iterator(src, pre, aug, batch_size=16, seed=seed, num_classes=10,
                            num_threads=2)
        if state is not None:
            it.set_state(state)
        return next(it), it

    a, it = first(1)
    b, _ = first(1)
    np.testing.assert_array_equal(a["image"], b["image"])
    # Resuming replays the augmentations too.
    state = it.get_state()
    want = next(it)["image"]
    np.testing.assert_array_equal(first(1, state)[0]["image"], want)
    assert not np.array_equal(first(2)[0]["image"], a["image"])
    # RandAugment does change the images, against the same pipeline without it.
    plain = next(train_iterator(src, pre, Augment(flip=True), batch_size=16, seed=1,
                                num_classes=10, num_threads=2))
    assert not np.array_equal(plain["image"], a["image"])
    assert set(a) == set(plain)  # the erasing draw does not leak into the batch


def test_the_recipe_keys_reach_the_pipeline():
    from vit.training.from_recipe import augment_of

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    config = load_config(root / "configs" / "digits.py",
                         ["input.randaugment=2,9", "input.random_erasing=0.25"])
    aug = augment_of(config)
    assert aug.randaugment == "2,9" and aug.random_erasing == 0.25
    with pytest.raises(ConfigError, match=r"input.randaugment='2,x'"):
        augment_of(load_config(root / "configs" / "digits.py", ["input.randaugment=2,x"]))
