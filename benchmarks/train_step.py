"""`vit train`'s training program for the benchmarks that time its step: `build` is
`vit.training.program.build_program`, the one builder `vit train` itself runs, on a recipe
(fresh weights from its seed, or its `init`). No data is read: `program.batch(images, labels)`
makes the batch the pipeline would (one-hot targets, the recipe's label smoothing),
`program.put` places it, and `program(batch)` runs one step.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import ROOT

RECIPE = ROOT / "configs" / "imagefolder.py"
# What the timing benchmarks set on a recipe: AdamW at its full rate from the first step, so a
# peer library's optimiser can run the same updates.
ADAMW = ("optim.name=adamw", "optim.lr=0.0001", "optim.weight_decay=0.05",
         "optim.warmup_steps=0", "optim.schedule=constant")


def load_recipe(sets=(), path=RECIPE):
    """The recipe at `path` with `--set` overrides, checked as `vit train` checks them."""
    from vit.commands.train import model_field_types
    from vit.recipes.load import load_config

    return load_config(path, list(sets), model_field_types=model_field_types)


def initial_weights(config, num_classes: int):
    """The recipe's model with the weights `build`'s program starts from, as a
    `LoadedCheckpoint` (to write for another library: the same seed gives the same weights)."""
    from vit.checkpoints import LoadedCheckpoint
    from vit.checkpoints.tree import flatten, nest
    from vit.training.model import build_model

    model, params = build_model(config, num_classes, init=config.get("init") or None)
    params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
    return LoadedCheckpoint(model.config, params, model.preprocessing)


def build(config, num_classes: int):
    """`vit train`'s program (`TrainProgram`) for `config` (a loaded recipe) with
    `num_classes` classes; `--set train.micro_tokens=0` runs a CPU step's batch whole."""
    from vit.training.program import build_program

    return build_program(config, num_classes, init=config.get("init") or None)
