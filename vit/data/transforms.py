"""Per-example and per-batch transforms on numpy arrays.

Per-example transforms take a uint8 `[h, w, 3]` image (and, when random, a `np.random.Generator`
that grain seeds from the pipeline seed and the element index, so every run sees the same
augmentations) and return a uint8 image; `vit.preprocess.normalize` then turns it into the
model's float32 input. Batch transforms (mixup, cutmix) work on float images and one-hot labels.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from vit.preprocess import RESAMPLE, Preprocessing, resize_crop


def resize(image: np.ndarray, size: tuple[int, int], resample: str = "bilinear") -> np.ndarray:
    if image.shape[:2] == tuple(size):
        return image
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), RESAMPLE[resample]))


def center_crop(image: np.ndarray, pre: Preprocessing | tuple[int, int],
                crop_pct: float | None = None, resample: str = "bilinear") -> np.ndarray:
    """The eval geometry of a `Preprocessing` (or of a size, crop_pct and resample) on a uint8
    array: `vit.preprocess.resize_crop`. An image already at the size with a plain resize is
    returned as it is (PIL's resize would copy it)."""
    if not isinstance(pre, Preprocessing):
        pre = Preprocessing(size=tuple(pre), resample=resample, crop_pct=crop_pct)
    h, w = image.shape[:2]
    resized, box, _ = pre.geometry((w, h))
    if resized == (w, h) and box == (0, 0, w, h):
        return image
    return np.asarray(resize_crop(Image.fromarray(image), pre))


def inception_crop(image: np.ndarray, rng: np.random.Generator, size: tuple[int, int],
                   area: tuple[float, float] = (0.05, 1.0),
                   ratio: tuple[float, float] = (3 / 4, 4 / 3),
                   resample: str = "bilinear") -> np.ndarray:
    """Random-resized crop (Inception / big_vision `inception_crop`), then resize to `size`."""
    h, w = image.shape[:2]
    for _ in range(10):
        target = h * w * rng.uniform(*area)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            return resize(image[top:top + ch, left:left + cw], size, resample)
    return center_crop(image, size, None, resample)  # fallback: the whole image


def flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return image[:, ::-1] if rng.random() < 0.5 else image


def random_affine(images: np.ndarray, rng: np.random.Generator, *, shift: float = 0.0,
                  rotate: float = 0.0, scale: float = 0.0) -> np.ndarray:
    """Random shift (pixels), rotation (degrees) and zoom (log range) of each image in a batch.

    For tiny images (digits), where a crop would throw away most of the picture. Vectorised
    over the batch (bilinear, about the image centre); pixels from outside the image are 0
    (the digits' background). `[b, h, w, c]` uint8 -> float32 in 0..255.
    """
    b, h, w, _ = images.shape
    angle = np.radians(rng.uniform(-rotate, rotate, b))
    zoom = np.exp(rng.uniform(-scale, scale, b))
    dy, dx = rng.uniform(-shift, shift, (2, b))
    cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
    # Output pixel centre (y, x), relative to the image centre, reads the input at
    # rot(y - dy, x - dx) / zoom.
    yy, xx = np.meshgrid(np.arange(h) - (h - 1) / 2, np.arange(w) - (w - 1) / 2, indexing="ij")
    yr, xr = yy[None] - dy[:, None, None], xx[None] - dx[:, None, None]
    src_y = cos[:, None, None] * yr + sin[:, None, None] * xr + (h - 1) / 2
    src_x = -sin[:, None, None] * yr + cos[:, None, None] * xr + (w - 1) / 2
    y0, x0 = np.floor(src_y).astype(np.int64), np.floor(src_x).astype(np.int64)
    ty, tx = (src_y - y0)[..., None], (src_x - x0)[..., None]
    # One flat gather per tap (a single index array is several times faster than three).
    pixels = np.pad(images.astype(np.float32), ((0, 0), (1, 1), (1, 1), (0, 0))).reshape(
        -1, images.shape[-1])
    base = np.arange(b)[:, None, None] * ((h + 2) * (w + 2))

    def tap(y, x):  # reads outside the image land on the zero border
        return pixels[base + np.clip(y + 1, 0, h + 1) * (w + 2) + np.clip(x + 1, 0, w + 1)]

    return ((1 - ty) * ((1 - tx) * tap(y0, x0) + tx * tap(y0, x0 + 1))
            + ty * ((1 - tx) * tap(y0 + 1, x0) + tx * tap(y0 + 1, x0 + 1)))


def one_hot(labels: np.ndarray, num_classes: int, smoothing: float = 0.0) -> np.ndarray:
    """Label smoothing as big_vision/timm: (1 - s) on the class, s spread over all classes."""
    out = np.full((len(labels), num_classes), smoothing / num_classes, np.float32)
    out[np.arange(len(labels)), labels] += 1.0 - smoothing
    return out


def mixup_cutmix(images: np.ndarray, targets: np.ndarray, rng: np.random.Generator, *,
                 mixup: float = 0.0, cutmix: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Mixes each example with the batch reversed; picks cutmix or mixup per batch (timm).

    `mixup` and `cutmix` are the Beta(alpha, alpha) parameters; 0 turns each off.
    """
    if not (mixup or cutmix):
        return images, targets
    use_cutmix = cutmix > 0 and (mixup == 0 or rng.random() < 0.5)
    lam = float(rng.beta(cutmix, cutmix) if use_cutmix else rng.beta(mixup, mixup))
    flipped_images, flipped_targets = images[::-1], targets[::-1]
    if use_cutmix:
        h, w = images.shape[1:3]
        ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = rng.integers(0, h), rng.integers(0, w)
        top, bottom = np.clip([cy - ch // 2, cy + ch - ch // 2], 0, h)
        left, right = np.clip([cx - cw // 2, cx + cw - cw // 2], 0, w)
        images = images.copy()
        images[:, top:bottom, left:right] = flipped_images[:, top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (h * w)  # the area actually pasted
    else:
        images = lam * images + (1 - lam) * flipped_images
    return images.astype(np.float32), (lam * targets + (1 - lam) * flipped_targets)
