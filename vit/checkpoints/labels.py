"""Class names: the bundled ImageNet-1k list and user label files (one display name a line)."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from vit.errors import DataError

IMAGENET1K = "imagenet1k_labels.txt"


@functools.cache
def imagenet1k() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in the standard index order (WordNet synonyms)."""
    text = resources.files("vit").joinpath("assets", IMAGENET1K).read_text(encoding="utf-8")
    return tuple(text.splitlines())


def default_labels(num_classes: int) -> list[str] | None:
    """Names for a head that carries none: ImageNet-1k for 1000 classes, else unknown."""
    return list(imagenet1k()) if num_classes == 1000 else None


def read_labels(path, num_classes: int | None = None) -> list[str]:
    """A labels file: one display name per line, in class-index order."""
    try:
        names = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise DataError(f"--labels {path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise DataError(f"--labels {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
                        f"offset {err.start}); save it as UTF-8, one name per line") from None
    names = [n.strip() for n in names]
    while names and not names[-1]:
        names.pop()
    if num_classes is not None and len(names) != num_classes:
        raise DataError(f"--labels {path}: has {len(names)} names but the checkpoint has "
                        f"{num_classes} classes; give one name per class, one per line")
    return names
