"""Recipe files: `configs/*.py` (shipped, so loadable by name: `vit.recipes.shipped`) define
`get_config()` returning an `ml_collections.ConfigDict` (big_vision style) that sets only what
differs from `vit.recipes.defaults`; loading merges it over them. `--set a.b=value` overrides
any key, typed as the defaults type it (the rules of `vit.recipes.overrides`, which model
`--set` fields share). A key the code does not know, in the file or in a `--set`, is a
one-line error suggesting the nearest known keys.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections

from vit.errors import ConfigError
from vit.recipes.defaults import DEFAULTS, EXTRA_SECTIONS, default_tree, sections, type_of
from vit.recipes.overrides import convert, expected_type, parse_value, split_item
from vit.recipes.shipped import resolve

# The keys each section may hold, from the defaults. `model` holds `name` and ViTConfig's
# fields (`load_config`'s `model_field_types`); `stages` is checked by vit/training/stages.py, and
# a `stages.NAME.train` (`optim`, `input`) section may hold the keys of its base section.
SECTION_KEYS = {name: keys for name, keys in sections().items() if name}
TOP_KEYS = (*sections().get("", ()), *SECTION_KEYS, *EXTRA_SECTIONS)
# Model fields a recipe's `model` section may not hold: the data and `input` decide them.
DERIVED_MODEL_FIELDS = {"num_classes": "the dataset's class count",
                        "image_size": "input.image_size"}


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
                model_field_types: Callable[[], dict[str, Any]] | None = None) -> \
        ml_collections.ConfigDict:
    """Runs the config file's `get_config()` and applies `--set` overrides. `path` is a file
    or the name of a shipped recipe (`digits`, `vit.recipes.shipped`).

    `model_field_types()` gives ViTConfig's fields with the type each expects (the caller
    passes it: this module may not import the model package). With it, `--set
    model.act_layer=gelu_tanh` works on a recipe whose `model` section leaves `act_layer` out,
    and a misspelt field in that section is refused here (the last check: it imports jax).
    """
    path = resolve(path)
    module = _run_recipe(path)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: defines no get_config(); {_RECIPE}")
    try:
        config = module.get_config()
    except Exception as err:
        raise _recipe_error(path, err) from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"{path}: get_config() returned {type(config).__name__}; it must "
                          "return an ml_collections.ConfigDict")
    return finish_config(config, path, overrides, model_field_types=model_field_types)


def finish_config(config: ml_collections.ConfigDict, path: Path | str = "the recipe",
                  overrides: list[str] | tuple[str, ...] = (), *,
                  model_field_types: Callable[[], dict[str, Any]] | None = None) -> \
        ml_collections.ConfigDict:
    """A recipe's ConfigDict (as `get_config()` returns it, or a full config) merged over the
    defaults, with `overrides` applied and every check `load_config` makes; `path` names it in
    errors. The recipe itself is not changed."""
    check_keys(config, path)
    config = with_defaults(config, path)
    apply_overrides(config, overrides, model_field_types=model_field_types)
    if not config.data.name:
        raise ConfigError(f"{path}: data.name is not set; name the dataset in the recipe or "
                          "with --set data.name=digits (or tfds:NAME, or a folder of class "
                          "folders)")
    check_train_numbers(config)
    check_ranges(config)
    check_patterns(config)
    if model_field_types is not None:
        fields = [f for f in model_field_types() if f not in DERIVED_MODEL_FIELDS]
        _check_section(config.get("model"), "model", (*SECTION_KEYS["model"], *fields), path)
    return config


def with_defaults(recipe: ml_collections.ConfigDict, path: Path | str = "the recipe") -> \
        ml_collections.ConfigDict:
    """The recipe merged over the defaults: every key the defaults list, each value typed as
    they type it (an int learning rate becomes a float), so a later `--set` fits its field."""
    tree = default_tree()
    for key, value in recipe.items():
        if isinstance(value, ml_collections.ConfigDict):
            value = value.to_dict()
        if key not in SECTION_KEYS:
            tree[key] = value
        elif not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}={value!r} must be a section, e.g. "
                              f"c.{key} = dict({SECTION_KEYS[key][0]}=...)")
        else:
            tree[key].update(value)
    for name, key, node, leaf in _typed_leaves(tree):
        try:
            node[leaf] = convert(node[leaf], type_of(key))
        except TypeError as err:
            raise ConfigError(f"{path}: {name}={node[leaf]!r}: {err}") from None
    return ml_collections.ConfigDict(tree)


def _typed_leaves(tree: dict) -> list[tuple[str, str, dict, str]]:
    """(name, defaults key, parent dict, leaf) for each value the defaults type: the recipe's
    own and those of each stage's sections."""
    out = [(key, key, *_parent(tree, key)) for key in DEFAULTS]
    stages = tree.get("stages")
    for stage_name, stage in (stages.items() if isinstance(stages, dict) else ()):
        for section, keys in SECTION_KEYS.items():
            node = stage.get(section) if isinstance(stage, dict) else None
            if isinstance(node, dict):
                out += [(f"stages.{stage_name}.{section}.{leaf}", f"{section}.{leaf}", node, leaf)
                        for leaf in keys if leaf in node]
    return out


