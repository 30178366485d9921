"""The `data=` of `vit.train(...)`: a dataset name or folder, or the caller's own examples.

Own examples are numpy arrays (`(images, labels)` or `{"image": images, "label": labels}`) or
any random-access source grain reads (`len(src)`, `src[i]` giving `{"image", "label"}` or an
`(image, label)` pair). A mapping of splits (`{"train": ..., "validation": ...}`) gives each
split its own; with one set alone there is no validation. Each becomes a source as
`vit.data.open_source` returns them: uint8 RGB images `[h, w, 3]`, int labels, `class_names`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vit.errors import DataError

SPLITS = ("train", "validation")
OWN = "own-data"  # data.name of a run on the caller's examples


def as_sources(data, class_names: Sequence[str] | None = None
               ) -> tuple[str | None, dict[str, Any] | None]:
    """`(dataset name, None)` for a name or folder, else `(None, {split: source})` for the
    caller's examples; the train split is required, validation optional."""
    if isinstance(data, str | os.PathLike):
        return os.fspath(data), None
    if isinstance(data, Mapping) and data and set(data) <= {*SPLITS, "test"}:
        if "train" not in data:
            raise DataError(f"data has splits {', '.join(data)} but no 'train'; give "
                            "data={'train': ..., 'validation': ...}")
        train = own_source(data["train"], class_names, "train")
        out = {"train": train}
        if data.get("validation") is not None:
            out["validation"] = own_source(data["validation"], train.class_names, "validation")
        return None, out
    return None, {"train": own_source(data, class_names, "train")}


def own_source(data, class_names: Sequence[str] | None, split: str):
    """The caller's examples of one split as a source."""
    if isinstance(data, tuple) and len(data) == 2 and all(
            isinstance(a, np.ndarray | list) for a in data):
        return _arrays(*data, class_names, split)
    if isinstance(data, Mapping) and {"image", "label"} <= set(data):
        return _arrays(data["image"], data["label"], class_names, split)
    if isinstance(data, Mapping) and {"images", "labels"} <= set(data):
        return _arrays(data["images"], data["labels"], class_names, split)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        names = class_names or getattr(data, "class_names", None)
        if not names:
            raise DataError(f"data ({split}): a {type(data).__name__} source has no "
                            "class_names; give vit.train(..., class_names=[...])")
        return RandomAccess(data, list(names), split)
    raise DataError(f"data ({split}): {type(data).__name__} is not a dataset; give a name "
                    "('digits', 'tfds:NAME'), an image folder, (images, labels) arrays or a "
                    "random-access source")


def as_image(image, where: str) -> np.ndarray:
    """uint8 `[h, w, 3]` from uint8 or [0, 1] float, grey `[h, w]` / `[h, w, 1]` or RGB."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, -1)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise DataError(f"{where}: image of shape {image.shape}; give [height, width, 3] RGB "
                        "or [height, width] grey")
    if image.dtype == np.uint8:
        return image
    if np.issubdtype(image.dtype, np.floating):
        if not (np.isfinite(image).all() and image.min() >= 0 and image.max() <= 1):
            raise DataError(f"{where}: float pixels must lie in [0, 1]; scale them, or give "
                            "uint8 0..255")
        return (image * 255.0).round().astype(np.uint8)
    if np.issubdtype(image.dtype, np.integer) and image.min() >= 0 and image.max() <= 255:
        return image.astype(np.uint8)
    raise DataError(f"{where}: pixels of type {image.dtype}; give uint8 0..255 or float 0..1")


class ArrayExamples:
    """Images `[n, h, w, 3]` (or grey `[n, h, w]`) and int labels `[n]` held in memory."""

    def __init__(self, images, labels, class_names: list[str], name: str):
        self.images, self.labels = images, labels
        self.class_names, self.name = class_names, name

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": as_image(self.images[i], f"{self.name}[{i}]"),
                "label": int(self.labels[i])}


def _arrays(images, labels, class_names, split: str) -> ArrayExamples:
    images, labels = np.asarray(images), np.asarray(labels)
    name = f"{OWN}:{split}"
    if images.ndim not in (3, 4) or len(images) == 0:
        raise DataError(f"data ({split}): images of shape {images.shape}; give [n, height, "
                        "width, 3] (or [n, height, width] grey) with n > 0")
    if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"data ({split}): labels of shape {labels.shape} and type "
                        f"{labels.dtype} for {len(images)} images; give one int per image")
    if labels.min() < 0:
        raise DataError(f"data ({split}): label {labels.min()} is negative; labels are class "
                        "indices 0..classes-1")
    names = list(class_names) if class_names else [str(c) for c in range(labels.max() + 1)]
    if labels.max() >= len(names):
        raise DataError(f"data ({split}): label {labels.max()} but {len(names)} class names; "
                        "give a name for each class index")
    as_image(images[0], f"data ({split})")  # a wrong shape or range fails now, not in a thread
    return ArrayExamples(images, labels, names, name)


class RandomAccess:
    """A caller's random-access source, each element as the pipeline reads it."""

    def __init__(self, source, class_names: list[str], split: str):
        self.source, self.class_names, self.name = source, class_names, f"{OWN}:{split}"
        if len(source) == 0:
            raise DataError(f"data ({split}): the source is empty")
        self[0]  # a source of the wrong shape fails now, not in a decoding thread

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict:
        element = self.source[i]
        where = f"{self.name}[{i}]"
        if isinstance(element, Mapping) and {"image", "label"} <= set(element):
            image, label = element["image"], element["label"]
        elif isinstance(element, tuple | list) and len(element) == 2:
            image, label = element
        else:
            raise DataError(f"{where}: give {{'image': ..., 'label': ...}} or (image, label), "
                            f"not {type(element).__name__}")
        label = int(label)
        if not 0 <= label < len(self.class_names):
            raise DataError(f"{where}: label {label} is outside 0..{len(self.class_names) - 1}")
        return {"image": as_image(image, where), "label": label}
