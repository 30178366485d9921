"""The training state: what the step carries from one step to the next (parameters, optimiser
state, EMA) and where the data stream resumes; built fresh or restored from a checkpoint.

The optimiser is an argument, not built here: the caller picks the one the resumed step needs
(with staged training, the stage's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from vit import device_mesh
from vit.checkpoints import orbax_format
from vit.training import parallel
from vit.training.checkpointing import TrainCheckpoints
from vit.training.iterator_records import iterator_state_of_process
from vit.training.placement import Placement, abstract
from vit.training.resume import restore_error


@dataclass
class TrainState:
    """What the step carries from one step to the next, plus where the data stream resumes."""

    params: Any
    opt_state: Any
    ema: Any | None  # None: the run keeps no EMA
    iterator_state: dict | None = None  # None: the data stream starts from its beginning
    step: int = 0  # the steps taken: the next step's index (its dropout and data seed)


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
        raise restore_error(err, ckpts, step, config, meta) from None
    iterator_state = iterator_state_of_process(restored[orbax_format.DATA_ITER], step)
    if parallel.is_primary():
        print(f"resumed from step {step} ({ckpts.step_dir(step)})")
    return TrainState(restored[orbax_format.PARAMS], restored[orbax_format.OPT_STATE],
                      restored.get(orbax_format.EMA_PARAMS), iterator_state, step)