def _parent(tree: dict, key: str) -> tuple[dict, str]:
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree[part]
    return tree, leaf


_RECIPE = "a recipe is a Python file whose get_config() returns a ConfigDict (see configs/)"


def _run_recipe(path: Path) -> types.ModuleType:
    """The recipe file run as a module, whatever its suffix (as ml_collections' config_flags
    loads one); compiled here, so no `__pycache__` is written beside it."""
    try:
        source = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as err:
        hint = "" if path.suffix == ".py" else f"; {_RECIPE}"
        raise ConfigError(f"{path}: {err.msg} (line {err.lineno}){hint}") from None
    except ValueError:  # null bytes: a binary file
        raise ConfigError(f"{path}: not a Python file; {_RECIPE}") from None
    module = types.ModuleType(f"vit_config_{path.stem}")
    module.__file__ = str(path)
    try:
        exec(code, module.__dict__)
    except Exception as err:  # the recipe's own code failed: name the file and its line
        raise _recipe_error(path, err) from None
    return module


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
    base = config.get("train") or {}
    for prefix, train in _sections(config, "train"):
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


def _sections(config: ml_collections.ConfigDict, name: str) -> list[tuple[str, Any]]:
    """(`name`, the recipe's section) and (`stages.S.name`, each stage's own), which may be
    None or empty."""
    return [(name, config.get(name))] + [
        (f"stages.{stage_name}.{name}", stage.get(name))
        for stage_name, stage in (config.get("stages") or {}).items()]


