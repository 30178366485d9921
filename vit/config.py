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
    except Exception as err:  # the recipe's own code failed: name the file and its line
        raise _recipe_error(path, err) from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: defines no get_config(); it must return a ConfigDict")
    try:
        config = module.get_config()
    except Exception as err:
        raise _recipe_error(path, err) from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"{path}: get_config() returned {type(config).__name__}; it must "
                          "return an ml_collections.ConfigDict")
    add_parallel_section(config, path)
    apply_overrides(config, overrides)
    check_train_numbers(config)
    return config


def _recipe_error(path: Path, err: Exception) -> ConfigError:
    """A recipe file's exception as one line, at the file's deepest line in the traceback."""
    import traceback

    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__)
             if Path(f.filename).resolve() == path.resolve()]
    where = f" (line {lines[-1]})" if lines else ""
    return ConfigError(f"{path}: {type(err).__name__}: {err}{where}")


# Counts a run divides by or steps with: 0 or below would crash deep inside (or never stop).
POSITIVE_TRAIN_KEYS = ("steps", "batch_size", "accum_steps", "log_every", "eval_every",
                       "checkpoint_every", "keep_checkpoints", "eval_batch_size")


def check_train_numbers(config: ml_collections.ConfigDict) -> None:
    """One-line ConfigErrors for `train.*` counts below 1, in the recipe and in each stage,
    before a workdir is made."""
    sections = [("train", config.get("train"))] + [
        (f"stages.{name}.train", stage.get("train"))
        for name, stage in (config.get("stages") or {}).items()]
    base = config.get("train") or {}
    for prefix, train in sections:
        if not train:
            continue
        for key in POSITIVE_TRAIN_KEYS:
            value = train.get(key)
            if isinstance(value, int | float) and value < 1:
                raise ConfigError(f"{prefix}.{key}={value}: must be at least 1")
        batch = train.get("batch_size", base.get("batch_size"))
        accum = train.get("accum_steps", base.get("accum_steps"))
        if isinstance(batch, int) and isinstance(accum, int) and batch % accum:
            raise ConfigError(f"{prefix}.batch_size={batch} is not divisible by "
                              f"accum_steps={accum}; the batch is split into equal micro-batches")


# The device mesh every recipe gets unless it says otherwise (vit/train/parallel.py): data
# parallel over all devices; `fsdp` > 1 shards parameters and optimiser state; `rules` map
# parameter paths (regex) to a PartitionSpec, "auto" (largest divisible dim over fsdp) or
# "replicated".
PARALLEL_DEFAULTS = {"data": -1, "fsdp": 1, "rules": ((".*", "auto"),)}


def add_parallel_section(config: ml_collections.ConfigDict, path: Path) -> None:
    """Fills in `parallel` so old recipes and `--set parallel.fsdp=2` work unedited."""
    if "train" in config and "num_devices" in config.train:
        raise ConfigError(f"{path}: train.num_devices is gone; the mesh is parallel.data x "
                          "parallel.fsdp (defaults data=-1: every device, fsdp=1), e.g. "
                          "--set parallel.data=4 --set parallel.fsdp=2; remove "
                          "train.num_devices from the file")
    with config.unlocked():
        if "parallel" not in config:
            config.parallel = ml_collections.ConfigDict()
        for key, value in PARALLEL_DEFAULTS.items():
            if key not in config.parallel:
                config.parallel[key] = value


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
