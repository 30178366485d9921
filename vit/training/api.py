"""`vit.train(config, workdir, overrides=..., data=...)`: training from Python, as `vit train`
runs it; the command calls this.

    import vit

    metrics = vit.train("digits", "runs/digits", overrides={"train.steps": 200})
    metrics = vit.train("digits", "runs/mine", data=(images, labels))  # numpy arrays
    print(metrics["val_accuracy"], metrics["stopped_by"])

`config` is a shipped recipe's name (`vit train --list-configs`), a recipe file, or an
`ml_collections.ConfigDict` (a recipe's `get_config()` or a loaded config). `overrides` are
`--set` items (`["train.steps=200"]`) or a dict of them. `data` replaces the recipe's dataset:
a name or folder as `data.name` takes it, or the caller's own examples (see
`vit.training.user_data`): `(images, labels)` arrays, `{"image": ..., "label": ...}`, a grain-style
random-access source, or `{"train": ..., "validation": ...}` of those. The workdir is resumed
when it holds a run, as with the command.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vit.errors import ConfigError


def train(config, workdir: str | os.PathLike, *, overrides: Sequence[str] | Mapping = (),
          data: Any = None, init: str | None = None, class_names: Sequence[str] | None = None,
          stop_after: int | None = None) -> dict:
    """Trains (or resumes) `config` into `workdir`; returns the final metrics.

    The result holds the last training record (`step`, `loss`, `accuracy`, `lr`,
    `images_per_s`, `data_wait`), the last validation (`val_loss`, `val_accuracy`),
    `best_val_accuracy`, and `stopped_by`: None when the run reached `train.steps`,
    `"early_stop"` when validation stopped improving (`train.early_stop_patience`), or the
    signal that interrupted it. `init` is a checkpoint to start from (as `--init`);
    `class_names` names the classes of own examples (default: their label indices);
    `stop_after` runs at most that many steps in this call, then saves.
    Mistakes raise `vit.errors.ConfigError` / `DataError` with one line saying the fix.
    """
    from vit.training.user_data import OWN, as_sources

    sets = override_items(overrides)
    sources = None
    if data is not None:
        name, sources = as_sources(data, class_names)
        if name is not None:
            sets.append(f"data.name={name}")
        else:
            val = "validation" if "validation" in sources else ""
            sets += [f"data.name={OWN}", f"data.val_split={val}"]
    config = resolve_config(config, sets)
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"workdir {workdir}: is an existing file, not a folder; give a new "
                          "or existing folder")
    if "stages" in config:  # several stages, each a run of the loop (vit/training/stages.py)
        from vit.training.stages import train_stages as run
    else:
        from vit.training.loop import train as run
    return run(config, workdir, init=init, stop_after=stop_after, sources=sources)


def resolve_config(config, overrides: Sequence[str] = ()):
    """The full, checked config of a recipe name, file or ConfigDict, with `overrides`."""
    import ml_collections

    from vit.recipes.load import finish_config, load_config
    from vit.recipes.model_fields import model_field_types

    if isinstance(config, ml_collections.ConfigDict):
        return finish_config(config, "the config", list(overrides),
                             model_field_types=model_field_types)
    if not isinstance(config, str | os.PathLike):
        raise ConfigError(f"config: {type(config).__name__} is not a recipe; give a shipped "
                          "recipe's name ('digits'), a recipe file or an ml_collections "
                          "ConfigDict")
    return load_config(config, list(overrides), model_field_types=model_field_types)


def override_items(overrides: Sequence[str] | Mapping) -> list[str]:
    """`--set` items from a list of them or a `{key: value}` dict (values typed as Python
    gives them: numbers, bools, None, strings, lists)."""
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, Mapping):
        return list(overrides)
    return [f"{key}={_text(value)}" for key, value in overrides.items()]


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, list | tuple):
        items = ", ".join(_text(v) if not isinstance(v, str) else repr(v) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' * (len(value) == 1)})"
    return str(value)
