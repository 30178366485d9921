"""Random-access image datasets: the bundled digits, real sets a package installs
(`vit.data.real_sets`: Fashion-MNIST, MNIST digits), image folders, TensorFlow Datasets.

Every source has `len()`, `source[i] -> {"image": uint8 [h, w, 3], "label": int}`,
`.class_names` and `.name`. Random access is what lets the grain pipeline shuffle globally,
decode in parallel and resume at any example.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vit.errors import ConfigError, DataError
from vit.images import IMAGE_SUFFIXES, image_files, not_regular, open_image, to_rgb

log = logging.getLogger(__name__)

DIGITS_SPLITS = ("train", "validation", "test")


class ArraySource:
    """In-memory images and labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, class_names: list[str],
                 name: str):
        self.images, self.labels = images, labels
        self.class_names, self.name = list(class_names), name

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": int(self.labels[i])}


def digits(split: str) -> ArraySource:
    """scikit-learn's copy of the UCI handwritten digits, 8x8, as uint8 RGB.

    A fixed stratified split: 20% (360 images) is `test`; 10% of the rest (144) is
    `validation`, for choosing checkpoints without looking at test; 1,293 images are `train`.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in DIGITS_SPLITS:
        raise DataError(f"digits has no split {split!r}; use one of {', '.join(DIGITS_SPLITS)}")
    data = load_digits()
    # Values are 0..16 (counts of set pixels in 4x4 blocks): scale to 0..255, grey to RGB.
    images = np.repeat((data.images * 255.0 / 16.0).round().astype(np.uint8)[..., None], 3, -1)
    index = np.arange(len(images))
    rest, test = train_test_split(index, test_size=0.2, stratify=data.target, random_state=0)
    train, val = train_test_split(rest, test_size=0.1, stratify=data.target[rest],
                                  random_state=0)
    chosen = {"train": train, "validation": val, "test": test}[split]
    return ArraySource(images[chosen], data.target[chosen], [str(d) for d in range(10)],
                       f"digits:{split}")


def real_set(name: str, split: str, data_dir: str | None = None) -> ArraySource:
    """A set of `vit.data.real_sets` (grey 28x28) as uint8 RGB in memory."""
    from vit.data.real_sets import LOADERS

    images, labels, class_names = LOADERS[name](split, data_dir)
    return ArraySource(np.repeat(images[..., None], 3, -1), labels, class_names,
                       f"{name}:{split}")


class FolderSource:
    """`root/<class>/<image>`; class names are the sorted folder names.

    A file that fails to decode is replaced by the next readable example and counted; the first
    few are named in a warning (`strict=True` raises instead), so one bad file never kills an
    epoch.
    """

    def __init__(self, files: list[Path], labels: list[int], class_names: list[str], name: str,
                 strict: bool = False):
        self.files, self.labels = files, np.asarray(labels, np.int64)
        self.class_names, self.name, self.strict = class_names, name, strict
        self.bad: list[str] = []
        self.min_side: int | None = None  # see `decoding_at_least`

    def decoding_at_least(self, min_side: int) -> FolderSource:
        """This dataset, its JPEGs decoded no larger than needed for a shorter side of
        `min_side` (`vit.images.open_image`): for training, where a crop is resized anyway.
        Evaluation keeps every pixel, as prediction does."""
        out = copy.copy(self)
        out.min_side = min_side
        return out

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        for offset in range(len(self.files)):
            j = (i + offset) % len(self.files)
            try:
                image = np.asarray(to_rgb(open_image(self.files[j], self.min_side)))
                return {"image": image, "label": int(self.labels[j])}
            except DataError as err:
                if self.strict:
                    raise DataError(f"{err} (data.strict=true; data.strict=false skips "
                                    "unreadable images)") from None
                self._record_bad(str(self.files[j]), err)
        raise DataError(f"{self.name}: no readable image in the dataset")

    def _record_bad(self, path: str, err: DataError) -> None:
        if path in self.bad:
            return
        self.bad.append(path)
        if len(self.bad) <= 3:
            log.warning("skipping unreadable image %s (%d bad so far): %s", path, len(self.bad),
                        err)


def _list_folder(root: Path) -> dict[str, list[Path]]:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    return {c: image_files(root / c) for c in classes}


def folder(root: str | os.PathLike, split: str, *, val_fraction: float = 0.1, seed: int = 0,
           strict: bool = False) -> FolderSource:
    """An image folder. With `root/train` (and `root/val` or `root/validation`, `root/test`)
    subfolders each split is one of them; otherwise `val_fraction` of each class, chosen
    by `seed`, is `validation` and the rest `train`."""
    root = Path(root)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "no such folder"
        raise DataError(f"{root}: {what}; give a folder with one subfolder per class")
    split_dirs = {"train": ["train"], "validation": ["val", "validation"],
                  "test": ["test"]}
    if (root / "train").is_dir():
        names = split_dirs.get(split, [split])
        found = next((root / n for n in names if (root / n).is_dir()), None)
        if found is None:
            raise DataError(f"{root}: no {'/'.join(names)} subfolder for split {split!r}")
        by_class = _list_folder(found)
        classes = sorted(_list_folder(root / "train"))  # every split shares train's labels
        chosen = {c: by_class.get(c, []) for c in classes}
    else:
        if split not in ("train", "validation"):
            raise DataError(f"{root}: split {split!r} needs a {split}/ subfolder; without "
                            "subfolders the splits are 'train' and 'validation'")
        chosen, classes = {}, sorted(_list_folder(root))
        rng = np.random.default_rng(seed)
        for c, files in _list_folder(root).items():
            order = rng.permutation(len(files))
            n_val = int(round(len(files) * val_fraction))
            if val_fraction > 0 and len(files) > 1:  # every class is validated
                n_val = max(n_val, 1)
            keep = order[:n_val] if split == "validation" else order[n_val:]
            chosen[c] = [files[i] for i in sorted(keep)]
    files, labels = [], []
    for label, c in enumerate(classes):
        files += chosen[c]
        labels += [label] * len(chosen[c])
    if not files:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) for split {split!r}; "
                        "expected root/<class>/<image> files")
    if strict:  # refused before training starts, not at the step that reads it
        for f in files:
            if (what := not_regular(f)) is not None:
                raise DataError(f"{f}: {what}, not an image file (data.strict=true; remove it, "
                                "or data.strict=false skips it with a warning)")
    return FolderSource(files, labels, classes, f"{root}:{split}", strict=strict)


class TfdsSource:
    """A TFDS dataset prepared as array_record, read through `tfds.data_source`."""

    def __init__(self, name: str, split: str, data_dir: str | None = None,
                 image_key: str = "image", label_key: str = "label"):
        import tensorflow_datasets as tfds

        self.name = f"tfds:{name}:{split}"
        self.image_key, self.label_key = image_key, label_key
        hint = (f"prepare it once with: pip install tensorflow && tfds build {name} "
                f"--file_format=array_record" + (f" --data_dir {data_dir}" if data_dir else ""))
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError:
            known = list(dict.fromkeys([*BUILT_IN,
                                        *tfds.list_builders(with_community_datasets=False)]))
            close = difflib.get_close_matches(name, known, n=3)
            fix = (f"did you mean {' or '.join(map(repr, close))}?" if close else
                   "give one of those, a folder, or a name from tfds.list_builders()")
            raise DataError(f"dataset {name!r} is not built in ({', '.join(BUILT_IN)}), an image "
                            f"folder or a TFDS dataset; {fix}") from None
        file_format = getattr(builder.info, "file_format", None)
        if not builder.is_prepared() or str(getattr(file_format, "value", file_format)) not in (
                "array_record", "parquet"):
            raise DataError(f"TFDS dataset {name!r} is not prepared as array_record in "
                            f"{builder.data_dir}; {hint}")
        try:
            self.source = builder.as_data_source(split=split)
        except ValueError as err:
            raise DataError(f"TFDS dataset {name!r}: bad split {split!r} ({err}); available: "
                            f"{', '.join(builder.info.splits)}") from None
        label = builder.info.features[label_key]
        self.class_names = list(getattr(label, "names", None) or
                                [str(i) for i in range(label.num_classes)])

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict:
        record = self.source[i]
        image = record[self.image_key]
        if isinstance(image, bytes):  # an undecoded Image feature: decode as a file would be
            import io

            try:
                image = to_rgb(open_image(io.BytesIO(image)))
            except DataError as err:  # named by its record, not by the in-memory buffer
                raise DataError(f"{self.name} record {i}: {str(err).split(': ', 1)[-1]}") from None
        image = np.asarray(image)
        if image.ndim == 2 or image.shape[-1] == 1:
            image = np.repeat(image.reshape(image.shape[:2] + (1,)), 3, -1)
        return {"image": image.astype(np.uint8), "label": int(record[self.label_key])}


@dataclasses.dataclass(frozen=True)
class BuiltIn:
    """A dataset known by name: how it opens, and for a prompt dataset its design (the words of
    its prompts, its kinds of labels)."""

    open: Callable  # (split, data_dir, labels) -> a random-access source
    prompted: Callable | None = None  # -> the prompt dataset's source class, imported on use

    def prompt_words(self):
        """What a model trained on it has read in its prompts (a `PromptWords`: the words, the
        question templates); None without prompts."""
        return self.prompted().dataset.prompt_words() if self.prompted else None

    def label_kinds(self) -> dict[str, list[str]]:
        """{`data.labels` value: class names}, the first the default; empty for a dataset with
        one kind of labels and no choice."""
        kinds = self.prompted().dataset.label_kinds if self.prompted else {}
        return kinds if len(kinds) > 1 else {}


def _promptshapes():
    from vit.data.promptshapes import PromptShapesSource

    return PromptShapesSource


def _fashion_scenes():
    from vit.data.fashion_scenes import FashionScenesSource

    return FashionScenesSource


def _prompted(source_class) -> BuiltIn:
    return BuiltIn(lambda split, data_dir, labels: source_class()(split, labels=labels,
                                                                  data_dir=data_dir),
                   source_class)


# The one table of datasets known by name; `open_source`, `vit eval` and the prompt checks of
# `vit predict` look names up here. fashion_mnist and mnist_5k come before TFDS, whose names
# these also are.
BUILT_IN = {
    "digits": BuiltIn(lambda split, data_dir, labels: digits(split)),
    "promptshapes": _prompted(_promptshapes),
    "fashion_scenes": _prompted(_fashion_scenes),
    "fashion_mnist": BuiltIn(lambda split, data_dir, labels: real_set("fashion_mnist", split,
                                                                      data_dir)),
    "mnist_5k": BuiltIn(lambda split, data_dir, labels: real_set("mnist_5k", split, data_dir)),
}


def prompt_words_of(name: str):
    """What a model trained on dataset `name` has read in its prompts (a `PromptWords`); None
    for a dataset without prompts."""
    entry = BUILT_IN.get(name)
    return entry.prompt_words() if entry else None


def labels_named(name: str, class_names) -> str | None:
    """The `data.labels` of dataset `name` whose class names are `class_names` (a checkpoint's
    own): None for the default kind, a dataset without a choice, or names that match none."""
    entry = BUILT_IN.get(name)
    kinds = list(entry.label_kinds().items())[1:] if entry and class_names else []
    return next((kind for kind, names in kinds if list(names) == list(class_names)), None)


def open_source(name: str, split: str, *, data_dir: str | None = None, strict: bool = False,
                val_fraction: float = 0.1, labels: str | None = None):
    """A name of `BUILT_IN`, `"tfds:NAME"` (or a TFDS name), or a folder path -> a
    random-access source.

    `split` is a split name; TFDS takes slicing such as `train[:90%]`. `labels` (the recipe's
    `data.labels`) picks a dataset's kind of labels where it has several (promptshapes); other
    datasets refuse it.
    """
    entry = BUILT_IN.get(name)
    if labels is not None and not (entry and entry.label_kinds()):
        choosing = [n for n, e in BUILT_IN.items() if e.label_kinds()]
        raise ConfigError(f"data.labels={labels!r} applies to {', '.join(choosing)} only; "
                          f"remove it for {name!r}")
    if entry is not None:
        return entry.open(split, data_dir, labels)
    if name.startswith("tfds:"):
        return TfdsSource(name.removeprefix("tfds:"), split, data_dir)
    if os.sep in name or Path(name).is_dir():
        return folder(name, split, val_fraction=val_fraction, strict=strict)
    if re.fullmatch(r"[a-z0-9_]+(/[\w.=,-]+)?(:[\d.]+)?", name):
        return TfdsSource(name, split, data_dir)
    if Path(name).exists():
        raise DataError(f"dataset {name!r} is a file; give an image folder (one subfolder per "
                        f"class), {', '.join(BUILT_IN)} or 'tfds:NAME'")
    raise DataError(f"unknown dataset {name!r}; use one of {', '.join(BUILT_IN)}, 'tfds:NAME' or "
                    "an image folder")
