#!/usr/bin/env python3
"""Attention kernels and a ViT-B/16 training step, timed; results as JSON.

    PYTHONPATH=$PWD python3 scripts/bench_attention.py [--out DIR] [--dry-run]

Sections, each written to DIR/bench_attention.json as soon as it finishes:
  correctness  our kernel (compiled where there is an accelerator) against a float32 softmax
               reference: outputs and dq/dk/dv at ragged ViT lengths, head dims, dtypes, kv_len.
  attention    forward and forward+backward TFLOP/s at ViT shapes for our kernel,
               jax.nn.dot_product_attention (cudnn, xla) and jax's Pallas GPU `mha`.
  train_step   ViT-B/16 training step (bfloat16) in images/s and MFU with each attention path.
  block_sweep  our kernel over (block_q, block_k) tiles, in the time left: data for tuning.
Every measurement catches its own errors, so one failing path never hides the others.

--dry-run: tiny shapes in Pallas interpret mode, so CI on a CPU proves the script runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import itertools
import json
import math
import pathlib
import platform
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp

FLOP_CONVENTION = (
    "attention forward = 4*B*H*Sq*Sk*D (QK^T and PV, unpadded lengths); backward = 2.5x "
    "forward, so fwd_bwd = 3.5x forward. Train step: 105 GFLOP per 224px ViT-B/16 image "
    "(forward + backward); MFU = images/s * 105e9 / 989e12 (H100/H200 dense bf16 peak)."
)
TRAIN_FLOP_PER_IMAGE = 105e9
PEAK_FLOP_S = 989e12
TOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


class Deadline:
    """Skips measurements once the time budget is spent, so a run always reports."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _time(fn, *args, iters: int, reps: int = 3) -> float:
    """Median seconds per call; the first call compiles and is not timed."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def reference_attention(q, k, v, kv_len=None):
    """Float32 materialised softmax attention, the yardstick for correctness."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / math.sqrt(q.shape[-1])
    if kv_len is not None:
        valid = jnp.arange(k.shape[1]) < kv_len[:, None]
        logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision="highest")


