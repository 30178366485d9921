"""Image files: which files in a folder are images, and opening one as a decoded PIL image.

One rule for every command and dataset (predict, rollout, eval, image-folder training): a
folder is walked in sorted order, hidden files and folders (a leading ".") are skipped, and a
file counts when its suffix is one PIL decodes. Needs only PIL.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from vit.errors import DataError

# Larger images are refused (decompression-bomb guard): 16k x 16k pixels. Pillow refuses above
# twice its MAX_IMAGE_PIXELS (before decoding, for every Image.open) and only warns between the
# two, so half our limit makes its refusal ours, and its warning is for images we accept.
MAX_PIXELS = 16_384 * 16_384
Image.MAX_IMAGE_PIXELS = MAX_PIXELS // 2
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)

# The files predict, rollout and the image-folder datasets pick out of a folder: one list, so
# every command sees the same images. All are formats PIL decodes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm", ".pbm", ".ico")


def is_image_name(name: str) -> bool:
    """A visible file name with an image suffix."""
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES


def image_files(folder: str | os.PathLike) -> list[Path]:
    """Every image file under `folder`, sorted, hidden entries skipped."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out.extend(Path(root) / f for f in sorted(files) if is_image_name(f))
    return out


def list_images(inputs: Iterable) -> list[Path]:
    """Files as given, folders walked by `image_files`. A missing file is kept: it is reported
    per image, like a bad one."""
    out = []
    for item in inputs:
        path = Path(item)
        out.extend(image_files(path) if path.is_dir() else [path])
    return out


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode (L, LA, P, RGBA, CMYK, 16-bit I;16, 32-bit I/F) -> 8-bit RGB."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        a = np.asarray(image, np.float64)
        hi = 65535.0 if image.mode.startswith("I;16") or a.max() > 255 else 255.0
        a = np.clip(a / hi * 255.0, 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def open_image(path) -> Image.Image:
    """Opens and fully decodes an image; a bad file raises DataError naming it."""
    try:
        with Image.open(path) as im:
            im.load()
            return im.copy()
    except Image.DecompressionBombError:  # raised by Image.open, before anything is decoded
        raise DataError(f"{path}: image is larger than {2 * Image.MAX_IMAGE_PIXELS:,} pixels; "
                        "downscale it first") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError, SyntaxError) as err:
        raise DataError(f"{path}: not a readable image ({err})") from None
