"""Building or resuming what training starts from: the model, its parameters, the train state.

Three starts, one result: a fresh model from the recipe, a pretrained checkpoint (`--init`)
adapted to it, or the workdir's latest checkpoint. A resume rebuilds the model from the
checkpoint's own meta, not from the recipe, so editing the recipe cannot silently change the
architecture under a run. The optimiser is an argument, not built here: the caller picks the
one the resumed step needs (with staged training, the stage's).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit.checkpoints import layout
from vit.data import Augment
from vit.errors import ConfigError
from vit.models.config import ViTConfig, get_config
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
    """(model config, params, preprocessing) from a pretrained checkpoint, adapted."""
    from vit.checkpoints import load_checkpoint
    from vit.train.init import adapt_params

    size = config.input.image_size
    # The recipe decides whether the model reads text: a plain checkpoint gets a freshly
    # initialised text path (gates at 0), a text checkpoint loses it in a plain recipe.
    loaded = load_checkpoint(init, image_size=size, text=model_fields(config).get("text"))
    for message in loaded.warnings:
        print(f"note: {message}", file=sys.stderr)
    overrides = {k: v for k, v in model_fields(config).items() if k in TRAINING_FIELDS}
    model_config = loaded.config.replace(num_classes=num_classes, image_size=(size, size),
                                         **overrides)
    _, template = abstract_params(model_config)
    params = adapt_params(loaded.params, loaded.config, model_config, dst_template=template)
    pre = loaded.preprocessing.with_size(size)
    if config.input.mean is not None:  # an explicit normalisation in the config wins
        pre = Preprocessing(**{**pre.to_dict(), "mean": tuple(config.input.mean),
                               "std": tuple(config.input.std)})
    print(f"initialised from {init} ({loaded.source}); head "
          f"{'kept' if loaded.config.num_classes == num_classes else 'replaced (zeros)'}")
    return model_config, jax.tree.map(jnp.asarray, params), pre


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
        model_config = get_config(config.model.name, num_classes=num_classes,
                                  image_size=config.input.image_size, **model_fields(config))
        pre = preprocessing_of(config)
        graphdef, params = fresh_params(model_config, config.seed)
    return Model(model_config, pre, graphdef), params


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
    params = parallel.put(params, place.params)
    opt_state = jax.jit(tx.init, out_shardings=place.opt_state)(params)
    return TrainState(params, opt_state, jax.tree.map(jnp.copy, params) if ema else None)


def restore_state(ckpts: TrainCheckpoints, step: int, params, tx: optax.GradientTransformation,
                  place: Placement, *, ema: bool) -> TrainState:
    """`step`'s checkpoint, restored straight into `place`'s shardings (whatever mesh wrote
    it); `params` gives the structure (placeholders will do) and `tx` the optimiser state's.
    The data-iterator state is this process's."""
    opt_shape = jax.eval_shape(tx.init, params)
    restored = ckpts.restore(step, params=abstract(params, place.params),
                             opt_state=abstract(opt_shape, place.opt_state),
                             ema_params=abstract(params, place.ema) if ema else None)
    iterator_state = iterator_state_of_process(restored[layout.DATA_ITER], step)
    if parallel.is_primary():
        print(f"resumed from step {step} ({ckpts.step_dir(step)})")
    return TrainState(restored[layout.PARAMS], restored[layout.OPT_STATE],
                      restored.get(layout.EMA_PARAMS), iterator_state)


def iterator_states(local_state: dict) -> dict:
    """What a checkpoint records of the data stream: every process's iterator state (the
    same on each process, gathered), so a resumed multi-process run reads the same data."""
    return {"process_count": jax.process_count(),
            "per_process": parallel.allgather_json(local_state)}


def iterator_state_of_process(saved: dict, step: int) -> dict:
    """This process's iterator state from `iterator_states`' record. Each process reads its
    own shard of the data, so another process count would read other data from this point:
    refused rather than silently replaying or skipping examples."""
    if "per_process" not in saved:  # written by one process before the record had this form
        saved = {"process_count": 1, "per_process": [saved]}
    count, now = saved["process_count"], jax.process_count()
    if count != now:
        raise ConfigError(
            f"the checkpoint at step {step} was written by {count} process(es) and this run "
            f"has {now}: each process reads its own shard of the data, so resuming would "
            f"replay or skip examples; resume with {count} process(es), or start a new workdir "
            "from its weights with --init WORKDIR")
    return saved["per_process"][jax.process_index()]
