"""Image files: which files in a folder are images, and opening one as a decoded PIL image.

One rule for every command and dataset (predict, rollout, eval, image-folder training): a
folder is walked in sorted order, hidden files and folders (a leading ".") are skipped, and a
file counts when its suffix is one PIL decodes and it is a regular file or a link: a FIFO or a
device named like an image is skipped with a note, since opening a FIFO waits for a writer that
may never come; a link that dangles or loops is listed, and fails as an unreadable image does
(one failed image, not an abort). Needs only PIL.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from vit.errors import DataError

# Larger images are refused (decompression-bomb guard): 16k x 16k pixels. Pillow refuses above
# twice its MAX_IMAGE_PIXELS (before decoding, for every Image.open) and only warns between the
# two, so half our limit makes its refusal ours, and its warning is for images we accept.
MAX_PIXELS = 16_384 * 16_384
Image.MAX_IMAGE_PIXELS = MAX_PIXELS // 2
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)

# The EXIF tag that says how the stored pixels are turned (1: as stored; 2..8: mirrored and/or
# rotated by a multiple of 90 degrees).
ORIENTATION = 0x0112

# The files predict, rollout and the image-folder datasets pick out of a folder: one list, so
# every command sees the same images. All are formats PIL decodes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm", ".pbm", ".ico")


def is_image_name(name: str) -> bool:
    """A visible file name with an image suffix."""
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES


def image_files(folder: str | os.PathLike) -> list[Path]:
    """Every image file under `folder`, sorted, hidden entries skipped; an entry named like an
    image that is a FIFO or a device is skipped with a note on stderr. Folders are walked as
    `os.walk` does: a link to a folder is not followed, an unreadable folder is passed over."""
    out: list[Path] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return out
    subfolders = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if _is(entry.is_dir):
            if not entry.is_symlink():
                subfolders.append(entry.path)
        elif is_image_name(entry.name):
            # From the folder listing itself: no stat for a plain file. A link that dangles or
            # loops is listed: opening it fails, and it is counted as one failed image.
            if _is(entry.is_file) or entry.is_symlink():
                out.append(Path(entry.path))
            else:
                print(f"vit: note: skipped {entry.path}: {not_regular(entry.path)}, not a "
                      "regular file", file=sys.stderr)
    for subfolder in subfolders:
        out.extend(image_files(subfolder))
    return out


def _is(test) -> bool:
    """`DirEntry.is_dir`/`is_file`, False for a link that loops (they raise for one)."""
    try:
        return test()
    except OSError:
        return False


def not_regular(path) -> str | None:
    """What `path` is when it is not a regular file (or a link to one), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return "a dangling symbolic link" if os.path.islink(path) else "missing"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "a special file")


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


def upright(image: Image.Image) -> Image.Image:
    """The image turned the way its EXIF orientation tag says it is seen (a phone stores a
    portrait photo's pixels sideways plus a tag), as `transformers.image_utils.load_image` does.
    An image without the tag is returned as it is; a tag that cannot be read is ignored."""
    try:
        orientation = image.getexif().get(ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - a damaged EXIF block: the pixels are still good
        return image
    if orientation in (1, None):
        return image
    try:
        return ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - as above; the pixels as stored beat no image
        return image


def open_image(path, min_side: int | None = None) -> Image.Image:
    """Opens and fully decodes an image (a path, or a file object), turned upright by its EXIF
    orientation; a bad file raises DataError naming it. Only a regular file is opened: a FIFO
    would wait for a writer. Every reader of image files (predict, rollout, eval, training on
    a folder or on encoded TFDS records) comes here, so none sees a photo sideways.

    `min_side` (training only) lets a JPEG decode at 1/2, 1/4 or 1/8 of its size (the decoder's
    own DCT scaling, many times faster on a phone photo) while its shorter side stays at least
    that; prediction and evaluation read every pixel, as the checkpoint's own library does."""
    if isinstance(path, str | os.PathLike) and os.path.lexists(path):
        what = not_regular(path)
        if what is not None:
            raise DataError(f"{path}: {what}, not a regular file")
    try:
        with Image.open(path) as im:
            if min_side and im.format == "JPEG" and min(im.size) >= 2 * min_side:
                scale = min_side / min(im.size)
                im.draft(None, (math.ceil(im.size[0] * scale), math.ceil(im.size[1] * scale)))
            im.load()
            return upright(im.copy())
    except Image.DecompressionBombError:  # raised by Image.open, before anything is decoded
        raise DataError(f"{path}: image is larger than {2 * Image.MAX_IMAGE_PIXELS:,} pixels; "
                        "downscale it first") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError, SyntaxError) as err:
        raise DataError(f"{path}: not a readable image ({err})") from None