def _jax_pallas_mha(q, k, v, *, interpret):
    """jax's Pallas GPU `mha`: lengths padded to its 128 block, padding split off by segment."""
    from jax.experimental.pallas.ops.gpu import attention

    b, s, _, d = q.shape
    padded = -(-s // 128) * 128
    q, k, v = (jnp.pad(x, ((0, 0), (0, padded - s), (0, 0), (0, 0))) for x in (q, k, v))
    segments = jnp.broadcast_to((jnp.arange(padded) < s).astype(jnp.int32), (b, padded))
    out = attention.mha(q, k, v, segments, sm_scale=1 / math.sqrt(d), interpret=interpret)
    return out[:, :s]


def attention_impls(interpret: bool) -> dict:
    from vit.ops.flash_attention import flash_attention

    return {
        "pallas": flash_attention,
        "cudnn": functools.partial(jax.nn.dot_product_attention, implementation="cudnn"),
        "xla": functools.partial(jax.nn.dot_product_attention, implementation="xla"),
        "jax_pallas_mha": functools.partial(_jax_pallas_mha, interpret=interpret),
    }


def _with_grads(attention, q, k, v, do):
    out, vjp = jax.vjp(attention, q, k, v)
    return (out, *vjp(do))


def _inputs(key, batch, seq_q, seq_k, heads, head_dim, dtype):
    kq, kk, kv, kd = jax.random.split(key, 4)
    shape_q, shape_k = (batch, seq_q, heads, head_dim), (batch, seq_k, heads, head_dim)
    return (jax.random.normal(kq, shape_q, dtype), jax.random.normal(kk, shape_k, dtype),
            jax.random.normal(kv, shape_k, dtype), jax.random.normal(kd, shape_q, dtype))


def correctness(dry_run: bool) -> list[dict]:
    from vit.ops.flash_attention import flash_attention

    # batch, seq_q, seq_k, heads, head_dim, dtype, kv_len (None, or NaN-poisoned beyond it)
    cases = [(2, 50, 50, 2, 64, "float32", (50, 17))] if dry_run else [
        (4, 197, 197, 12, 64, "bfloat16", None),
        (2, 577, 577, 4, 128, "bfloat16", None),
        (2, 257, 50, 3, 80, "float32", (50, 1)),
        (2, 5, 1025, 2, 96, "float16", (1025, 300)),
        (2, 1, 197, 2, 32, "bfloat16", (0, 197)),
        (2, 197, 197, 2, 64, "float32", None),
    ]
    results = []
    for i, (batch, sq, sk, heads, d, dtype, kv_len) in enumerate(cases):
        row = dict(batch=batch, seq_q=sq, seq_k=sk, heads=heads, head_dim=d, dtype=dtype,
                   kv_len=kv_len)
        try:
            q, k, v, do = _inputs(jax.random.PRNGKey(i), batch, sq, sk, heads, d, dtype)
            lens = None if kv_len is None else jnp.array(kv_len)
            if lens is not None:
                valid = (jnp.arange(sk) < lens[:, None])[:, :, None, None]
                k_in, v_in = (jnp.where(valid, x, jnp.nan) for x in (k, v))
            else:
                valid, k_in, v_in = True, k, v
            ours = jax.jit(functools.partial(
                _with_grads, functools.partial(flash_attention, kv_len=lens)))(q, k_in, v_in, do)
            ref = jax.jit(functools.partial(
                _with_grads, functools.partial(reference_attention, kv_len=lens)))(
                *(x.astype(jnp.float32) for x in (q, k, v, do)))
            # Rows with no valid key: ours are zeros, the reference's are NaN.
            rows = True if lens is None else (lens > 0)[:, None, None, None]
            errors = {}
            for name, a, b, mask in zip(("out", "dq", "dk", "dv"), ours, ref,
                                        (rows, rows, valid, valid), strict=True):
                a = jnp.where(mask, a.astype(jnp.float32), 0)
                b = jnp.where(mask, b, 0)
                scale = max(1.0, float(jnp.max(jnp.abs(b))))
                errors[name] = float(jnp.max(jnp.abs(a - b))) / scale
            finite = all(bool(jnp.isfinite(x.astype(jnp.float32)).all()) for x in ours)
            row.update(max_rel_err=errors, finite=finite,
                       ok=finite and max(errors.values()) <= TOL[dtype])
        except Exception as exc:  # recorded, and the run goes on
            row.update(ok=False, error=_error(exc))
        results.append(row)
        print(f"correctness {row}", flush=True)
    return results


def _measure_modes(attention, batch, seq, heads, d, inputs, iters, skip: bool, **labels):
    """Forward and forward+backward rows (ms, TFLOP/s) for one attention function and shape."""
    q, k, v, do = inputs
    fwd_flop = 4 * batch * heads * seq * seq * d
    rows = []
    for mode, flop in (("fwd", fwd_flop), ("fwd_bwd", 3.5 * fwd_flop)):
        row = dict(**labels, mode=mode, batch=batch, seq=seq, heads=heads, head_dim=d,
                   dtype="bfloat16")
        if skip:
            row["error"] = "skipped: time budget"
        else:
            fn = jax.jit(attention if mode == "fwd"
                         else functools.partial(_with_grads, attention))
            args = (q, k, v) if mode == "fwd" else (q, k, v, do)
            try:
                seconds = _time(fn, *args, iters=iters)
                row.update(ms=seconds * 1e3, tflops=flop / seconds / 1e12)
            except Exception as exc:
                row["error"] = _error(exc)
        rows.append(row)
    return rows


def attention_bench(dry_run: bool, iters: int, deadline: Deadline, reserve_s: float):
    interpret = jax.default_backend() == "cpu"
    impls = attention_impls(interpret)
    # seq 577 first: the target (1.5x XLA) is set there, so it is measured first.
    shapes = [(1, 50, 2, 64)] if dry_run else [
        (batch, seq, heads, 64) for seq in (577, 197) for batch in (128, 256) for heads in (12, 16)
    ]
    results = []
    for batch, seq, heads, d in shapes:
        inputs = _inputs(jax.random.PRNGKey(0), batch, seq, seq, heads, d, jnp.bfloat16)
        for name, attention in impls.items():
            for row in _measure_modes(attention, batch, seq, heads, d, inputs, iters,
                                      skip=deadline.left() < reserve_s, impl=name):
                results.append(row)
                print(f"attention {row}", flush=True)
    return results


def block_sweep(dry_run: bool, iters: int, deadline: Deadline) -> list[dict]:
    """Our kernel over (block_q, block_k) tiles and warps at ViT-B shapes, in whatever time is
    left: the data for tuning `default_block_sizes`. Each setting applies to all three kernels."""
    from vit.ops.flash_attention import flash_attention

    shapes = [(1, 50, 2, 64)] if dry_run else [(128, 577, 12, 64), (128, 197, 12, 64)]
    tiles = [(16, 16)] if dry_run else [(128, 64), (64, 64), (128, 32), (64, 128), (128, 128)]
    warps = (4,) if dry_run else (4, 8)
    results = []
    for batch, seq, heads, d in shapes:
        inputs = _inputs(jax.random.PRNGKey(0), batch, seq, seq, heads, d, jnp.bfloat16)
        for (block_q, block_k), num_warps in itertools.product(tiles, warps):
            attention = functools.partial(flash_attention, block_q=block_q, block_k=block_k,
                                          num_warps=num_warps)
            for row in _measure_modes(attention, batch, seq, heads, d, inputs, iters,
                                      skip=deadline.left() <= 0, block_q=block_q,
                                      block_k=block_k, num_warps=num_warps):
                results.append(row)
                print(f"blocks {row}", flush=True)
    return results


def _train_step_time(impl: str, batch: int, image_size: int, overrides: dict, iters: int):
    """Seconds per ViT-B/16 training step (AdamW) and the first step's compile+run seconds."""
    import optax
    from flax import nnx

    import vit

    model = vit.create_model("vit_b16", attention_impl=impl, dtype="bfloat16",
                             image_size=image_size, **overrides)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-4)

    def loss_fn(params, rest, images, labels):
        logits = nnx.merge(graphdef, params, rest)(images, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 2))
    def step(params, rest, opt_state, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = tx.init(params)
    images = jax.random.normal(jax.random.PRNGKey(1), (batch, image_size, image_size, 3))
    labels = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, model.config.num_classes)
    start = time.perf_counter()
    params, opt_state, loss = step(params, rest, opt_state, images, labels)
    jax.block_until_ready(loss)
    first_step_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(iters):
        params, opt_state, loss = step(params, rest, opt_state, images, labels)
    jax.block_until_ready(loss)
    return (time.perf_counter() - start) / iters, first_step_s, model.config


