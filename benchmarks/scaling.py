"""Training throughput of ViT-Ti/16 on 1, 2, 4 and 8 devices, for a data mesh and an fsdp
mesh: `vit train`'s own step (benchmarks/train_step.py: the recipe's optimiser, sharding by
`parallel.py`'s rules, batches through `to_global`), one fixed global batch.

Each (devices, mesh) pair runs in its own process with `--xla_force_host_platform_device_count`
(the device count is fixed when JAX starts). On one CPU the forced "devices" share the same
cores, so this measures the cost of partitioning (collectives, resharding, smaller per-device
matmuls), not a speed-up; on a GPU node run it with `--platform gpu` and the device counts
that exist. Records steps/s and images/s, each run's ratio to the one-device run of the same
invocation, the parameter bytes per device and each process's peak memory.

    python -m benchmarks scaling [--image-size 224] [--batch 16] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks import common, memory, train_step

MESHES = {"data": lambda n: (n, 1), "fsdp": lambda n: (1, n)}
CLASSES = 10


def side(mesh_kind: str, image_size: int, batch: int, steps: int, warmup: int) -> dict:
    import jax
    import numpy as np

    from vit import device_mesh

    data, fsdp = MESHES[mesh_kind](jax.device_count())
    config = train_step.load_recipe([
        *train_step.ADAMW, "model.name=Ti/16", "model.dtype=float32",
        f"input.image_size={image_size}", f"train.batch_size={batch}",
        f"parallel.data={data}", f"parallel.fsdp={fsdp}"])
    step = train_step.build(config, CLASSES)
    rng = np.random.default_rng(0)
    host = step.batch(rng.normal(size=(batch, image_size, image_size, 3)),
                      rng.integers(0, CLASSES, batch))
    for _ in range(warmup):
        m = step(step.put(host))
    jax.block_until_ready(m)
    t = time.perf_counter()
    for _ in range(steps):  # as the training loop: no host read between steps
        m = step(step.put(host))
    jax.block_until_ready((step.params, m))
    seconds = time.perf_counter() - t
    return {"devices": jax.device_count(),
            "mesh": dict(zip(device_mesh.AXES, step.mesh.devices.shape, strict=True)),
            "steps_per_s": steps / seconds, "images_per_s": steps * batch / seconds,
            "param_bytes_per_device": memory.bytes_per_device(step.params),
            "loss": float(m["loss"]), **memory.probe()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks scaling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=16, help="global batch (all devices)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (compile)")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"),
                        help="cpu forces host devices; gpu uses the first N real GPUs")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)

    runs, load_before = [], os.getloadavg()
    for n in map(int, args.devices.split(",")):
        if args.platform == "cpu":
            env = {"JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
        else:  # the first n real GPUs
            env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(n)))}
        for kind in MESHES:
            if n == 1 and kind == "fsdp":
                continue  # the same one-device run
            run = {"kind": kind, **common.run_side(
                "benchmarks.scaling:side", {"mesh_kind": kind, "image_size": args.image_size,
                                            "batch": args.batch, "steps": args.steps,
                                            "warmup": args.warmup}, env=env)}
            runs.append(run)
            print(f"{n} device(s), {kind}: {run['steps_per_s']:.2f} steps/s, "
                  f"{run['images_per_s']:.1f} img/s, "
                  f"{run['param_bytes_per_device'] / 2**20:.1f} MiB params/device", flush=True)
    one = next(r for r in runs if r["devices"] == 1)
    for r in runs:
        r["images_per_s_vs_1_device"] = r["images_per_s"] / one["images_per_s"]
    path = common.write_record("scaling", {
        "setup": f"ViT-Ti/16 training step (vit train's, AdamW), global batch {args.batch}, "
                 f"{args.image_size} px, float32, data vs fsdp meshes",
        "devices": args.platform,
        "load_average_before": [round(x, 2) for x in load_before],
        "timed_steps_per_run": args.steps,
        "runs": runs,
        "note": args.note or ("forced host devices share one CPU: this is the overhead of "
                              "partitioning, not a speed-up" if args.platform == "cpu" else ""),
    }, argv=argv, out=args.out)
    print(f"-> {path}")
