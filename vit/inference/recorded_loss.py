"""The training loss a checkpoint records, read before the checkpoint itself: it decides how its
class head is read (softmax over classes, or each label's own sigmoid for `sigmoid_xent`).

Where it is recorded:
- a `vit train` workdir, or a step inside one: `WORKDIR/config.json`, `train.loss`;
- a step or export folder of ours: the `meta` item's `config.train.loss` (training writes the
  recipe there; `vit convert --format orbax` keeps none);
- a Hugging Face folder: `config.json`'s `problem_type` (`multi_label_classification` is
  transformers' sigmoid loss, `single_label_classification` its softmax one).

npz files, timm folders and hub ids record nothing: the answer is None.
"""

from __future__ import annotations

import json
from pathlib import Path

# `vit.checkpoints.orbax_format`'s names and orbax's JSON item file, spelled here: importing
# that package loads every reader (flax included), which a prepared classifier's warm run skips.
CHECKPOINTS_DIR, META, META_FILE = "checkpoints", "meta", "metadata"
HF_PROBLEM_TYPES = {"multi_label_classification": "sigmoid_xent",
                    "single_label_classification": "softmax_xent"}


def recorded_loss(checkpoint) -> tuple[str | None, str | None]:
    """`(loss, where it is recorded)`, or `(None, None)` when the checkpoint records none. A
    file that cannot be read records nothing here: loading the checkpoint reports it."""
    path = Path(checkpoint)
    if not path.is_dir():
        return None, None
    workdir = path if (path / CHECKPOINTS_DIR).is_dir() else (
        path.parent.parent if path.parent.name == CHECKPOINTS_DIR else None)
    candidates = []
    if (path / META).is_dir():  # a step or an export: its own record first
        candidates.append((path / META / META_FILE, ("config", "train", "loss")))
    if workdir is not None:
        candidates.append((workdir / "config.json", ("train", "loss")))
    candidates.append((path / "config.json", ("problem_type",)))
    for file, keys in candidates:
        value = _lookup(file, keys)
        if keys == ("problem_type",):
            value = HF_PROBLEM_TYPES.get(value)
        if isinstance(value, str):
            return value, f"{file} ({'.'.join(keys)})"
    return None, None


def _lookup(file: Path, keys: tuple[str, ...]):
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