def train_bench(dry_run: bool, iters: int, deadline: Deadline) -> dict:
    batch, image_size = (2, 32) if dry_run else (256, 224)
    # Dry run: a one-layer toy with ViT-B/16's structure, so CI stays fast.
    overrides = dict(width=64, depth=1, mlp_dim=128, num_heads=2) if dry_run else {}
    runs = []
    # On CPU "cudnn" falls back to "xla": the dry run skips compiling the same step twice.
    for impl in ("pallas", "xla") if dry_run else ("pallas", "cudnn", "xla"):
        row = dict(impl=impl, batch=batch, image_size=image_size)
        if deadline.left() <= 0:
            row["error"] = "skipped: time budget"
        else:
            try:
                seconds, first_step_s, config = _train_step_time(
                    impl, batch, image_size, overrides, iters)
                images_per_s = batch / seconds
                row.update(step_ms=seconds * 1e3, images_per_s=images_per_s,
                           mfu=images_per_s * TRAIN_FLOP_PER_IMAGE / PEAK_FLOP_S,
                           first_step_s=first_step_s, dispatch=_dispatch(impl, batch, config))
            except Exception as exc:
                row["error"] = _error(exc)
                traceback.print_exc()
        runs.append(row)
        print(f"train_step {row}", flush=True)
    return dict(model="vit_b16", dtype="bfloat16", dry_run_overrides=overrides, runs=runs)


