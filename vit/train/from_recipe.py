"""A recipe's values as the objects training passes around: the model section as plain
fields, the augmentation, the preprocessing."""

from __future__ import annotations

from vit.data import Augment
from vit.preprocess import Preprocessing


def model_fields(config) -> dict:
    """The recipe's model section as plain values (a nested `text` section as a dict)."""
    return {k: v for k, v in config.model.to_dict().items() if k != "name"}


def augment_of(config) -> Augment:
    fields = set(Augment.__dataclass_fields__)
    return Augment(**{k: (tuple(v) if isinstance(v, list) else v)
                      for k, v in config.input.items() if k in fields})


def preprocessing_of(config) -> Preprocessing:
    inp = config.input
    return Preprocessing(size=(inp.image_size, inp.image_size), resample=inp.resample,
                         crop_pct=inp.crop_pct, mean=tuple(inp.mean or (0.5,) * 3),
                         std=tuple(inp.std or (0.5,) * 3))
