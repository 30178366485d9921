"""The model a run trains: fresh from the recipe, a pretrained checkpoint (`--init`) fitted
to it, or rebuilt from a resumed checkpoint's own meta.

A resume rebuilds the model from the checkpoint's meta, not from the recipe, so editing the
recipe cannot silently change the architecture under a run (`vit.training.resume` refuses such an
edit, naming the key).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit.cpu.features import bfloat16_note
from vit.errors import ConfigError
from vit.models.config import ViTConfig, variant_config
from vit.models.vit import VisionTransformer
from vit.preprocess import Preprocessing
from vit.training.from_recipe import dtype_line, model_fields, preprocessing_of

# Model fields a fine-tuning config may change on a pretrained architecture.
TRAINING_FIELDS = ("dropout", "attention_dropout", "drop_path", "dtype", "remat",
                   "attention_impl")


def fresh_params(model_config: ViTConfig, seed: int):
    """(graphdef, params) of a new model: its initialisers run as one compiled program (one
    compile, kept by the compilation cache, where eager initialisation compiles each random
    draw of each layer on its own), the same draws as `VisionTransformer(...)` eagerly up to
    float32 rounding."""
    graphdef, _ = abstract_params(model_config)
    return graphdef, draw_params(model_config, seed)()


def draw_params(model_config: ViTConfig, seed: int):
    """The jitted program of a new model's initialisers (`fresh_params`' draws): its compile
    and run are the part of a fresh model that costs, so the caller chooses when."""

    @jax.jit
    def init():
        model = VisionTransformer(model_config, rngs=nnx.Rngs(seed))
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))

    return init


def abstract_params(model_config: ViTConfig):
    """(graphdef, params as shape/dtype placeholders): the structure, without the FLOPs."""
    model = nnx.eval_shape(lambda: VisionTransformer(model_config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def start_from_init(init: str, config, num_classes: int, named: str = "--init"):
    """(model config, params, preprocessing) from a pretrained checkpoint, fitted to the recipe
    by `load_checkpoint`: the recipe's image size, class count, text path (a plain checkpoint
    gets a freshly initialised one, gates at 0; a text checkpoint loses it in a plain recipe)
    and training fields; the checkpoint's architecture otherwise. `named` is how the user gave
    the checkpoint (`--init`, or the recipe's `init`), for the errors."""
    from vit.checkpoints import load_checkpoint

    size = config.input.image_size
    fields = model_fields(config)
    overrides = {k: v for k, v in fields.items() if k in TRAINING_FIELDS}
    try:
        loaded = load_checkpoint(init, image_size=size, num_classes=num_classes, named=named,
                                 text=fields.get("text"), **overrides)
    except ConfigError as err:  # the recipe's size or fields do not fit this checkpoint
        raise ConfigError(f"{named} {init} with input.image_size={size}: {err}; set "
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
                init: str | None = None) -> tuple[Model, Any, Callable[[], Any]]:
    """(model, its params as shape/dtype placeholders, a function that makes the params).

    On resume (`resume_meta`, a checkpoint's meta) the function gives the placeholders, for
    `restore_state` to fill. From `init` (`--init`, which wins over the recipe's own `init`
    key) the checkpoint is read here, so one that does not fit is refused before anything
    runs, and the function gives its host arrays. Fresh params are drawn when the function is
    called: the step needs only the placeholders to compile, so the two can run side by side."""
    if resume_meta is not None:  # the saved dtype continues, whatever `auto` would choose
        model_config = ViTConfig.from_dict(resume_meta["model_config"])
        pre = Preprocessing.from_dict(resume_meta["preprocessing"])
        graphdef, shapes = abstract_params(model_config)
        make_params = lambda: shapes  # noqa: E731
    elif init or config.get("init"):
        _announce(dtype_line(config))
        model_config, params, pre = start_from_init(init or config.init, config, num_classes,
                                                    "--init" if init else "init")
        graphdef, _ = abstract_params(model_config)
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        make_params = lambda: params  # noqa: E731
    else:
        _announce(dtype_line(config))
        model_config = variant_config(config.model.name, num_classes=num_classes,
                                      image_size=config.input.image_size, **model_fields(config))
        pre = preprocessing_of(config)
        graphdef, shapes = abstract_params(model_config)
        make_params = draw_params(model_config, config.seed)
    _note_dtype(model_config.dtype)
    return Model(model_config, pre, graphdef), shapes, make_params


def _note_dtype(dtype: str) -> None:
    """One line when the compute dtype asked for cannot pay on this machine."""
    note = bfloat16_note() if dtype == "bfloat16" else None
    if note and jax.process_index() == 0:
        print(f"vit train: note: {note}; choose it with --set model.dtype=float32 (or auto: "
              "the host chooses)", file=sys.stderr)


def _announce(line: str | None) -> None:
    """Prints `line` from process 0 alone: once a run (once a stage of a staged one)."""
    if line and jax.process_index() == 0:
        print(line, flush=True)
