"""A recipe's values as the objects training passes around: the model section as plain
fields, the augmentation, the preprocessing.

A recipe's `model.dtype` may be `auto`: the host chooses (`vit.cpu.features.auto_dtype`). It is
resolved here, where the recipe's model section becomes ViTConfig's fields, so a ViTConfig, and
so a checkpoint's meta, only ever holds a concrete dtype; the recipe (and a run's config.json)
keeps `auto`.
"""

from __future__ import annotations

from vit.cpu.features import AUTO, auto_dtype
from vit.data import Augment
from vit.errors import ConfigError
from vit.models.config import DTYPES, ViTConfig
from vit.preprocess import Preprocessing


def model_fields(config) -> dict:
    """The recipe's model section as plain values (a nested `text` section as a dict), its
    dtype concrete (`auto` resolved for this host)."""
    fields = {k: v for k, v in config.model.to_dict().items() if k != "name"}
    if "dtype" in fields:
        fields["dtype"] = resolved_dtype(config)[0]
    return fields


def resolved_dtype(config) -> tuple[str, str | None]:
    """(the recipe's compute dtype, concrete; why `auto` chose it, or None when the recipe
    named the dtype itself)."""
    dtype = config.model.get("dtype", ViTConfig.dtype)  # the field's default
    if dtype == AUTO:
        return auto_dtype()
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not valid; choose one of "
                          f"{', '.join((AUTO, *DTYPES))}")
    return dtype, None


def dtype_line(config) -> str | None:
    """The start-up line for a recipe whose dtype is `auto`: the choice, why, and the `--set`
    that overrides it. None when the recipe names its dtype."""
    dtype, why = resolved_dtype(config)
    if why is None:
        return None
    other = "float32" if dtype != "float32" else "bfloat16"
    return (f"compute dtype: {dtype} (auto: {why}; --set model.dtype={other} to override)")


def augment_of(config) -> Augment:
    fields = set(Augment.__dataclass_fields__)
    return Augment(**{k: (tuple(v) if isinstance(v, list) else v)
                      for k, v in config.input.items() if k in fields})


def preprocessing_of(config) -> Preprocessing:
    inp = config.input
    return Preprocessing(size=(inp.image_size, inp.image_size), resample=inp.resample,
                         crop_pct=inp.crop_pct, mean=tuple(inp.mean or (0.5,) * 3),
                         std=tuple(inp.std or (0.5,) * 3))
