"""Where the CPU float32 gap to transformers comes from: ViT-B/16's dense layers, alone.

Times one dense layer (matmul + bias, and the exact GELU after fc1, as the model runs them) at
ViT-B/16's shapes for batch 8 (1576 tokens): qkv 768->2304, proj 768->768, fc1 768->3072,
fc2 3072->768. Contestants, interleaved call by call in one process per library:

- XLA (jax.jit) as shipped: dots in YNNPACK fusions (jax's CPU default);
- XLA with YNNPACK fusions off (`xla_cpu_experimental_ynn_fusion_type=""`: XLA's own dots);
- XLA in bfloat16 (inputs and weights bfloat16, float32 accumulation), default fusions;
- torch `nn.functional.linear` in float32 and bfloat16, threads = cores, inference mode.

Also once with one thread each (`taskset` is not needed: torch.set_num_threads(1) and
XLA's `--xla_cpu_multi_thread_eigen=false` plus a one-core affinity for the jax process).
Writes benchmarks/bench_gemm.json; the median of `--iters` calls per contestant.

    .venv/bin/python scripts/bench_gemm.py [--iters 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 8 * 197
SHAPES = {"qkv": (768, 2304, False), "proj": (768, 768, False), "fc1": (768, 3072, True),
          "fc2": (3072, 768, False)}


def worker_jax(iters: int) -> dict:
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    variants = {"xla_default": ({}, jnp.float32),
                "xla_ynn_off": ({"xla_cpu_experimental_ynn_fusion_type": ""}, jnp.float32),
                "xla_bfloat16": ({}, jnp.bfloat16)}
    out = {}
    for name, (k, n, gelu) in SHAPES.items():
        rng = np.random.RandomState(0)
        x = rng.randn(TOKENS, k).astype(np.float32)
        w = (rng.randn(k, n) / np.sqrt(k)).astype(np.float32)
        b = rng.randn(n).astype(np.float32)
        compiled = {}
        for v, (options, dtype) in variants.items():
            def layer(x, w, b, dtype=dtype, gelu=gelu):
                y = jnp.dot(x.astype(dtype), w.astype(dtype),
                            preferred_element_type=jnp.float32) + b
                return jax.nn.gelu(y, approximate=False) if gelu else y

            args = [jnp.asarray(a) for a in (x, w, b)]
            compiled[v] = (jax.jit(layer).lower(*args).compile(options), args)
        times = {v: [] for v in variants}
        for _ in range(iters):
            for v, (c, args) in compiled.items():
                c(*args).block_until_ready()
                t = time.perf_counter()
                c(*args).block_until_ready()
                times[v].append(time.perf_counter() - t)
        out[name] = {v: float(np.median(t)) * 1e3 for v, t in times.items()}
    return out


def worker_torch(iters: int, threads: int) -> dict:
    import time

    import numpy as np
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, (k, n, gelu) in SHAPES.items():
        rng = np.random.RandomState(0)
        x = torch.from_numpy(rng.randn(TOKENS, k).astype(np.float32))
        w = torch.from_numpy((rng.randn(n, k) / np.sqrt(k)).astype(np.float32))
        b = torch.from_numpy(rng.randn(n).astype(np.float32))
        times = {"torch_float32": [], "torch_bfloat16": []}
        with torch.inference_mode():
            for _ in range(iters):
                for v, dtype in (("torch_float32", torch.float32),
                                 ("torch_bfloat16", torch.bfloat16)):
                    args = (x.to(dtype), w.to(dtype), b.to(dtype))

                    def call(args=args, gelu=gelu):
                        y = torch.nn.functional.linear(*args)
                        return torch.nn.functional.gelu(y) if gelu else y

                    call()
                    t = time.perf_counter()
                    call()
                    times[v].append(time.perf_counter() - t)
        out[name] = {v: float(np.median(t)) * 1e3 for v, t in times.items()}
    return out


def run_worker(kind: str, iters: int, threads: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, __file__, "--worker", kind, "--iters", str(iters),
           "--threads", str(threads)]
    if kind == "jax" and threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                            "--xla_force_host_platform_device_count=1").strip()
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode:
        sys.exit(f"{kind} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--worker", choices=("jax", "torch"))
    parser.add_argument("--out", default="benchmarks/bench_gemm.json")
    args = parser.parse_args()
    if args.worker == "jax":
        print(json.dumps(worker_jax(args.iters)))
        return
    if args.worker == "torch":
        print(json.dumps(worker_torch(args.iters, args.threads)))
        return

    sys.path.insert(0, str(ROOT / "scripts"))
    import records

    results = {}
    for threads in (os.cpu_count(), 1):
        jx, th = run_worker("jax", args.iters, threads), run_worker("torch", args.iters, threads)
        rows = {name: {**jx[name], **th[name]} for name in SHAPES}
        ms = {v: sum(r[v] for r in rows.values()) for v in next(iter(rows.values()))}
        results[f"threads_{threads}"] = {
            "ms_per_layer": rows, "ms_all_four": ms,
            "torch_float32_over_xla_default": ms["xla_default"] / ms["torch_float32"],
            "xla_bfloat16_over_xla_float32": ms["xla_bfloat16"] / ms["xla_default"],
            "torch_bfloat16_over_torch_float32": ms["torch_bfloat16"] / ms["torch_float32"]}
    flops = {name: 2 * TOKENS * k * n for name, (k, n, _) in SHAPES.items()}
    record = {"benchmark": "gemm",
              "shapes": {name: {"tokens": TOKENS, "in": k, "out": n, "gelu": g,
                                "gflop": flops[name] / 1e9}
                         for name, (k, n, g) in SHAPES.items()},
              "results": results}
    print(json.dumps(record, indent=2))
    records.write(args.out, record, extra_packages=("torch",))


if __name__ == "__main__":
    main()