def _dispatch(impl: str, batch: int, config) -> str:
    """Which backend the model's attention dispatcher picks for this request, and why."""
    try:
        from vit.ops.attention import choose_impl

        shape = (batch, config.num_tokens, config.num_heads, config.head_dim)
        return " / ".join(choose_impl(impl, shape, shape, jnp.bfloat16, has_mask=False,
                                      dropout=False))
    except Exception as exc:
        return f"unknown ({_error(exc)})"


def _summary(result: dict) -> None:
    print(f"\n== {result['machine']['device_kind']} jax {result['versions']['jax']}")
    checks = result.get("correctness", [])
    print(f"correctness: {sum(c['ok'] for c in checks)}/{len(checks)} ok")
    for c in checks:
        if not c["ok"]:
            print(f"  FAILED {c}")
    print(f"{'impl':<16}{'mode':<9}{'B':>5}{'S':>5}{'H':>4}{'ms':>10}{'TFLOP/s':>9}")
    for r in result.get("attention", []):
        figure = f"{r['ms']:>10.3f}{r['tflops']:>9.1f}" if "ms" in r else f"  {r['error']}"
        print(f"{r['impl']:<16}{r['mode']:<9}{r['batch']:>5}{r['seq']:>5}{r['heads']:>4}{figure}")
    best = {}
    for r in result.get("block_sweep", []):
        key = (r["mode"], r["seq"])
        if "tflops" in r and r["tflops"] > best.get(key, {}).get("tflops", 0):
            best[key] = r
    for (mode, seq), r in sorted(best.items()):
        print(f"best tiles {mode:<8} seq {seq}: block_q={r['block_q']} block_k={r['block_k']}"
              f" num_warps={r['num_warps']} {r['tflops']:.1f} TFLOP/s")
    for r in result.get("train_step", {}).get("runs", []):
        if "images_per_s" in r:
            print(f"train {r['impl']:<8} {r['images_per_s']:>9.1f} img/s  MFU {r['mfu']:.1%}"
                  f"  ({r.get('dispatch', '')})")
        else:
            print(f"train {r['impl']:<8} {r['error']}")


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    out["jax"] = jax.__version__
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks", help="results directory")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes in interpret mode (CPU CI)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per repetition")
    parser.add_argument("--budget-s", type=float, default=330,
                        help="stop starting new measurements after this many seconds")
    parser.add_argument("--skip-train", action="store_true", help="no ViT training step")
    parser.add_argument("--skip-sweep", action="store_true",
                        help="no block-size sweep (it runs last, in the time left)")
    args = parser.parse_args(argv)
    iters = args.iters or (1 if args.dry_run else 10)
    deadline = Deadline(args.budget_s)
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_attention.json"
    device = jax.devices()[0]
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "dry_run": args.dry_run,
        "machine": dict(platform=jax.default_backend(), device_kind=device.device_kind,
                        device_count=jax.device_count(), host=platform.node()),
        "versions": _versions(),
        "flop_convention": FLOP_CONVENTION,
    }

    def save():
        path.write_text(json.dumps(result, indent=1, default=str))

    result["correctness"] = correctness(args.dry_run)
    save()
    # Keep time for the training step so both sections report.
    reserve = 0 if args.skip_train or args.dry_run else 0.35 * args.budget_s
    result["attention"] = attention_bench(args.dry_run, iters, deadline, reserve)
    save()
    if not args.skip_train:
        try:
            result["train_step"] = train_bench(args.dry_run, max(iters, 2), deadline)
        except Exception as exc:  # e.g. the model package fails to import
            result["train_step"] = {"error": _error(exc), "runs": []}
        save()
    if not args.skip_sweep:
        result["block_sweep"] = block_sweep(args.dry_run, iters, deadline)
        save()
    _summary(result)
    print(f"\nwrote {path}")
    return 0 if all(c["ok"] for c in result["correctness"]) else 1


if __name__ == "__main__":
    sys.exit(main())
