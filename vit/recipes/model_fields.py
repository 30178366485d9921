"""Model fields set from the command line (`vit info --set`, `vit predict --set`, a recipe's
`model` section): each typed by its ViTConfig annotation, with the rules of
`vit.recipes.overrides`. Apart from that module because it imports the model package.
"""

from __future__ import annotations

import dataclasses
import typing

from vit.models.config import ViTConfig, check_fields
from vit.recipes.overrides import parse_value, split_item

_HINTS = typing.get_type_hints(ViTConfig)
_DEFAULTS = {f.name: None if f.default is dataclasses.MISSING else f.default
             for f in dataclasses.fields(ViTConfig)}


def field_type(field: str):
    """The annotation of a ViTConfig field, widened where the config takes more."""
    hint = _HINTS[field]
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args and all(a is int for a in args):
        return int | hint  # ViTConfig takes one int for a square patch or image size
    return hint


def model_field_types() -> dict:
    """ViTConfig's fields, each with the type `--set model.FIELD=...` expects: what a recipe's
    `model` section may hold (`vit.recipes.load.load_config` takes this function)."""
    from vit.models.config import FIELDS

    return {name: field_type(name) for name in FIELDS}


def parse_model_overrides(items: list[str]) -> dict:
    """['classifier=gap', 'model.depth=6'] -> {'classifier': 'gap', 'depth': 6}."""
    out = {}
    for item in items:
        key, text = split_item(item, "FIELD=VALUE", "classifier=gap")
        key = key.removeprefix("model.")
        check_fields({key: None})
        out[key] = parse_value(key, text, field_type(key), _DEFAULTS[key])
    return out
