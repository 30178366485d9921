"""Training throughput of ViT-Ti/16 on 1, 2, 4 and 8 devices, for a data mesh and an fsdp
mesh: the real `vit.train` step (AdamW, sharding by `parallel.py`'s rules, batches through
`to_global`), one fixed global batch.

Each (devices, mesh) pair runs in its own process with `--xla_force_host_platform_device_count`
(the device count is fixed when JAX starts). On one CPU the forced "devices" share the same
cores, so this measures the cost of partitioning (collectives, resharding, smaller per-device
matmuls), not a speed-up; on a GPU node run it with `--platform gpu` and the device counts
that exist. Writes steps/s and images/s, and each
run's ratio to the one-device run measured in the same invocation, to
benchmarks/bench_scaling.json.

    .venv/bin/python scripts/bench_scaling.py [--image-size 224] [--batch 16] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import records  # scripts/records.py: the versions every record carries

MESHES = {"data": lambda n: (n, 1), "fsdp": lambda n: (1, n)}


def worker(mesh_kind: str, image_size: int, batch: int, steps: int, warmup: int) -> dict:
    import jax
    import numpy as np
    import optax

    from vit import device_mesh
    from vit.models.config import get_config
    from vit.train.placement import Placement
    from vit.train.state import fresh_params, new_state
    from vit.train.step import make_train_step

    n = jax.device_count()
    cfg = get_config("Ti/16", num_classes=10, image_size=image_size, attention_impl="xla")
    graphdef, params = fresh_params(cfg, 0)
    tx = optax.adamw(1e-4, weight_decay=0.05)
    mesh = device_mesh.make_mesh(*MESHES[mesh_kind](n))
    place = Placement.of(mesh, params, tx)
    state = new_state(params, tx, place, ema=False)
    step = make_train_step(graphdef, tx, place, accum_steps=1, ema_decay=0.0)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, batch)
    host = {"image": rng.normal(size=(batch, image_size, image_size, 3)).astype(np.float32),
            "label": labels, "target": np.eye(10, dtype=np.float32)[labels]}
    p, o = state.params, state.opt_state
    for i in range(warmup):
        p, o, _, m = step(p, o, None, device_mesh.to_global(host, mesh), 0, i)
    jax.block_until_ready(m)
    t = time.perf_counter()
    for i in range(steps):  # as the training loop: no host read between steps
        p, o, _, m = step(p, o, None, device_mesh.to_global(host, mesh), 0, warmup + i)
    jax.block_until_ready((p, m))
    seconds = time.perf_counter() - t
    per_device = max(sum(s.data.nbytes for leaf in jax.tree.leaves(p)
                         for s in leaf.addressable_shards if s.device == d)
                     for d in jax.devices())
    return {"devices": n, "mesh": dict(zip(device_mesh.AXES, mesh.devices.shape, strict=True)),
            "steps_per_s": steps / seconds, "images_per_s": steps * batch / seconds,
            "param_bytes_per_device": per_device, "loss": float(m["loss"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=16, help="global batch (all devices)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (compile)")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"),
                        help="cpu forces host devices; gpu uses the first N real GPUs")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--out", default="benchmarks/bench_scaling.json")
    parser.add_argument("--worker", choices=tuple(MESHES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.image_size, args.batch, args.steps,
                                args.warmup)))
        return

    runs, load_before = [], os.getloadavg()
    for n in map(int, args.devices.split(",")):
        env = dict(os.environ)
        if args.platform == "cpu":
            env.update(JAX_PLATFORMS="cpu",
                       XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        else:  # the first n real GPUs
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(n)))
        for kind in MESHES:
            if n == 1 and kind == "fsdp":
                continue  # the same one-device run
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", kind, "--image-size",
                 str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps),
                 "--warmup", str(args.warmup)], env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            run = {"kind": kind, **json.loads(proc.stdout.strip().splitlines()[-1])}
            runs.append(run)
            print(f"{n} device(s), {kind}: {run['steps_per_s']:.2f} steps/s, "
                  f"{run['images_per_s']:.1f} img/s, "
                  f"{run['param_bytes_per_device'] / 2**20:.1f} MiB params/device", flush=True)
    one = next(r for r in runs if r["devices"] == 1)
    for r in runs:
        r["images_per_s_vs_1_device"] = r["images_per_s"] / one["images_per_s"]
    result = {
        "benchmark": f"ViT-Ti/16 training step (AdamW), global batch {args.batch}, "
                     f"{args.image_size} px, float32, data vs fsdp meshes",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "processor": platform.processor(), "cpu": records.cpu(),
                    "load_before": load_before, "load_after": os.getloadavg(),
                    "devices": args.platform},
        "versions": {"python": platform.python_version(), **records.versions()},
        "timed_steps_per_run": args.steps,
        "runs": runs,
        "note": args.note or ("forced host devices share one CPU: this is the overhead of "
                              "partitioning, not a speed-up" if args.platform == "cpu" else ""),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
