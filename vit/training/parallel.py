"""Training's mesh from the recipe, the sharding rules and the multi-process start-up.

The mesh itself (a `data` and an `fsdp` axis, batches split over both) is `vit.device_mesh`'s;
the recipe's `parallel` section sizes it here. Parameters (and the optimiser
state and EMA built like them) follow `rules`: a list of (regex on the parameter path ->
PartitionSpec), first match wins. `"auto"` shards a leaf along its largest dimension divisible
by the `fsdp` axis (ZeRO-3 style) and replicates it when none is or `fsdp` is 1; `"replicated"`
is `PartitionSpec()`; a tuple such as `(None, "fsdp")` is a PartitionSpec as written. One
device is a mesh of one.
"""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vit.device_mesh import AXES, FSDP, make_mesh
from vit.errors import ConfigError

DEFAULT_RULES = ((".*", "auto"),)


def mesh_from_config(config) -> Mesh:
    p = config.parallel
    return make_mesh(p.data, p.fsdp)


# Sharding rules: (regex on "blocks/0/mlp/fc1/kernel"-style paths, spec).

def rules_from_config(config) -> tuple:
    rules = config.get("parallel", {}).get("rules", None) or DEFAULT_RULES
    out = []
    for item in rules:
        if len(item) != 2:
            raise ConfigError(f"parallel.rules: {item!r} is not a (regex, spec) pair")
        pattern, spec = item
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"parallel.rules: {pattern!r} is not a regex ({err})") from None
        out.append((pattern, spec if isinstance(spec, str) else tuple(spec)))
    return tuple(out)


def path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)


def spec_for(name: str, shape: tuple[int, ...], rules, fsdp_size: int) -> PartitionSpec:
    """The PartitionSpec of the leaf at path `name` with `shape`: the first rule whose regex
    is found in the path (unanchored: optimiser states prefix the parameter paths). Scalars
    (Adam's step count) are never split."""
    if not shape:
        return PartitionSpec()
    spec = next((spec for pattern, spec in rules if re.search(pattern, name)), "replicated")
    if spec == "replicated":
        return PartitionSpec()
    if spec == "auto":
        return largest_divisible(shape, fsdp_size)
    if len(spec) > len(shape) or any(a not in (None, *AXES) for a in spec):
        raise ConfigError(f"parallel.rules: {spec!r} for {name} (shape {shape}) is not a spec "
                          f"over the axes {AXES} with at most {len(shape)} entries")
    return PartitionSpec(*spec)


def largest_divisible(shape: tuple[int, ...], fsdp_size: int) -> PartitionSpec:
    """ZeRO-3: split the largest dimension that `fsdp_size` divides; else replicate."""
    if fsdp_size == 1:
        return PartitionSpec()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp_size == 0:
            return PartitionSpec(*([None] * dim + [FSDP]))
    return PartitionSpec()


def tree_shardings(tree, mesh: Mesh, rules=DEFAULT_RULES):
    """A NamedSharding for every leaf of `tree` (arrays or shape placeholders). Optimiser
    states carry the parameter paths inside theirs (`.../mu/blocks/0/...`), so the rules,
    searched anywhere in the path, shard them like the parameters they track."""
    fsdp_size = mesh.shape[FSDP]

    def one(path, leaf):
        spec = spec_for(path_name(path), tuple(np.shape(leaf)), rules, fsdp_size)
        for dim, axis in enumerate(spec):
            if axis is not None and np.shape(leaf)[dim] % mesh.shape[axis]:
                raise ConfigError(
                    f"parallel.rules: {path_name(path)} (shape {np.shape(leaf)}) cannot split "
                    f"dimension {dim} over {axis}={mesh.shape[axis]}; change the rule or use "
                    "\"auto\"")
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, tree)


# Processes.

def is_primary() -> bool:
    """Process 0 alone writes files (metrics, curves, config, best.json) and prints."""
    return jax.process_index() == 0


def cluster_detected(environ=None) -> bool:
    """A launcher that started several processes: SLURM, Open MPI or a multi-host TPU."""
    env = os.environ if environ is None else environ

    def more_than_one(key: str) -> bool:
        try:
            return int(env.get(key, "1")) > 1
        except ValueError:
            return False

    return (more_than_one("SLURM_NTASKS") or more_than_one("OMPI_COMM_WORLD_SIZE")
            or "," in env.get("TPU_WORKER_HOSTNAMES", ""))


def start_processes(coordinator: str | None = None, num_processes: int | None = None,
                    process_id: int | None = None) -> bool:
    """`jax.distributed.initialize` with the flags given, or with the cluster's own settings
    when one is detected; nothing on a plain machine (one process, never waiting for peers).
    Returns whether the run is multi-process. Call before anything touches the devices."""
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ConfigError("--coordinator, --num-processes and --process-id go together; "
                          "give all three (e.g. --coordinator 10.0.0.1:1234 --num-processes 2 "
                          "--process-id 0)")
    if all(given):
        if not 0 <= process_id < num_processes:
            raise ConfigError(f"--process-id {process_id} is not in 0..{num_processes - 1}")
        if ":" not in coordinator:
            raise ConfigError(f"--coordinator {coordinator}: expected HOST:PORT")
        jax.distributed.initialize(coordinator, num_processes, process_id)
        return True
    if cluster_detected():
        jax.distributed.initialize()  # the cluster's own detection (SLURM, MPI, TPU)
        return True
    return False


def allgather_json(value) -> list:
    """`[value of process 0, value of process 1, ...]` for a JSON-able `value`, on every
    process (each process's data-iterator state, for the checkpoint)."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    lengths = multihost_utils.process_allgather(np.int32(len(data)))
    padded = np.zeros(int(np.max(lengths)), np.uint8)
    padded[:len(data)] = data
    rows = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, lengths, strict=True)]
