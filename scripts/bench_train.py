"""Training-step speed: our ViT-B/16 (JAX, jitted AdamW step) against transformers'
PyTorch ViTForImageClassification doing the same step (AdamW, batch 8, 224 px, float32, CPU).

Each measurement runs in its own process, JAX and PyTorch alternating, so neither warms the
other's caches or fights it for cores; torch uses as many threads as there are cores. Writes
the per-run medians and the median ratio (torch time / our time: above 1 means we are faster)
to benchmarks/bench_train.json.

    .venv/bin/python scripts/bench_train.py [--rounds 2] [--steps 3] [--note "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import records  # scripts/, on the path as the script's own folder

BATCH, SIZE, CLASSES, LR = 8, 224, 1000, 1e-4


def worker_jax(steps: int, warmup: int) -> list[float]:
    import jax
    import numpy as np
    import optax
    from flax import nnx

    import vit

    model = vit.create_model("B/16", num_classes=CLASSES, attention_impl="xla")
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(LR, weight_decay=0.05)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, images, labels):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(images, train=True, rng=jax.random.key(0))
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    images = rng.normal(size=(BATCH, SIZE, SIZE, 3)).astype(np.float32)
    labels = rng.integers(0, CLASSES, BATCH)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, images, labels)
        jax.block_until_ready(loss)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def worker_torch(steps: int, warmup: int) -> list[float]:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(num_labels=CLASSES)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.05)
    images = torch.randn(BATCH, 3, SIZE, SIZE)
    labels = torch.randint(0, CLASSES, (BATCH,))
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(pixel_values=images).logits, labels)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("jax", "flax", "optax", "torch", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps (compile) per run")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--out", default="benchmarks/bench_train.json")
    parser.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        fn = worker_jax if args.worker == "jax" else worker_torch
        print(json.dumps(fn(args.steps, args.warmup)))
        return

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    runs = {"jax": [], "torch": []}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for name in ("jax", "torch") if r % 2 == 0 else ("torch", "jax"):
            proc = subprocess.run([sys.executable, __file__, "--worker", name, "--steps",
                                   str(args.steps), "--warmup", str(args.warmup)],
                                  env=env, capture_output=True, text=True, check=True)
            times = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name].append(statistics.median(times))
            print(f"round {r}: {name} median step {runs[name][-1]:.3f} s", flush=True)
    ratios = [t / j for t, j in zip(runs["torch"], runs["jax"], strict=True)]
    result = {
        "benchmark": "ViT-B/16 training step (AdamW), batch 8, 224 px, float32, CPU",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "processor": platform.processor(), "cpu": records.cpu(),
                    "load_before": load_before, "load_after": os.getloadavg()},
        "versions": versions(),
        "rounds": args.rounds, "timed_steps_per_run": args.steps,
        "median_step_s": {k: v for k, v in runs.items()},
        "ratio_torch_over_ours": ratios,
        "median_ratio": statistics.median(ratios),
        "note": args.note,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median ratio (torch / ours): {result['median_ratio']:.2f} -> {args.out}")


if __name__ == "__main__":
    main()
