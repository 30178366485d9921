"""`vit train`'s jitted step for the benchmarks that time it, built from a recipe with the
package's own functions in the order vit/training/loop.py calls them: the recipe's model (fresh
weights from its seed), the optimiser `make_optimizer` builds (clipping, weight-decay mask,
schedule), `Placement` on the recipe's mesh, `new_state`, and `make_train_step` with the
recipe's loss and its metrics. No data is read: batches are given, with the targets the data
pipeline would make of their labels (one-hot, the recipe's label smoothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    """The recipe's model with the weights `TrainStep` starts from, as a `LoadedCheckpoint`
    (to write for another library: the same seed gives the same weights)."""
    from vit.checkpoints import LoadedCheckpoint
    from vit.checkpoints.tree import flatten, nest
    from vit.training.model import build_model

    model, params = build_model(config, num_classes, init=config.get("init") or None)
    params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
    return LoadedCheckpoint(model.config, params, model.preprocessing)


@dataclass
class TrainStep:
    """The step and the state it carries; calling it runs one training step."""

    config: Any
    model: Any  # vit.training.model.Model: its config, preprocessing and graphdef
    num_classes: int
    mesh: Any
    step_fn: Any
    params: Any
    opt_state: Any
    ema: Any
    step: int = 0

    def batch(self, images: np.ndarray, labels: np.ndarray) -> dict:
        """Host batch from NHWC float32 images and integer labels, as the pipeline makes it."""
        from vit.data.transforms import one_hot

        return {"image": images.astype(np.float32), "label": labels.astype(np.int32),
                "target": one_hot(labels, self.num_classes,
                                  self.config.input.get("label_smoothing", 0.0))}

    def put(self, batch: dict) -> dict:
        """A host batch as the step's global arrays, split over the mesh (the loop's
        `to_global`)."""
        from vit import device_mesh

        return device_mesh.to_global(batch, self.mesh)

    def __call__(self, batch: dict) -> dict:
        """One step on a batch from `put`; returns its metrics (device arrays, not waited
        for)."""
        self.params, self.opt_state, self.ema, metrics = self.step_fn(
            self.params, self.opt_state, self.ema, batch, self.config.seed, self.step)
        self.step += 1
        return metrics


def build(config, num_classes: int, whole_batch: bool = False) -> TrainStep:
    """`vit train`'s step for `config` (a loaded recipe) with `num_classes` classes.
    `whole_batch`: the step without splitting a large batch into cache-sized micro-batches on a
    CPU (vit/training/step.py `MICRO_TOKENS`), for comparison."""
    from vit.training import parallel
    from vit.training.losses import DEFAULT, TEXT_LOSSES, get_loss
    from vit.training.model import build_model
    from vit.training.optim import make_optimizer
    from vit.training.placement import Placement
    from vit.training.state import new_state
    from vit.training.step import MICRO_TOKENS, make_train_step

    tc = config.train
    loss_name = tc.get("loss", DEFAULT)
    if loss_name in TEXT_LOSSES:
        raise SystemExit(f"train.loss={loss_name}: batches with prompts are not made here")
    mesh = parallel.mesh_from_config(config)
    model, params = build_model(config, num_classes, init=config.get("init") or None)
    tx, _ = make_optimizer(config.optim, params, model.config.depth, tc.steps)
    place = Placement.of(mesh, params, tx, parallel.rules_from_config(config))
    state = new_state(params, tx, place, ema=tc.ema_decay > 0)
    step_fn = make_train_step(model.graphdef, tx, place, accum_steps=tc.accum_steps,
                              compute_dtype=model.config.dtype, ema_decay=tc.ema_decay,
                              loss_fn=get_loss(loss_name),
                              micro_tokens=None if whole_batch else MICRO_TOKENS)
    return TrainStep(config, model, num_classes, mesh, step_fn, state.params,
                     state.opt_state, state.ema)