def check_ranges(config: ml_collections.ConfigDict) -> None:
    """One-line ConfigErrors for values that would train to nothing or to nonsense, or fail
    deep inside: every number outside the `Range` its key states in the defaults (a negative
    or infinite learning rate, a momentum or decay of 1 or more, label smoothing outside
    [0, 1), a seed the step cannot hold), and every name outside its choices; in the recipe
    and in each stage."""
    for key, entry in DEFAULTS.items():
        if entry.range is None and entry.choices is None:
            continue
        section, _, leaf = key.rpartition(".")
        for prefix, node in (_sections(config, section) if section else [("", config)]):
            if not node or leaf not in node:
                continue
            name, value = f"{prefix}.{leaf}" if prefix else leaf, node[leaf]
            if entry.range is not None and value not in entry.range:
                raise ConfigError(f"{name}={value}: must be {entry.range}")
            if entry.choices is not None and value not in entry.choices:
                near = difflib.get_close_matches(str(value), entry.choices, n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise ConfigError(f"{name}={value!r}: must be one of "
                                  f"{', '.join(entry.choices)}{hint}")


def check_patterns(config: ml_collections.ConfigDict) -> None:
    """One-line ConfigErrors for what would fail deep inside training: a regex in
    `optim.trainable` / `no_decay` / `lr_mults` (also in each stage) that does not compile, a
    malformed `lr_mults`, a negative `data.num_threads`."""
    for prefix, optim in _sections(config, "optim"):
        if not optim:
            continue
        for key in ("trainable", "no_decay"):
            if optim.get(key):
                _compile(f"{prefix}.{key}", optim[key])
        mults = optim.get("lr_mults") or []
        if not isinstance(mults, list | tuple):
            mults = [mults]
        for item in mults:
            if not (isinstance(item, list | tuple) and len(item) == 2
                    and isinstance(item[1], int | float) and not isinstance(item[1], bool)):
                raise ConfigError(f"{prefix}.lr_mults: {item!r} is not a [regex, factor] pair; "
                                  r"write e.g. [['xattn/\d+/\w+_gate', 10.0]]")
            _compile(f"{prefix}.lr_mults", item[0])
    threads = (config.get("data") or {}).get("num_threads")
    if isinstance(threads, int) and threads < 0:
        raise ConfigError(f"data.num_threads={threads}: must be 0 or more (the threads that "
                          "decode images; 0 reads them in the main thread)")


def _compile(key: str, pattern) -> None:
    if not isinstance(pattern, str):
        raise ConfigError(f"{key}={pattern!r}: must be a regex over parameter paths such as "
                          "'head/.*'")
    try:
        re.compile(pattern)
    except re.error as err:
        raise ConfigError(f"{key}={pattern!r} is not a regex ({err}); parameter paths look like "
                          "'head/kernel' or 'blocks/11/mlp/fc2/bias'") from None


def check_keys(config: ml_collections.ConfigDict, path: Path) -> None:
    """A misspelt key in the recipe file is a one-line ConfigError suggesting the nearest
    known keys, as a misspelt `--set` is: otherwise it would be silently ignored."""
    _check_section(config, "", TOP_KEYS, path)
    for section, known in SECTION_KEYS.items():
        if section == "model":  # ViTConfig's fields: checked once the model package is loaded
            continue
        _check_section(config.get(section), section, known, path)
        for name, stage in (config.get("stages") or {}).items():
            if isinstance(stage, ml_collections.ConfigDict):
                _check_section(stage.get(section), f"stages.{name}.{section}", known, path)
    for key, what in DERIVED_MODEL_FIELDS.items():
        if key in (config.get("model") or {}):
            raise ConfigError(f"{path}: model.{key} is not a recipe key: it comes from {what}; "
                              "remove it from the model section")


def _check_section(section, prefix: str, known: tuple[str, ...], path: Path) -> None:
    if not isinstance(section, ml_collections.ConfigDict):
        return
    dot = f"{prefix}." if prefix else ""
    for key in section:
        if key not in known:
            near = difflib.get_close_matches(key, list(dict.fromkeys(known)), n=3, cutoff=0.5)
            hint = (f"did you mean {', '.join(f'{dot}{k}' for k in near)}?" if near else
                    f"known keys: {', '.join(known)}")
            raise ConfigError(f"{path}: unknown key {dot}{key}; {hint}")


def _leaf_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            keys += _leaf_keys(value, name + ".")
        else:
            keys.append(name)
    return keys


def apply_overrides(config: ml_collections.ConfigDict, overrides, *,
                    model_field_types: Callable[[], dict[str, Any]] | None = None) -> None:
    """`["train.steps=100", "model.depth=2"]`; an unknown key lists the nearest known ones.

    A key is typed as the defaults type it (a stage's `optim.lr` as `optim.lr`), a model field
    by ViTConfig (when `model_field_types` is given), any other key by its current value.
    """
    keys = _leaf_keys(config)
    for item in overrides:
        key, text = split_item(item)
        *parents, leaf = key.split(".")
        expected = _expected(config, key, model_field_types)
        if expected is None:
            known = keys + [k for k in DEFAULTS if _section(config, k.split(".")[:-1])]
            if model_field_types is not None and key.startswith("model."):
                known += [f"model.{name}" for name in model_field_types()
                          if name not in DERIVED_MODEL_FIELDS]
            # A key both set and defaulted (model.dtype in the recipe and ViTConfig's fields)
            # is one suggestion.
            near = difflib.get_close_matches(key, list(dict.fromkeys(known)), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"--set {key}: no such config key{hint}")
        node = _section(config, parents)
        value = parse_value(key, text, expected, node.get(leaf))
        with node.unlocked():
            node[leaf] = value
        if key not in keys:
            keys.append(key)


def _section(config: ml_collections.ConfigDict, parents: list[str]):
    """The ConfigDict at `parents`, or None when there is none."""
    node = config
    for part in parents:
        node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    return node if isinstance(node, ml_collections.ConfigDict) else None


def _expected(config, key: str, model_field_types) -> Any:
    """The type `key` expects, or None when the code does not know the key."""
    *parents, leaf = key.split(".")
    node = _section(config, parents)
    if node is None:
        return None
    stage_key = ".".join(parents[2:] + [leaf]) if parents[:1] == ["stages"] else None
    declared = type_of(key) or (type_of(stage_key) if stage_key else None)
    if declared is not None:
        return declared
    if leaf in node and not isinstance(node[leaf], ml_collections.ConfigDict):
        return expected_type(node[leaf])
    if parents == ["model"] and model_field_types and leaf not in DERIVED_MODEL_FIELDS:
        return model_field_types().get(leaf)
    return None
