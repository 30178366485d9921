"""Building or resuming what training starts from: the model, its parameters, the train state.

Three starts, one result: a fresh model from the recipe, a pretrained checkpoint (`--init`)
adapted to it, or the workdir's latest checkpoint. A resume rebuilds the model from the
checkpoint's own meta, not from the recipe, so editing the recipe cannot silently change the
architecture under a run: `check_resume` refuses such an edit, naming the key. The optimiser
is an argument, not built here: the caller picks the one the resumed step needs (with staged
training, the stage's).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit import device_mesh
from vit.checkpoints import orbax_format
from vit.data import Augment
from vit.errors import CheckpointError, ConfigError
from vit.models.config import ViTConfig, variant_config
from vit.models.vit import VisionTransformer
from vit.preprocess import Preprocessing
from vit.train import parallel
from vit.train.checkpointing import TrainCheckpoints
from vit.train.placement import Placement, abstract

# Model fields a fine-tuning config may change on a pretrained architecture.
TRAINING_FIELDS = ("dropout", "attention_dropout", "drop_path", "dtype", "remat",
                   "attention_impl")


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


def fresh_params(model_config: ViTConfig, seed: int):
    model = VisionTransformer(model_config, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def abstract_params(model_config: ViTConfig):
    """(graphdef, params as shape/dtype placeholders): the structure, without the FLOPs."""
    model = nnx.eval_shape(lambda: VisionTransformer(model_config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def start_from_init(init: str, config, num_classes: int):
    """(model config, params, preprocessing) from a pretrained checkpoint, fitted to the recipe
    by `load_checkpoint`: the recipe's image size, class count, text path (a plain checkpoint
    gets a freshly initialised one, gates at 0; a text checkpoint loses it in a plain recipe)
    and training fields; the checkpoint's architecture otherwise."""
    from vit.checkpoints import load_checkpoint

    size = config.input.image_size
    fields = model_fields(config)
    overrides = {k: v for k, v in fields.items() if k in TRAINING_FIELDS}
    try:
        loaded = load_checkpoint(init, image_size=size, num_classes=num_classes,
                                 text=fields.get("text"), **overrides)
    except ConfigError as err:  # the recipe's size or fields do not fit this checkpoint
        raise ConfigError(f"--init {init} with input.image_size={size}: {err}; set "
                          "input.image_size (and model fields) to fit the checkpoint") from None
    for message in loaded.warnings:
        print(f"note: {message}", file=sys.stderr)
    pre = loaded.preprocessing
    if config.input.mean is not None:  # an explicit normalisation in the config wins
        pre = Preprocessing(**{**pre.to_dict(), "mean": tuple(config.input.mean),
                               "std": tuple(config.input.std)})
    print(f"initialised from {init} ({loaded.source})")
    return loaded.config, jax.tree.map(jnp.asarray, loaded.params), pre


@dataclass(frozen=True)
class Model:
    """The architecture and input pipeline a run trains; what its checkpoints' meta records."""

    config: ViTConfig
    preprocessing: Preprocessing
    graphdef: Any


def build_model(config, num_classes: int, *, resume_meta: dict | None = None,
                init: str | None = None) -> tuple[Model, Any]:
    """(model, params). On resume (`resume_meta`, a checkpoint's meta) the params are
    placeholders for `restore_state` to fill; otherwise host arrays for `new_state`."""
    if resume_meta is not None:
        model_config = ViTConfig(**resume_meta["model_config"])
        pre = Preprocessing.from_dict(resume_meta["preprocessing"])
        graphdef, params = abstract_params(model_config)
    elif init:
        model_config, params, pre = start_from_init(init, config, num_classes)
        graphdef, _ = abstract_params(model_config)
    else:
        model_config = variant_config(config.model.name, num_classes=num_classes,
                                      image_size=config.input.image_size, **model_fields(config))
        pre = preprocessing_of(config)
        graphdef, params = fresh_params(model_config, config.seed)
    _note_dtype(model_config.dtype)
    return Model(model_config, pre, graphdef), params


def _note_dtype(dtype: str) -> None:
    """One line when the compute dtype asked for cannot pay on this machine."""
    from vit.ops.matmul import bfloat16_note

    note = bfloat16_note() if dtype == "bfloat16" else None
    if note and jax.process_index() == 0:
        print(f"vit train: note: {note}", file=sys.stderr)


# What a resume takes from the checkpoint, not from the recipe: a changed value would be
# silently ignored (the saved model continues), so the resume refuses it.
FIXED_ON_RESUME = ("model.", "input.image_size", "input.resample", "input.crop_pct",
                   "input.mean", "input.std")
# Recipe keys that shape the optimiser state a checkpoint holds: another value cannot restore.
SHAPE_STATE = ("optim.name", "optim.trainable", "optim.clip_norm", "optim.layer_decay",
               "optim.lr_mults", "optim.momentum")
_RESUME_FIX = ("a resume continues the saved run as it was: drop the --set (or undo the recipe "
               "edit), or give a new --workdir (with --init WORKDIR to start from its weights)")


