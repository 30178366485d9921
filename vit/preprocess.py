"""Turning an image file or PIL image into the model's input, as a checkpoint's source expects.

Each checkpoint family has its own convention (vit_jax and big_vision: [-1, 1]; Hugging Face:
its `preprocessor_config.json`; timm: its `pretrained_cfg`). A `Preprocessing` records one, travels
inside our own checkpoints, and is applied the same way by predict, eval and rollout, so nobody
guesses. Needs only numpy and PIL.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from PIL import Image

from vit.errors import ConfigError, DataError
from vit.images import to_rgb

RESAMPLE = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
            "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Resize (then optionally centre-crop) to `size`, scale to [0, 1], normalise per channel.

    `crop_pct=None` resizes straight to `size` (Hugging Face, vit_jax); a value resizes the
    shorter side to `size / crop_pct` and centre-crops (timm's eval transform).
    """

    size: tuple[int, int] = (224, 224)
    resample: str = "bilinear"
    crop_pct: float | None = None
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self):
        object.__setattr__(self, "size", _numbers("image size", self.size, int))
        object.__setattr__(self, "mean", _numbers("mean", self.mean, float))
        object.__setattr__(self, "std", _numbers("std", self.std, float))
        if self.crop_pct is not None:
            object.__setattr__(self, "crop_pct", _number("crop_pct", self.crop_pct))
        if not isinstance(self.resample, str) or self.resample not in RESAMPLE:
            raise DataError(f"unknown resample {self.resample!r}; use one of {', '.join(RESAMPLE)}")
        # Values that would divide by zero or fail to broadcast deep inside the pipeline.
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"image size {self.size}: must be two sizes of at least 1 pixel")
        if self.crop_pct is not None and not self.crop_pct > 0:
            raise ConfigError(f"crop_pct={self.crop_pct}: must be above 0 (timm's usual value is "
                              "0.875), or none to resize without cropping")
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (1, 3):
                raise ConfigError(f"{name}={list(getattr(self, name))}: give 3 values, one per "
                                  "RGB channel (or 1 for all three)")
        if not all(math.isfinite(m) for m in self.mean):
            raise ConfigError(f"mean={list(self.mean)}: every value must be a finite number")
        if not all(s > 0 and math.isfinite(s) for s in self.std):
            raise ConfigError(f"std={list(self.std)}: every value must be above 0 (the pixels "
                              "are divided by it)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})

    def with_size(self, size: int | tuple[int, int]) -> Preprocessing:
        size = (size, size) if isinstance(size, int) else tuple(size)
        return dataclasses.replace(self, size=size)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """PIL image of any mode -> float32 `[h, w, 3]` array."""
        image = resize_crop(to_rgb(image), self.size, self.crop_pct, self.resample)
        return normalize(image, self.mean, self.std)


def _is_number(value, kind) -> bool:
    """A real number (a whole one for `int`); a string is not one, it is never parsed."""
    if not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return kind is not int or float(value).is_integer()


def _number(name: str, value, kind=float):
    """`value` as `kind`, or a ConfigError naming the field."""
    if not _is_number(value, kind):
        raise ConfigError(f"{name}={value!r}: expected a number")
    return kind(value)


def _numbers(name: str, values, kind) -> tuple:
    """A list of numbers as a tuple of `kind`, or a ConfigError naming the field."""
    if not isinstance(values, (tuple, list, np.ndarray)) or not all(
            _is_number(v, kind) for v in values):
        what = "whole numbers" if kind is int else "numbers"
        raise ConfigError(f"{name}={values!r}: expected a list of {what}")
    return tuple(kind(v) for v in values)


# vit_jax and big_vision checkpoints were trained on inputs in [-1, 1].
INCEPTION = Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def resize_crop(image: Image.Image, size: tuple[int, int], crop_pct: float | None,
                resample: str = "bilinear") -> Image.Image:
    """The geometry of `Preprocessing`: resize to `size`, or (with `crop_pct`) resize the shorter
    side to `size / crop_pct` and centre-crop `size`.

    The one copy of this arithmetic: prediction, rollout and the data pipeline's eval transform
    all come here, so a model is evaluated on exactly what it is shown at prediction time.
    """
    h, w = size
    if crop_pct is None:
        return image.resize((w, h), RESAMPLE[resample])
    scale = min(h, w) / crop_pct / min(image.size[1], image.size[0])
    rw, rh = max(w, round(image.size[0] * scale)), max(h, round(image.size[1] * scale))
    image = image.resize((rw, rh), RESAMPLE[resample])
    left, top = (rw - w) // 2, (rh - h) // 2
    return image.crop((left, top, left + w, top + h))


def normalize(image, mean, std) -> np.ndarray:
    """uint8 pixels (a PIL image, or a 0..255 array of any shape ending in channels) -> float32
    `(x / 255 - mean) / std`."""
    x = np.array(image, np.float32)  # a fresh array, then in place: no temporaries
    x /= 255.0
    x -= np.asarray(mean, np.float32)
    x /= np.asarray(std, np.float32)
    return x
