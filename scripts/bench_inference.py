"""Inference speed: our ViT against Hugging Face transformers' PyTorch ViT, same configuration.

Each measurement runs in its own process (ours and theirs alternating, so drifts in machine load
hit both), and the claim is the median of the per-round ratios. Writes JSON under benchmarks/.

    python scripts/bench_inference.py                      # ViT-B/16, batch 8, 224 px, float32
    python scripts/bench_inference.py --rounds 5 --iters 10
    python scripts/bench_inference.py --baseline /tmp/old   # also an older checkout of ours

`--baseline DIR` adds a third contestant in every round: our model imported from DIR (a
`git worktree` of an earlier commit), so a change to the hot path is measured against the code
before it on the same machine in the same run (`ratio_to_baseline_median`).
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_ours(args) -> list[float]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import vit

    model = vit.create_model(args.model, image_size=args.image_size, dtype="float32")
    forward = nnx.jit(lambda m, x: m(x))
    x = jax.random.normal(jax.random.key(0), (args.batch, args.image_size, args.image_size, 3))
    x = jnp.asarray(x, jnp.float32)
    forward(model, x).block_until_ready()  # compile
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        forward(model, x).block_until_ready()
        times.append(time.perf_counter() - t)
    return times


def worker_hf(args) -> list[float]:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    import vit

    cfg = vit.get_config(args.model, image_size=args.image_size)
    torch.set_num_threads(os.cpu_count())
    model = ViTForImageClassification(ViTConfig(
        hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_dim, image_size=args.image_size, patch_size=cfg.patch_size[0],
        num_labels=cfg.num_classes)).eval()
    x = torch.randn(args.batch, 3, args.image_size, args.image_size)
    times = []
    with torch.inference_mode():
        model(pixel_values=x)  # warm-up
        for _ in range(args.iters):
            t = time.perf_counter()
            model(pixel_values=x)
            times.append(time.perf_counter() - t)
    return times


def run_worker(kind: str, args) -> float:
    env = dict(os.environ)
    if kind == "baseline":  # our worker, with `vit` imported from the baseline checkout
        kind, env["PYTHONPATH"] = "ours", args.baseline
    cmd = [sys.executable, __file__, "--worker", kind, "--model", args.model,
           "--batch", str(args.batch), "--image-size", str(args.image_size),
           "--iters", str(args.iters)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return args.batch / statistics.median(times)


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("jax", "jaxlib", "flax", "torch", "transformers")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_b16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "bench_inference.json"))
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="also time our model from this checkout (an earlier commit)")
    parser.add_argument("--worker", choices=("ours", "hf"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        times = (worker_ours if args.worker == "ours" else worker_hf)(args)
        print(json.dumps(times))
        return
    rounds = []
    for i in range(args.rounds):
        # Alternate which goes first, so neither always meets a warmer or cooler machine.
        order = ("ours", "hf") if i % 2 == 0 else ("hf", "ours")
        if args.baseline:
            order = ("ours", "baseline", "hf") if i % 2 == 0 else ("hf", "baseline", "ours")
        r = {kind: run_worker(kind, args) for kind in order}
        r["ratio"] = r["ours"] / r["hf"]
        if args.baseline:
            r["ratio_to_baseline"] = r["ours"] / r["baseline"]
        rounds.append(r)
        print(f"round {i}: ours {r['ours']:.2f} img/s, transformers {r['hf']:.2f} img/s, "
              f"ratio {r['ratio']:.2f}", file=sys.stderr)
    result = {
        "benchmark": "inference",
        "command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count()},
        "versions": versions(),
        "setup": {"model": args.model, "batch": args.batch, "image_size": args.image_size,
                  "dtype": "float32", "iters": args.iters,
                  "ours": "vit.create_model + nnx.jit forward",
                  "peer": "transformers ViTForImageClassification, torch.inference_mode, "
                          "default SDPA attention, threads = cores"},
        "rounds": rounds,
        "ours_img_s_median": statistics.median(r["ours"] for r in rounds),
        "peer_img_s_median": statistics.median(r["hf"] for r in rounds),
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
    }
    if args.baseline:
        base = subprocess.run(["git", "-C", args.baseline, "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        result["baseline"] = {"dir": args.baseline, "commit": base}
        result["baseline_img_s_median"] = statistics.median(r["baseline"] for r in rounds)
        result["ratio_to_baseline_median"] = statistics.median(
            r["ratio_to_baseline"] for r in rounds)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("ours_img_s_median", "peer_img_s_median",
                                             "ratio_median", "ratio_to_baseline_median")
                      if k in result}))


if __name__ == "__main__":
    main()
