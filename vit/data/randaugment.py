"""RandAugment and random erasing, on PIL images and numpy arrays, drawing from the generator
grain seeds per example (so a run replays exactly).

RandAugment (Cubuk et al. 2019) as timm's `rand-m{M}-n{N}-inc1`: each image gets N operations
drawn uniformly (with replacement) from the list below, each applied with probability 0.5, all
at magnitude M. M is on timm's and big_vision's scale, where 10 is AutoAugment's strongest
setting (rotations of 30 degrees, shears of 0.3, shifts of 45% of the side, colour factors
1 +/- 0.9); it may go to 30 (AugReg trains with 15 and 20), arguments kept in their valid range.
The magnitude of every operation that has one grows from the identity at M = 0 (timm's
"increasing" forms, as DeiT trains with), so M is a single strength knob. AutoContrast, Equalize
and Invert have no magnitude.

Random erasing (Zhong et al. 2017) as timm's `RandomErasing(mode="pixel")`: with probability p,
one box of 2% to 1/3 of the image, aspect ratio log-uniform in [0.3, 1/0.3], is filled with
per-pixel normal noise N(0, 1) in the normalised space the model sees (10 tries to fit a box,
else none).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from vit.errors import ConfigError

MAX_MAGNITUDE = 30
LEVEL_DENOM = 10.0  # M / 10: timm's fraction of each operation's full strength

# Full-strength arguments (timm's auto_augment constants).
ROTATE_DEGREES = 30.0
SHEAR = 0.3
TRANSLATE_FRACTION = 0.45
ENHANCE = 0.9
POSTERIZE_BITS = 4  # bits dropped at full strength
SOLARIZE_ADD = 110

# Random erasing's box, as timm's defaults.
ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_TRIES = 10


# -- the operations: (PIL image, level = M / 10, sign +/-1, fill colour) -> PIL image ---------
def _affine(image, matrix, fill):
    return image.transform(image.size, Image.AFFINE, matrix, resample=Image.BILINEAR,
                           fillcolor=fill)


def auto_contrast(image, level, sign, fill):
    return ImageOps.autocontrast(image)


def equalize(image, level, sign, fill):
    return ImageOps.equalize(image)


def invert(image, level, sign, fill):
    return ImageOps.invert(image)


def rotate(image, level, sign, fill):
    return image.rotate(sign * level * ROTATE_DEGREES, resample=Image.BILINEAR, fillcolor=fill)


def posterize(image, level, sign, fill):
    bits = 8 - min(round(level * POSTERIZE_BITS), 7)  # keeps at least one bit
    return image if bits >= 8 else ImageOps.posterize(image, bits)


def solarize(image, level, sign, fill):
    threshold = max(256 - round(level * 256), 0)  # 256: no pixel is inverted
    return ImageOps.solarize(image, threshold)


def solarize_add(image, level, sign, fill):
    add = round(level * SOLARIZE_ADD)
    lut = [min(255, i + add) if i < 128 else i for i in range(256)]
    return image.point(lut * len(image.getbands()))


def _enhance(kind):
    def op(image, level, sign, fill):
        return kind(image).enhance(max(0.1, 1.0 + sign * level * ENHANCE))
    op.__name__ = kind.__name__.lower()
    return op


color, contrast, brightness, sharpness = map(_enhance, (
    ImageEnhance.Color, ImageEnhance.Contrast, ImageEnhance.Brightness, ImageEnhance.Sharpness))


def shear_x(image, level, sign, fill):
    return _affine(image, (1, sign * level * SHEAR, 0, 0, 1, 0), fill)


def shear_y(image, level, sign, fill):
    return _affine(image, (1, 0, 0, sign * level * SHEAR, 1, 0), fill)


def translate_x(image, level, sign, fill):
    return _affine(image, (1, 0, sign * level * TRANSLATE_FRACTION * image.size[0], 0, 1, 0),
                   fill)


def translate_y(image, level, sign, fill):
    return _affine(image, (1, 0, 0, 0, 1, sign * level * TRANSLATE_FRACTION * image.size[1]),
                   fill)


Op = Callable[[Image.Image, float, int, tuple], Image.Image]
# timm's `_RAND_INCREASING_TRANSFORMS`, in its order.
OPS: dict[str, Op] = {
    "AutoContrast": auto_contrast, "Equalize": equalize, "Invert": invert, "Rotate": rotate,
    "Posterize": posterize, "Solarize": solarize, "SolarizeAdd": solarize_add, "Color": color,
    "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness, "ShearX": shear_x,
    "ShearY": shear_y, "TranslateX": translate_x, "TranslateY": translate_y}
WITHOUT_MAGNITUDE = ("AutoContrast", "Equalize", "Invert")
MAX_OPS = len(OPS)


def parse(spec, key: str = "input.randaugment") -> tuple[int, float] | None:
    """`'N,M'` -> (N, M); `''` (or None) -> None. Anything else is a ConfigError naming `key`."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    fix = (f"give 'N,M': N operations per image (a whole number from 0 to {MAX_OPS}) at "
           f"magnitude M (0 to {MAX_MAGNITUDE}; 9 is usual), for example '2,9', or '' for none")
    match = isinstance(spec, str) and re.fullmatch(r"\s*(\d+)\s*,\s*(\d+(?:\.\d*)?)\s*", spec)
    if not match:
        raise ConfigError(f"{key}={spec!r}: {fix}")
    n, m = int(match[1]), float(match[2])
    if n > MAX_OPS or m > MAX_MAGNITUDE:
        raise ConfigError(f"{key}={spec!r}: out of range; {fix}")
    return n, m


class RandAugment:
    """N operations at magnitude M on a uint8 `[h, w, 3]` image; `fill` is the colour that
    rotations, shears and shifts bring in (the normalisation mean, which the model sees as 0)."""

    def __init__(self, num_ops: int, magnitude: float, fill=(128, 128, 128), prob: float = 0.5):
        self.num_ops, self.level, self.prob = num_ops, magnitude / LEVEL_DENOM, prob
        self.fill = tuple(int(v) for v in fill)
        self.names = list(OPS)

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.num_ops == 0:
            return image
        pil = Image.fromarray(image)
        for index in rng.integers(0, len(self.names), self.num_ops):
            apply, sign = rng.random() < self.prob, (1 if rng.random() < 0.5 else -1)
            if apply:
                pil = OPS[self.names[index]](pil, self.level, sign, self.fill)
        return np.asarray(pil)


def erase_box(rng: np.random.Generator, height: int, width: int,
              area=ERASE_AREA, aspect=ERASE_ASPECT) -> tuple[int, int, int, int] | None:
    """timm's box: (top, left, h, w), or None when 10 tries found none that fits."""
    log_aspect = (math.log(aspect[0]), math.log(aspect[1]))
    for _ in range(ERASE_TRIES):
        target = rng.uniform(*area) * height * width
        ratio = math.exp(rng.uniform(*log_aspect))
        h, w = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if w < width and h < height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return None


def erase(image: np.ndarray, box, seed: int) -> np.ndarray:
    """`image` (float, normalised, `[h, w, c]`) with `box` filled by N(0, 1) noise from `seed`,
    in place."""
    top, left, h, w = box
    noise = np.random.default_rng(seed).standard_normal((h, w, image.shape[-1]))
    image[top:top + h, left:left + w] = noise
    return image
