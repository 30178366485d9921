"""Recipe files: `configs/*.py` define `get_config()` returning an `ml_collections.ConfigDict`
(big_vision style); `--set a.b=value` overrides any field, typed by the field's current value
(the rules of `vit.overrides`, which model `--set` fields share).
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import ml_collections

from vit.errors import ConfigError
from vit.overrides import expected_type, parse_value, split_item


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> \
        ml_collections.ConfigDict:
    """Runs the config file's `get_config()` and applies `--set` overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file; see configs/ for examples")
    spec = importlib.util.spec_from_file_location(f"vit_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ConfigError(f"{path}: {err.msg} (line {err.lineno})") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: defines no get_config(); it must return a ConfigDict")
    config = module.get_config()
    apply_overrides(config, overrides)
    return config


def _leaf_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            keys += _leaf_keys(value, name + ".")
        else:
            keys.append(name)
    return keys


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> None:
    """`["train.steps=100", "model.depth=2"]`; an unknown key lists the nearest known ones."""
    keys = _leaf_keys(config)
    for item in overrides:
        key, text = split_item(item)
        if key not in keys:
            near = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"--set {key}: no such config key{hint}")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        current = node[leaf]
        node[leaf] = parse_value(key, text, expected_type(current), current)
