"""Device mesh and shardings: data parallel over a `data` axis, parameters replicated.

Everything jitted in training takes its shardings from here, so more devices or hosts change
the mesh shape, not the step. One device is a mesh of one.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vit.errors import ConfigError

DATA = "data"


def make_mesh(num_devices: int = 1) -> Mesh:
    """A 1-D mesh over the first `num_devices` devices (0: all of them, across hosts)."""
    devices = jax.devices()
    n = len(devices) if num_devices == 0 else num_devices
    if n > len(devices):
        raise ConfigError(f"train.num_devices={num_devices} but only {len(devices)} "
                          "device(s) are visible; use 0 for all of them")
    return Mesh(np.asarray(devices[:n]), (DATA,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the `data` axis."""
    return NamedSharding(mesh, PartitionSpec(DATA))


def host_batch_size(global_batch: int, mesh: Mesh) -> int:
    """This host's share of the global batch (each host feeds its own devices)."""
    n = mesh.devices.size
    if global_batch % n:
        raise ConfigError(f"train.batch_size={global_batch} is not divisible by the {n} "
                          "devices of the mesh")
    return global_batch // jax.process_count()


def to_global(batch: dict, mesh: Mesh) -> dict:
    """This host's numpy batch -> global arrays sharded over the mesh's `data` axis."""
    sharding = batch_sharded(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}
