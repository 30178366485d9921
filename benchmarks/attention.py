"""Attention on an accelerator: our kernel against jax's own, alone and in `vit train`'s step
(scripts/gpu_check.sh); exit 1 if a row failed, 3 if the time budget skipped one."""

from __future__ import annotations

import functools
import math
import pathlib
import time
import traceback

import jax
import jax.numpy as jnp

from benchmarks import common, train_step

FLOP_CONVENTION = (
    "attention forward = 4*B*H*Sq*Sk*D (QK^T and PV, unpadded lengths); backward = 2.5x "
    "forward, so fwd_bwd = 3.5x forward. Train step: 105 GFLOP per 224px ViT-B/16 image "
    "(forward + backward); MFU = images/s * 105e9 / 989e12 (H100/H200 dense bf16 peak)."
)
TRAIN_FLOP_PER_IMAGE = 105e9
TRAIN_CLASSES = 1000
PEAK_FLOP_S = 989e12


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


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

    impls = {
        "pallas": flash_attention,
        "cudnn": functools.partial(jax.nn.dot_product_attention, implementation="cudnn"),
        "xla": functools.partial(jax.nn.dot_product_attention, implementation="xla"),
        "jax_pallas_mha": functools.partial(_jax_pallas_mha, interpret=interpret),
    }
    if jax.default_backend() != "gpu":
        del impls["cudnn"]  # NVIDIA only; on a GPU its failure is a failed row
    return impls


def _guarded(row: dict, measure, end: float, min_left_s: float = 0.0) -> dict:
    """`row` with `measure()`'s figures ("ok"), "skipped" (the budget) or "failed"."""
    if end - time.monotonic() <= min_left_s:
        return {**row, "status": "skipped", "reason": "time budget"}
    try:
        return {**row, "status": "ok", **measure()}
    except Exception as exc:  # recorded, and the run goes on
        traceback.print_exc()
        return {**row, "status": "failed", "error": _error(exc)}


def attention_bench(dry_run: bool, quick: bool, iters: int, end: float) -> list[dict]:
    """Forward and forward+backward rows (ms, TFLOP/s) per attention function and shape."""
    impls = attention_impls(interpret=jax.default_backend() == "cpu")
    shapes = [(1, 50, 2, 64)] if dry_run else [
        (128, seq, heads, 64) for seq in ((577,) if quick else (577, 197)) for heads in (12, 16)]
    rows = []
    for batch, seq, heads, d in shapes:
        q, k, v, do = (jax.random.normal(key, (batch, seq, heads, d), jnp.bfloat16)
                       for key in jax.random.split(jax.random.PRNGKey(0), 4))
        flop = 4 * batch * heads * seq * seq * d
        for name, attention in impls.items():
            def with_grads(q, k, v, do, attention=attention):
                out, vjp = jax.vjp(attention, q, k, v)
                return (out, *vjp(do))

            for mode, fn, args, work in (("fwd", attention, (q, k, v), flop),
                                         ("fwd_bwd", with_grads, (q, k, v, do), 3.5 * flop)):
                def measure(fn=fn, args=args, work=work):
                    fn = jax.jit(fn)
                    s = common.time_call(lambda: fn(*args), repeats=3, number=iters)["median_s"]
                    return {"ms": s * 1e3, "tflops": work / s / 1e12}

                rows.append(_guarded(dict(impl=name, mode=mode, batch=batch, seq=seq,
                                          heads=heads, head_dim=d, dtype="bfloat16"),
                                     measure, end))
                print(f"attention {rows[-1]}", flush=True)
    return rows


def _train_step_time(impl: str, batch: int, image_size: int, overrides: dict, iters: int):
    """Seconds per ViT-B/16 bfloat16 `vit train` step, and the first step's."""
    import numpy as np

    sets = [*train_step.ADAMW, "model.name=B/16", "model.dtype=bfloat16",
            f"model.attention_impl={impl}", f"train.batch_size={batch}",
            f"input.image_size={image_size}", *(f"model.{k}={v}" for k, v in overrides.items())]
    step = train_step.build(train_step.load_recipe(sets), TRAIN_CLASSES)
    rng = np.random.default_rng(1)
    data = step.put(step.batch(rng.normal(size=(batch, image_size, image_size, 3)),
                               rng.integers(0, TRAIN_CLASSES, batch)))
    start = time.perf_counter()
    jax.block_until_ready(step(data))
    first_step_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(iters):
        metrics = step(data)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / iters, first_step_s, step.model.config


