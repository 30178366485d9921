"""Attention on an accelerator: our kernel against jax's own, forward and backward
(scripts/gpu_check.sh); exit 1 if a row failed, 3 if the time budget skipped one."""

from __future__ import annotations

import functools
import math
import pathlib
import time
import traceback

import jax
import jax.numpy as jnp

from benchmarks import common

FLOP_CONVENTION = ("attention forward = 4*B*H*Sq*Sk*D (QK^T and PV, unpadded lengths); "
                   "backward = 2.5x forward, so fwd_bwd = 3.5x forward.")


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

    impls = {"pallas": flash_attention,
             "cudnn": functools.partial(jax.nn.dot_product_attention, implementation="cudnn"),
             "xla": functools.partial(jax.nn.dot_product_attention, implementation="xla"),
             "jax_pallas_mha": functools.partial(_jax_pallas_mha, interpret=interpret)}
    if jax.default_backend() != "gpu":
        del impls["cudnn"]  # NVIDIA only; on a GPU its failure is a failed row
    return impls


def _guarded(row: dict, measure, end: float) -> dict:
    """`row` with `measure()`'s figures ("ok"), "skipped" (the budget) or "failed"."""
    if end <= time.monotonic():
        return {**row, "status": "skipped", "reason": "time budget"}
    try:
        return {**row, "status": "ok", **measure()}
    except Exception as exc:  # recorded, and the run goes on
        traceback.print_exc()
        first = (str(exc).splitlines() or [""])[0]
        return {**row, "status": "failed", "error": f"{type(exc).__name__}: {first}"[:300]}


def attention_bench(dry_run: bool, quick: bool, end: float, rows: list, save) -> None:
    """Forward and forward+backward rows (ms, TFLOP/s) per attention function and shape, each
    appended to `rows` and `save()`d, so a run cut short keeps what it measured."""
    impls = attention_impls(interpret=jax.default_backend() == "cpu")
    iters = 1 if dry_run else 10  # timed calls per repetition
    shapes = [(1, 50, 2, 64)] if dry_run else [
        (128, seq, heads, 64) for seq in ((577,) if quick else (577, 197)) for heads in (12, 16)]
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
                save()


def exit_code(status: dict) -> int:
    return 1 if status["failed"] else 3 if status["skipped"] else 0


def main(argv: list[str]) -> int:
    args = common.parser("attention", __doc__, str(common.ROOT / "benchmarks" / "gpu"),
                         dry_run=(False, "tiny shapes, interpret mode"),
                         quick=(False, "the seq-577 rows only"),
                         budget_s=(300.0, "seconds to start rows in")).parse_args(argv)
    out = pathlib.Path(args.out) / "bench_attention.json"
    result = {"dry_run": args.dry_run, "quick": args.quick, "flop_convention": FLOP_CONVENTION,
              "budget_s": args.budget_s, "attention": []}

    def save():
        result["status"] = {s: sum(r["status"] == s for r in result["attention"])
                            for s in ("ok", "failed", "skipped")}
        common.write_record("bench_attention", result, argv=argv, mode="attention", out=out)

    attention_bench(args.dry_run, args.quick, time.monotonic() + args.budget_s,
                    result["attention"], save)
    print(f"rows: {result['status']}")
    return exit_code(result["status"])
