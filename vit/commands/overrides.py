"""Parsing `FIELD=VALUE` model overrides from the command line, typed by the config field."""

from __future__ import annotations

import types
import typing

from vit.errors import ConfigError
from vit.models.config import ViTConfig, check_fields

_HINTS = typing.get_type_hints(ViTConfig)


def _parse_value(field: str, text: str):
    hint = _HINTS[field]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # "X | None"
        if text.lower() in ("none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    try:
        if typing.get_origin(hint) is tuple:  # "384", "384,512" or "384x512"
            parts = [int(p) for p in text.replace("x", ",").split(",")]
            return tuple(parts) if len(parts) == 2 else parts[0]
        if hint is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return hint(text)
    except ValueError:
        raise ConfigError(f"--set {field}={text}: expected {getattr(hint, '__name__', hint)}, "
                          f"e.g. --set {field}={ViTConfig.__dataclass_fields__[field].default}"
                          ) from None


def parse_model_overrides(items: list[str]) -> dict:
    """['classifier=gap', 'model.depth=6'] -> {'classifier': 'gap', 'depth': 6}."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: write FIELD=VALUE, e.g. --set classifier=gap")
        key, value = item.split("=", 1)
        key = key.removeprefix("model.")
        check_fields({key: None})
        out[key] = _parse_value(key, value)
    return out