def _dispatch(impl: str, batch: int, config) -> str:
    try:
        from vit.ops.attention import choose_impl

        shape = (batch, config.num_tokens, config.num_heads, config.head_dim)
        return " / ".join(choose_impl(impl, shape, shape, jnp.dtype("bfloat16"),
                                      has_mask=False, dropout=False))
    except Exception as exc:
        return f"unknown ({_error(exc)})"


def train_bench(dry_run: bool, iters: int, end: float, min_left_s: float) -> dict:
    """One row per attention path, each started only with `min_left_s` of the budget left."""
    batch, image_size = (2, 32) if dry_run else (256, 224)
    overrides = dict(width=64, depth=1, mlp_dim=128, num_heads=2) if dry_run else {}
    runs = []
    for impl in ("pallas", "xla") if dry_run else ("pallas", "cudnn", "xla"):
        def measure(impl=impl):
            try:
                seconds, first_step_s, config = _train_step_time(
                    impl, batch, image_size, overrides, iters)
            except ModuleNotFoundError as exc:  # a host with the model's dependencies only
                return {"status": "skipped", "reason": f"needs {exc.name}, which training "
                        "uses; install the package's full dependencies"}
            return {"step_ms": seconds * 1e3, "images_per_s": batch / seconds,
                    "mfu": batch / seconds * TRAIN_FLOP_PER_IMAGE / PEAK_FLOP_S,
                    "first_step_s": first_step_s, "dispatch": _dispatch(impl, batch, config)}

        runs.append(_guarded(dict(impl=impl, batch=batch, image_size=image_size), measure, end,
                             min_left_s))
        print(f"train_step {runs[-1]}", flush=True)
    return dict(model="vit_b16", dtype="bfloat16", recipe=f"{train_step.RECIPE.name} with "
                f"{' '.join(train_step.ADAMW)}", dry_run_overrides=overrides, runs=runs)


def status(result: dict) -> dict:
    counts = {"ok": 0, "failed": int("error" in result.get("train_step", {})), "skipped": 0}
    for row in [*result.get("attention", []), *result.get("train_step", {}).get("runs", [])]:
        counts[row["status"]] += 1
    return counts


def exit_code(status: dict) -> int:
    return 1 if status["failed"] else 3 if status["skipped"] else 0


def main(argv: list[str]) -> int:
    parser = common.parser("attention", __doc__, str(common.ROOT / "benchmarks" / "gpu"))
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, interpret mode")
    parser.add_argument("--quick", action="store_true", help="the seq-577 attention rows only")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per repetition")
    parser.add_argument("--budget-s", type=float, default=300, help="seconds to start rows in")
    args = parser.parse_args(argv)
    iters = args.iters or (1 if args.dry_run else 10)
    end = time.monotonic() + args.budget_s
    out = pathlib.Path(args.out) / "bench_attention.json"
    result = {"dry_run": args.dry_run, "quick": args.quick, "flop_convention": FLOP_CONVENTION,
              "budget_s": args.budget_s}

    def save():
        result["status"] = status(result)
        common.write_record("bench_attention", result, argv=argv, mode="attention", out=out)

    share = 1.0 if args.quick else 0.55
    result["attention"] = attention_bench(
        args.dry_run, args.quick, iters, time.monotonic() + (end - time.monotonic()) * share)
    save()
    if not args.quick:
        try:
            result["train_step"] = train_bench(args.dry_run, max(iters // 2, 2), end,
                                               min_left_s=0 if args.dry_run else 40)
        except Exception as exc:  # e.g. the model package fails to import
            result["train_step"] = {"error": _error(exc), "runs": []}
        save()
    print(f"rows: {result['status']}")
    return exit_code(result["status"])
