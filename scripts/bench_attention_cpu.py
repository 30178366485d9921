"""The attention core of a CPU training step, ours against PyTorch's, and why it trails.

Ours: `vit.ops.attention.dot_product_attention` on the XLA path (what a CPU step runs), forward
and backward through `jax.vjp`, in the `[batch, heads, seq, head_dim]` layout the model hands
it, compiled with the float32 step's options (vit/inference/xla_cpu.py). Theirs:
`torch.nn.functional.scaled_dot_product_attention` forward and backward, float32, threads =
cores. Shapes: ViT-B/16 at batch 8 (12 heads) and ViT-S/16 at batch 32 (6 heads), 197 tokens,
head_dim 64: one block's attention, each as its step runs it. A CPU step splits a large batch
into micro-batches for the cache (vit/train/step.py `cache_splits`): ViT-S/16's 32 examples run
as 4 micro-batches of 8, so ours is timed on one micro-batch and counted as many times as the
step runs it; torch's step runs the whole batch at once.

The core is seven batched products of 197 x 197 x 64 (two forward, five backward) with the
softmax between them. Each library's batched product `q @ k^T` is also timed alone, with every
core and pinned to one (`taskset -c 0`, one thread): how much of the machine each one's batched
products use. The best of `--iters` calls in one process per library and core count; `--rounds`
such sets of processes, alternating, and the median of the rounds (single products this short
move a lot between processes on a VM: each call faults in its fresh output).

    python scripts/bench_attention_cpu.py [--iters 10] [--rounds 5]
        [--out benchmarks/attention_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_gemm
import records

ROOT = Path(__file__).resolve().parent.parent
CASES = {"B/16:8": (8, 12), "S/16:32": (32, 6)}  # case: (batch, heads)
TOKENS, HEAD_DIM = 197, 64


def best_ms(fn, iters: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def arrays(batch: int, heads: int):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (batch, heads, TOKENS, HEAD_DIM)
    return [rng.standard_normal(shape, np.float32) for _ in range(4)]  # q, k, v, dO


def splits(batch: int) -> int:
    """Into how many micro-batches our step splits `batch` examples of TOKENS tokens."""
    from vit.train.step import MICRO_TOKENS, cache_splits

    return cache_splits(batch, TOKENS, MICRO_TOKENS)


def worker_jax(iters: int, core: bool) -> dict:
    out = {}
    for case, (batch, heads) in CASES.items():
        n = splits(batch)
        row = _jax_case(batch // n, heads, iters, core)
        out[case] = {name: ms * n for name, ms in row.items()}  # the whole batch's time
    return out


def _jax_case(batch: int, heads: int, iters: int, core: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from vit.inference.xla_cpu import jit_options, training_options
    from vit.ops.attention import dot_product_attention

    opts = jit_options(training_options("float32"))
    q, k, v, g = (jnp.asarray(a) for a in arrays(batch, heads))
    row = {}
    if core:
        def fwd_bwd(q, k, v, g):
            _, vjp = jax.vjp(lambda q, k, v: dot_product_attention(
                q, k, v, impl="xla", layout="bhsd"), q, k, v)
            return vjp(g)

        step = jax.jit(fwd_bwd, **opts)
        row["core_ms"] = best_ms(lambda: jax.block_until_ready(step(q, k, v, g)), iters)
    product = jax.jit(lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), **opts)
    row["qk_product_ms"] = best_ms(lambda: product(q, k).block_until_ready(), iters)
    return row


def worker_torch(iters: int, core: bool) -> dict:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    return {case: _torch_case(batch, heads, iters, core)
            for case, (batch, heads) in CASES.items()}


def _torch_case(batch: int, heads: int, iters: int, core: bool) -> dict:
    import torch

    q, k, v, g = (torch.from_numpy(a) for a in arrays(batch, heads))
    row = {}
    if core:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]

        def fwd_bwd():
            o = torch.nn.functional.scaled_dot_product_attention(*leaves)
            return torch.autograd.grad(o, leaves, g)

        row["core_ms"] = best_ms(fwd_bwd, iters)
    row["qk_product_ms"] = best_ms(lambda: q @ k.transpose(-1, -2), iters)
    return row


def run_worker(kind: str, iters: int, one_core: bool) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--worker", kind, "--iters", str(iters),
           *([] if one_core else ["--core"])]
    if one_core:
        cmd, env = bench_gemm.on_one_core(kind, cmd, env)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        sys.exit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", choices=("jax", "torch"))
    parser.add_argument("--core", action="store_true", help="worker: the whole core too")
    parser.add_argument("--out", default=records.default_out("attention_cpu"))
    args = parser.parse_args()
    if args.worker:
        fn = worker_jax if args.worker == "jax" else worker_torch
        print(json.dumps(fn(args.iters, args.core)))
        return
    order = [(kind, one) for one in (False, True) for kind in ("jax", "torch")]
    rounds = {key: [] for key in order}
    for r in range(args.rounds):
        for kind, one in order if r % 2 == 0 else order[::-1]:
            rounds[kind, one].append(run_worker(kind, args.iters, one))
    # Each figure: its median over the rounds.
    runs = {key: {case: {name: statistics.median(run[case][name] for run in got)
                         for name in got[0][case]} for case in CASES}
            for key, got in rounds.items()}
    cases = []
    for case, (batch, heads) in CASES.items():
        flop = 2 * batch * heads * TOKENS * TOKENS * HEAD_DIM  # one 197 x 197 x 64 product each
        rate = {f"{kind}_{'1_core' if one else 'all_cores'}":
                flop / runs[kind, one][case]["qk_product_ms"] / 1e6 for kind, one in runs}
        ours, theirs = runs["jax", False][case]["core_ms"], runs["torch", False][case]["core_ms"]
        cases.append({"case": case, "batch": batch, "heads": heads,
                      "vit_micro_batches": splits(batch),
                      "core_fwd_bwd_ms": {"vit": ours, "torch_sdpa": theirs},
                      "torch_over_vit": theirs / ours,
                      "qk_product_gflop_s": rate,
                      "qk_product_ms": {f"{k}_{'1_core' if one else 'all_cores'}":
                                        runs[k, one][case]["qk_product_ms"]
                                        for k, one in runs}})
        print(case, json.dumps(cases[-1]), flush=True)
    records.write(args.out, {
        "benchmark": "attention core forward + backward on the CPU, float32: ours (XLA path, "
                     "the step's compile options) against torch's SDPA; the batched q @ k^T "
                     "product alone on all cores and on one",
        "tokens": TOKENS, "head_dim": HEAD_DIM, "iters": args.iters, "rounds": args.rounds,
        "cores": os.cpu_count(),
        "cases": cases}, extra_packages=("torch",))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
