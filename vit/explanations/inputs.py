"""Images to explain, from files, folders or a dataset, preprocessed and batched.

Unreadable files are collected per batch (`Batch.bad`) so the commands can report and skip
them, as `vit predict` does, instead of stopping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from vit.errors import ConfigError, DataError
from vit.images import IMAGE_SUFFIXES, image_files, open_image
from vit.preprocess import Preprocessing


@dataclasses.dataclass
class Item:
    name: str  # as given (a path) or "DATASET:SPLIT:INDEX"
    load: object  # () -> PIL image; raises DataError
    label: int | None = None
    image: Image.Image | None = None


@dataclasses.dataclass
class Batch:
    items: list[Item]
    arrays: np.ndarray  # [batch_size, h, w, c], padded with zeros past len(items)
    bad: list[str]


def resolve_class(text: str, labels: list[str] | None, num_classes: int) -> int:
    """`top` -> -1; an index; or a label name of the checkpoint."""
    if text == "top":
        return -1
    if text.lstrip("-").isdigit():
        index = int(text)
        if not 0 <= index < num_classes:
            raise ConfigError(f"--class {text}: the model has classes 0..{num_classes - 1}")
        return index
    if labels and text in labels:
        return labels.index(text)
    hint = f" such as {labels[0]!r}" if labels else " (this checkpoint has no label names)"
    raise ConfigError(f"--class {text!r}: use top, a class index, or a label{hint}")


def gather(paths: list[str], data: str | None, split: str, limit: int | None,
           data_dir: str | None) -> list[Item]:
    """Items from files and folders (sorted), then the first `limit` of dataset `data`."""
    if not paths and not data:
        raise DataError("nothing to explain: give image files or folders, or --data NAME")
    missing = [text for text in paths if not Path(text).exists()]
    if missing and len(missing) == len(paths) and not data:  # a typo, not a few bad files
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{missing[0]}: no such file or folder{more}")
    items: list[Item] = []
    for text in paths:
        path = Path(text)
        files = image_files(path) if path.is_dir() else [path]
        items += [Item(str(f), lambda f=f: open_image(f)) for f in files]
    if paths and not items and not data:
        raise DataError(f"no image files found in {' '.join(paths)} (looked for "
                        f"{', '.join(IMAGE_SUFFIXES)})")
    if data:
        from vit.data import open_source

        source = open_source(data, split, data_dir=data_dir)
        count = len(source) if limit is None else min(limit, len(source))
        for i in range(count):
            label = source[i]["label"]  # multi-hot (multi-label data) has no single true class
            items.append(Item(f"{data}:{split}:{i}",
                              lambda i=i: Image.fromarray(np.asarray(source[i]["image"])),
                              int(label) if np.ndim(label) == 0 else None))
    return items


def batches(items: list[Item], preprocessing: Preprocessing, size: int) -> Iterator[Batch]:
    """Fixed-size batches (the last one zero-padded, so one compile serves them all)."""
    if size < 1:
        raise ConfigError(f"batch size {size}: must be at least 1")
    h, w = preprocessing.size
    size = max(1, min(size, len(items)))  # no larger than needed (and 1 for no items)
    for start in range(0, len(items), size):
        good, arrays, bad = [], [], []
        for item in items[start:start + size]:
            try:
                item.image = item.load()
                arrays.append(preprocessing(item.image))
                good.append(item)
            except DataError as err:
                bad.append(str(err))
        padded = np.zeros((size, h, w, 3), np.float32)
        if arrays:
            padded[:len(arrays)] = np.stack(arrays)
        yield Batch(good, padded, bad)


def caption(row: dict, labels: list[str] | None) -> str:
    def name(index):
        return labels[index] if labels and index is not None else str(index)

    true = f"true {name(row['label'])} · " if row["label"] is not None else ""
    if row.get("prompt") is not None:
        return (f"{row['image']} · {true}“{row['prompt']}”: {row['prob']:.1%} true · "
                f"{row['method']} for the prompt")
    return (f"{row['image']} · {true}pred {name(row['pred'])} ({row['prob']:.1%}) · "
            f"{row['method']} for class {name(row['class'])}")
