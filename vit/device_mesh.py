"""The device mesh and what lives on it: one `data` x `fsdp` mesh, batches split over both
axes, whole copies of parameters where a layer needs them. Training (`vit.train`) and inference
(`vit.inference`) both build their meshes here; one device is a mesh of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from vit.errors import ConfigError

DATA, FSDP = "data", "fsdp"
AXES = (DATA, FSDP)
BATCH = PartitionSpec(AXES)  # leading (batch) axis split over every mesh axis


def mesh_shape(data: int, fsdp: int, num_devices: int) -> tuple[int, int]:
    """`(data, fsdp)` with one `-1` resolved to the devices left; a one-line error when the
    axes do not fit `num_devices`."""
    sizes = {DATA: data, FSDP: fsdp}
    if any(v == 0 or v < -1 for v in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise ConfigError(f"parallel.data={data}, parallel.fsdp={fsdp}: each must be a "
                          "positive size, or -1 (once) for all remaining devices")
    known = math.prod(v for v in sizes.values() if v != -1)
    if -1 in sizes.values():
        if num_devices % known:
            raise ConfigError(f"parallel.data={data}, parallel.fsdp={fsdp}: {num_devices} "
                              f"devices do not divide by {known}; {_fits(num_devices)}")
        sizes = {k: (num_devices // known if v == -1 else v) for k, v in sizes.items()}
    if math.prod(sizes.values()) != num_devices:
        raise ConfigError(f"parallel.data={data} x parallel.fsdp={fsdp} is "
                          f"{math.prod(sizes.values())} devices, but {num_devices} are "
                          f"visible; {_fits(num_devices)}")
    return sizes[DATA], sizes[FSDP]


def _fits(n: int) -> str:
    pairs = [f"data={n // f} fsdp={f}" for f in range(1, n + 1) if n % f == 0]
    return f"use data=-1 (all), or one of: {', '.join(pairs)}"


def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence | None = None) -> Mesh:
    """A `data` x `fsdp` mesh over `devices` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(data, fsdp, len(devices))
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def local_mesh() -> Mesh:
    """Every device of this process on the `data` axis: `vit eval` and `vit predict`."""
    return make_mesh(devices=jax.local_devices())


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the `data` and `fsdp` axes."""
    return NamedSharding(mesh, BATCH)


def gathered_for_use(params, mesh: Mesh):
    """Inside a jitted function: `params` constrained to whole copies, so XLA all-gathers each
    fsdp-sharded weight for the layer that uses it (and reduce-scatters its gradient) while the
    activations stay split by batch. Without it XLA may instead split the activations by
    feature to match the weights, and all-reduce them at every layer."""
    if mesh.shape[FSDP] == 1:
        return params
    return jax.tree.map(lambda p: jax.lax.with_sharding_constraint(p, replicated(mesh)), params)


def host_batch_size(global_batch: int, mesh: Mesh, what: str = "train.batch_size") -> int:
    """This process's share of the global batch (each process feeds its own devices)."""
    n = mesh.devices.size
    if global_batch % n:
        lo, hi = (global_batch // n) * n, -(-global_batch // n) * n
        raise ConfigError(f"{what}={global_batch} does not split over the {n} devices of the "
                          f"mesh (data={mesh.shape[DATA]} x fsdp={mesh.shape[FSDP]}); use a "
                          f"multiple of {n}, e.g. {hi if lo == 0 else f'{lo} or {hi}'}")
    return global_batch // jax.process_count()


def eval_host_batch_size(global_batch: int, mesh: Mesh) -> int:
    """Evaluation pads its batches, so a size the mesh does not divide is rounded up."""
    n = mesh.devices.size
    return -(-global_batch // n) * n // jax.process_count()


def to_global(batch: dict, mesh: Mesh) -> dict:
    """This process's numpy batch -> global arrays split over the mesh's batch axes."""
    sharding = batch_sharded(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}


def put(tree, shardings):
    """Host values (the same on every process) -> global arrays with `shardings` (a tree like
    `tree`); each process builds only its own shards, so nothing is gathered on one device."""
    def one(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree, shardings)


def on_local_devices(forward, batch_size: int, num_args: int):
    """(batch size rounded up to the local device count, `forward` jitted with its second
    argument, the images, split over those devices and everything else replicated)."""
    mesh = local_mesh()
    whole, split = replicated(mesh), batch_sharded(mesh)
    shardings = (whole, split) + (whole,) * (num_args - 2)
    n = mesh.devices.size
    return -(-batch_size // n) * n, jax.jit(forward, in_shardings=shardings, out_shardings=whole)
