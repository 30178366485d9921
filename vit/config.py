"""Recipe files: `configs/*.py` define `get_config()` returning an `ml_collections.ConfigDict`
(big_vision style); `--set a.b=value` overrides any field, typed by the field's current value.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from pathlib import Path

import ml_collections

from vit.errors import ConfigError


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


def _parse(text: str, current, key: str):
    """Parses `text` as the type of the field's current value."""
    def fail(kind: str):
        raise ConfigError(f"--set {key}={text}: expected {kind} (current value {current!r})")

    if current is None or isinstance(current, str):
        if current is None and text.lower() in ("none", "null"):
            return None
        if current is None:
            try:
                return ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return text
        return text
    if isinstance(current, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            fail("true or false")
        return text.lower() in ("true", "1")
    if isinstance(current, int | float):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fail(type(current).__name__)
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(current, int) and not isinstance(value, int)):
            fail(type(current).__name__)
        return type(current)(value)
    if isinstance(current, tuple | list):
        try:
            value = ast.literal_eval(text if text.strip()[:1] in "([" else f"({text},)")
        except (ValueError, SyntaxError):
            fail("a list such as 1,2")
        if not isinstance(value, tuple | list):
            value = (value,)
        return type(current)(value)
    fail(type(current).__name__)


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> None:
    """`["train.steps=100", "model.depth=2"]`; an unknown key lists the nearest known ones."""
    keys = _leaf_keys(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: write KEY=VALUE, e.g. --set train.steps=100")
        key, text = item.split("=", 1)
        key = key.strip()
        if key not in keys:
            near = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"--set {key}: no such config key{hint}")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = _parse(text, node[leaf], key)
