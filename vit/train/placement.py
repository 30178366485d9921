"""Where the training state and batches live on the mesh.

Every sharding the training code uses (the jitted step's, the first `device_put`, the restore
targets) is read from a `Placement`, and every one of those comes from a `parallel` call made
in `Placement.of`. Scaling out (sharded parameters, a model axis) changes `parallel.py` and
this file, not the step, the state builders or the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from vit.train import parallel


@dataclass(frozen=True)
class Placement:
    """Shardings (or trees of them) for each piece of the step's inputs and outputs."""

    params: Any
    opt_state: Any
    ema: Any
    batch: Any
    metrics: Any  # the step's scalar outputs

    @classmethod
    def of(cls, mesh) -> Placement:
        """Data parallel: state replicated, batches split over the `data` axis."""
        rep = parallel.replicated(mesh)
        return cls(params=rep, opt_state=rep, ema=rep, batch=parallel.batch_sharded(mesh),
                   metrics=rep)


def abstract(tree, sharding):
    """`tree` as shape/dtype placeholders carrying `sharding`: what a restore fills in."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        tree)
