"""Whether a resume fits the checkpoint it continues, and the one-line errors when it does not.

A resume continues the saved run as it was: the checkpoint's folders must all be there, the
recipe must keep what the checkpoint fixed (the model, the input pipeline, the shape of the
optimiser state), the dataset must have the checkpoint's class count. Each misfit names the key
or folder and the fix, before anything is built or written.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

from vit.checkpoints import orbax_format
from vit.cpu.features import AUTO
from vit.errors import CheckpointError, ConfigError
from vit.training.checkpointing import TrainCheckpoints

# What a resume takes from the checkpoint, not from the recipe: a changed value would be
# silently ignored (the saved model continues), so the resume refuses it.
FIXED_ON_RESUME = ("model.", "input.image_size", "input.resample", "input.crop_pct",
                   "input.mean", "input.std")
# Recipe keys that shape the optimiser state a checkpoint holds: another value cannot restore.
SHAPE_STATE = ("optim.name", "optim.trainable", "optim.clip_norm", "optim.layer_decay",
               "optim.lr_mults", "optim.momentum")
RESUME_FIX = ("a resume continues the saved run as it was: drop the --set (or undo the recipe "
              "edit), or give a new --workdir (with --init WORKDIR to start from its weights)")


def check_resume(config, ckpts: TrainCheckpoints, step: int, num_classes: int,
                 dataset: str, *, primary: bool = True) -> tuple[dict, Any]:
    """(`step`'s meta, the recipe the resume runs), once the run resuming from it is known to
    fit: its folders are all there, the recipe keeps what a resume cannot change, the dataset
    has the checkpoint's class count and `train.steps` is not below `step`. Each misfit is a
    one-line error naming the key or folder and the fix, raised before anything is built or
    written. A model key the saved recipe never had (one added to the recipes since, such as
    a shipped recipe's new `model.stem`) is dropped from the run's recipe with a note: the
    saved run continues as it was, and its config.json says so."""
    ema = config.train.ema_decay > 0
    items = [orbax_format.PARAMS, orbax_format.META, orbax_format.OPT_STATE, orbax_format.DATA_ITER,
             orbax_format.TRAIN_STATE] + ([orbax_format.EMA_PARAMS] if ema else [])
    damaged = ckpts.damaged_items(step, items)
    meta = {}
    if orbax_format.META not in damaged:
        try:
            meta = ckpts.read_meta(step)
        except Exception:  # an unreadable meta: the folder is damaged like a missing one
            damaged.append(orbax_format.META)
    recorded_ema = (meta.get("config") or {}).get("train", {}).get("ema_decay")
    if orbax_format.EMA_PARAMS in damaged and recorded_ema is not None and not recorded_ema > 0:
        raise ConfigError(f"train.ema_decay={config.train.ema_decay}: the run in "
                          f"{ckpts.directory.parent} was saved without EMA (train.ema_decay="
                          f"{recorded_ema}); {RESUME_FIX}")
    if damaged:
        raise CheckpointError(f"{ckpts.step_dir(step)} is damaged: its {', '.join(damaged)} "
                              f"folder is missing or empty; {_delete_fix(ckpts, step)}")
    changed = [c for c in changed_keys(config, meta, *FIXED_ON_RESUME)
               if not _same_dtype(c, meta)]
    # A model key the saved recipe lacks came later; the saved model (its meta) is built anyway.
    added = [c for c in changed if c[1] is _UNSET and c[0].startswith("model.")]
    changed = [c for c in changed if c not in added]
    if changed:
        raise ConfigError(f"{_describe(changed)} since step {step} was saved in "
                          f"{ckpts.directory.parent}; {RESUME_FIX}")
    saved_classes = (meta.get("model_config") or {}).get("num_classes", num_classes)
    if saved_classes != num_classes and meta.get("dataset") == dataset:
        raise ConfigError(
            f"data.name={dataset!r} has {num_classes} classes with data.labels="
            f"{config.data.get('labels')!r}, but the checkpoint at step {step} in "
            f"{ckpts.directory.parent} has {saved_classes}: it trained on other labels of the "
            "same dataset; set data.labels to those, or give a new --workdir")
    if saved_classes != num_classes:
        raise ConfigError(
            f"data.name={dataset!r} has {num_classes} classes, but the checkpoint at step {step} "
            f"in {ckpts.directory.parent} has {saved_classes} (trained on "
            f"{meta.get('dataset', 'another dataset')!r}); resume with that dataset, or give a "
            "new --workdir with --init WORKDIR to fine-tune its weights on this one")
    if step > config.train.steps:
        raise ConfigError(
            f"train.steps={config.train.steps} is below step {step}, the latest checkpoint in "
            f"{ckpts.directory.parent}: that run is already past it; set train.steps above "
            f"{step} to train it further, or give a new --workdir")
    return meta, _without(config, added, step, ckpts, primary)


def _without(config, added: list[tuple[str, Any, Any]], step: int, ckpts: TrainCheckpoints,
             primary: bool):
    """`config` less the `added` keys, each noted: the saved model was built without them."""
    if not added:
        return config
    config = copy.deepcopy(config)
    for key, _, now in added:
        *parents, leaf = key.split(".")
        section = config
        for name in parents:
            section = section[name]
        with section.unlocked():
            del section[leaf]
        if primary:
            print(f"note: {key}={now!r} is not in the recipe step {step} in "
                  f"{ckpts.directory.parent} was saved with (the key came later): the resume "
                  "continues that run as it was, without it", file=sys.stderr)
    return config


def _same_dtype(change: tuple[str, Any, Any], meta: dict) -> bool:
    """Whether a changed `model.dtype` still fits: a resume keeps the dtype the run was saved
    with (its meta's), so `auto` now fits any, and a dtype named now fits an `auto` that chose
    that same one."""
    key, before, now = change
    if key != "model.dtype":
        return False
    saved = (meta.get("model_config") or {}).get("dtype")
    return now == AUTO or (before == AUTO and now == saved)


def restore_error(err: Exception, ckpts: TrainCheckpoints, step: int, config=None,
                  meta: dict | None = None) -> Exception:
    """The one-line error for orbax's `err` restoring `step`: the optimiser section changed
    since the save (a `ConfigError` naming the keys), else a damaged folder or another
    optimiser (a `CheckpointError`). `config` and `meta` (the run's recipe and the step's
    meta) find the changed keys."""
    changed = [] if config is None else changed_keys(config, meta or {}, *SHAPE_STATE)
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    what = f"{type(err).__name__}: {first}"[:300]
    if changed:
        return ConfigError(
            f"{ckpts.step_dir(step)} does not fit this run's optimiser state ({what}): "
            f"{_describe(changed)} since step {step} was saved; {RESUME_FIX}")
    return CheckpointError(
        f"{ckpts.step_dir(step)} could not be restored ({what}); if the folder is damaged, "
        f"{_delete_fix(ckpts, step)}; if the recipe's optim section changed since, undo that")


def changed_keys(config, meta: dict, *prefixes: str) -> list[tuple[str, Any, Any]]:
    """[(key, the saved value, the current value)] for the recipe keys starting
    with one of `prefixes` that differ; none when the checkpoint did not record its recipe."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        return []
    now = _flat(json.loads(json.dumps(config.to_dict(), default=list)))
    before = _flat(saved)
    return [(key, before.get(key, _UNSET), now.get(key, _UNSET))
            for key in sorted(set(now) | set(before))
            if key.startswith(prefixes) and before.get(key, _UNSET) != now.get(key, _UNSET)]


class _Unset:
    def __repr__(self) -> str:
        return "(not set)"


_UNSET = _Unset()


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _describe(changed: list[tuple[str, Any, Any]]) -> str:
    """`model.depth=2 (was 1) has changed`, naming the first three changed keys."""
    parts = [f"{key}={now!r} (was {before!r})" for key, before, now in changed[:3]]
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{', '.join(parts)}{more} {'has' if len(changed) == 1 else 'have'} changed"


def _delete_fix(ckpts: TrainCheckpoints, step: int) -> str:
    previous = [s for s in ckpts.all_steps() if s < step]
    then = (f"resume from the previous checkpoint (step {previous[-1]})" if previous else
            "start the run again from step 0 (it is the only checkpoint)")
    return f"delete {ckpts.step_dir(step)} to {then}"
