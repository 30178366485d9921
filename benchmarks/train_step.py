"""`vit train`'s own training program (`build_program`) for the benchmarks that time its step:
`program.batch(images, labels)`, `program.put(batch)`, `program(batch)`; no data is read."""

from __future__ import annotations

import numpy as np

from benchmarks.common import ROOT

RECIPE = ROOT / "configs" / "imagefolder.py"
# AdamW at its full rate from the first step, so a peer's optimiser runs the same updates.
ADAMW = ("optim.name=adamw", "optim.lr=0.0001", "optim.weight_decay=0.05",
         "optim.warmup_steps=0", "optim.schedule=constant")


def load_recipe(sets=(), path=RECIPE):
    from vit.commands.train import model_field_types
    from vit.recipes.load import load_config

    return load_config(path, list(sets), model_field_types=model_field_types)


def initial_weights(config, num_classes: int):
    """The weights `build`'s program starts from, as a `LoadedCheckpoint`."""
    from vit.checkpoints import LoadedCheckpoint
    from vit.checkpoints.tree import flatten, nest
    from vit.training.model import build_model

    model, params = build_model(config, num_classes, init=config.get("init") or None)
    params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
    return LoadedCheckpoint(model.config, params, model.preprocessing)


def build(config, num_classes: int):
    from vit.training.program import build_program

    return build_program(config, num_classes, init=config.get("init") or None)
