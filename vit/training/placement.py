"""Where the training state and batches live on the mesh.

Every sharding the training code uses (the jitted step's, the first `device_put`, the restore
targets) is read from a `Placement`, and every one of those comes from a `parallel` call made
in `Placement.of`. Scaling out (a model axis, other rules) changes `parallel.py` and this
file, not the step, the state builders or the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import optax

from vit import device_mesh
from vit.training import parallel


@dataclass(frozen=True)
class Placement:
    """Shardings (or trees of them) for each piece of the step's inputs and outputs."""

    mesh: Any
    params: Any
    opt_state: Any
    ema: Any
    batch: Any
    metrics: Any  # the step's scalar outputs

    @classmethod
    def of(cls, mesh, params, tx: optax.GradientTransformation,
           rules=parallel.DEFAULT_RULES) -> Placement:
        """`params` (arrays or placeholders) and the optimiser state `tx` builds for them,
        sharded by `rules` (replicated when the mesh's `fsdp` axis is 1); batches split over
        the mesh."""
        params_sharding = parallel.tree_shardings(params, mesh, rules)
        opt_shape = jax.eval_shape(tx.init, params)
        return cls(mesh=mesh, params=params_sharding,
                   opt_state=parallel.tree_shardings(opt_shape, mesh, rules),
                   ema=params_sharding, batch=device_mesh.batch_sharded(mesh),
                   metrics=device_mesh.replicated(mesh))


def abstract(tree, sharding):
    """`tree` as shape/dtype placeholders carrying `sharding` (one, or a tree like `tree`):
    what a restore fills in, or what a program compiles for (weak types kept, so the program
    takes the arrays themselves)."""
    def one(x, s):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s,
                                    weak_type=getattr(x, "weak_type", False))

    if not isinstance(sharding, jax.sharding.Sharding):
        return jax.tree.map(one, tree, sharding)
    return jax.tree.map(lambda x: one(x, sharding), tree)