def check_resume(config, ckpts: TrainCheckpoints, step: int, num_classes: int,
                 dataset: str) -> dict:
    """`step`'s meta, once the run resuming from it is known to fit: its folders are all
    there, the recipe keeps what a resume cannot change, the dataset has the checkpoint's class
    count and `train.steps` is not below `step`. Each misfit is a one-line error naming the
    key or folder and the fix, raised before anything is built or written."""
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
                          f"{recorded_ema}); {_RESUME_FIX}")
    if damaged:
        raise CheckpointError(f"{ckpts.step_dir(step)} is damaged: its {', '.join(damaged)} "
                              f"folder is missing or empty; {_delete_fix(ckpts, step)}")
    changed = changed_keys(config, meta, *FIXED_ON_RESUME)
    if changed:
        raise ConfigError(f"{_describe(changed)} since step {step} was saved in "
                          f"{ckpts.directory.parent}; {_RESUME_FIX}")
    saved_classes = (meta.get("model_config") or {}).get("num_classes", num_classes)
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
    return meta


def changed_keys(config, meta: dict, *prefixes: str) -> list[tuple[str, Any, Any]]:
    """[(key, value when `meta`'s step was saved, value now)] for the recipe keys starting
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
    earlier = [s for s in ckpts.all_steps() if s < step]
    then = (f"resume from the previous checkpoint (step {earlier[-1]})" if earlier else
            "start the run again from step 0 (it is the only checkpoint)")
    return f"delete {ckpts.step_dir(step)} to {then}"


@dataclass
class TrainState:
    """What the step carries from one step to the next, plus where the data stream resumes."""

    params: Any
    opt_state: Any
    ema: Any | None  # None: the run keeps no EMA
    iterator_state: dict | None = None  # None: the data stream starts from its beginning


def new_state(params, tx: optax.GradientTransformation, place: Placement, *,
              ema: bool) -> TrainState:
    """Fresh optimiser state for `params` (host values, the same on every process), each
    piece built straight into its sharding."""
    params = device_mesh.put(params, place.params)
    opt_state = jax.jit(tx.init, out_shardings=place.opt_state)(params)
    return TrainState(params, opt_state, jax.tree.map(jnp.copy, params) if ema else None)


def restore_state(ckpts: TrainCheckpoints, step: int, params, tx: optax.GradientTransformation,
                  place: Placement, *, ema: bool, config=None, meta: dict | None = None
                  ) -> TrainState:
    """`step`'s checkpoint, restored straight into `place`'s shardings (whatever mesh wrote
    it); `params` gives the structure (placeholders will do) and `tx` the optimiser state's.
    The data-iterator state is this process's. `config` and `meta` (the run's recipe and the
    step's meta) only word the error when the checkpoint does not fit."""
    opt_shape = jax.eval_shape(tx.init, params)
    try:
        restored = ckpts.restore(step, params=abstract(params, place.params),
                                 opt_state=abstract(opt_shape, place.opt_state),
                                 ema_params=abstract(params, place.ema) if ema else None)
    except Exception as err:  # orbax's errors for a damaged folder or another optimiser
        changed = [] if config is None else changed_keys(config, meta or {}, *SHAPE_STATE)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        what = f"{type(err).__name__}: {first}"[:300]
        if changed:
            raise ConfigError(
                f"{ckpts.step_dir(step)} does not fit this run's optimiser state ({what}): "
                f"{_describe(changed)} since step {step} was saved; {_RESUME_FIX}") from None
        raise CheckpointError(
            f"{ckpts.step_dir(step)} could not be restored ({what}); if the folder is damaged, "
            f"{_delete_fix(ckpts, step)}; if the recipe's optim section changed since, undo "
            "that") from None
    iterator_state = iterator_state_of_process(restored[orbax_format.DATA_ITER], step)
    if parallel.is_primary():
        print(f"resumed from step {step} ({ckpts.step_dir(step)})")
    return TrainState(restored[orbax_format.PARAMS], restored[orbax_format.OPT_STATE],
                      restored.get(orbax_format.EMA_PARAMS), iterator_state)


def iterator_states(local_state: dict) -> dict:
    """What a checkpoint records of the data stream: every process's iterator state (the
    same on each process, gathered), so a resumed multi-process run reads the same data."""
    return {"process_count": jax.process_count(),
            "per_process": parallel.allgather_json(local_state)}


def iterator_state_of_process(saved: dict, step: int) -> dict:
    """This process's iterator state from `iterator_states`' record. Each process reads its
    own shard of the data, so another process count would read other data from this point:
    refused rather than silently replaying or skipping examples."""
    count, now = saved["process_count"], jax.process_count()
    if count != now:
        raise ConfigError(
            f"the checkpoint at step {step} was written by {count} process(es) and this run "
            f"has {now}: each process reads its own shard of the data, so resuming would "
            f"replay or skip examples; resume with {count} process(es), or start a new workdir "
            "from its weights with --init WORKDIR")
    return saved["per_process"][jax.process_index()]
