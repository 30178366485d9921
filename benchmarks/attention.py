"""Attention kernels, the ViT-B/16 forward and a training step on an accelerator: the benchmark
step of scripts/gpu_check.sh, which says what each section measures.

    python -m benchmarks attention [--out DIR] [--budget-s S] [--quick] [--dry-run]

Sections (DIR/bench_attention.json, default benchmarks/gpu/, written as each ends):
`correctness` (our kernel against the XLA reference, outputs and gradients, per element within
atol + rtol * |reference|), `attention` (TFLOP/s of ours, cuDNN, XLA and jax's Pallas `mha`),
`block_sweep` (each of our kernels over tiles and warps), `inference` (float32 and bfloat16)
and `train_step` (`vit train`'s step, images/s and MFU). Each timed section has its share of
--budget-s; a row is "ok", "failed" or "skipped", and the exit code is 1 if any row failed,
else 3 if any was skipped, else 0. --quick: the seq-577 attention rows only; --dry-run: tiny
shapes in Pallas interpret mode, so a CPU proves the script runs.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    "forward, so fwd_bwd = 3.5x forward. Block sweep, per kernel as it runs (recomputation "
    "counted): fwd 4*B*H*S^2*D, dkv 8*B*H*S^2*D, dq 6*B*H*S^2*D. Train step: 105 GFLOP per "
    "224px ViT-B/16 image (forward + backward); MFU = images/s * 105e9 / 989e12 (H100/H200 "
    "dense bf16 peak)."
)
TRAIN_FLOP_PER_IMAGE = 105e9
TRAIN_CLASSES = 1000
PEAK_FLOP_S = 989e12
# Per element: |ours - reference| <= ATOL + RTOL * |reference| (as tests/test_flash_attention.py).
ATOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
RTOL = {"float32": 5e-5, "bfloat16": 2e-2, "float16": 2e-3}
SKIPPED = {"status": "skipped", "reason": "time budget"}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


class Deadline:
    """Skips measurements once the time budget is spent, so a run always reports."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def share(self, fraction: float) -> Deadline:
        """A deadline for one section: `fraction` of the time left now."""
        return Deadline(max(0.0, self.left()) * fraction)


def reference_attention(q, k, v, kv_len=None):
    """The yardstick for correctness: the package's XLA path (`vit.ops.attention`) in float32,
    its products at full precision (a GPU's default float32 dots round through TF32)."""
    from vit.ops.attention import reference_attention as xla_reference

    with jax.default_matmul_precision("highest"):
        return xla_reference(*(x.astype(jnp.float32) for x in (q, k, v)), kv_len=kv_len)


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
            # Rows with no valid key: both give zeros; compared where a key is valid.
            rows = True if lens is None else (lens > 0)[:, None, None, None]
            worst = {}
            for name, a, b, mask in zip(("out", "dq", "dk", "dv"), ours, ref,
                                        (rows, rows, valid, valid), strict=True):
                a = jnp.where(mask, a.astype(jnp.float32), 0)
                b = jnp.where(mask, b, 0)
                bound = ATOL[dtype] + RTOL[dtype] * jnp.abs(b)
                worst[name] = float(jnp.max(jnp.abs(a - b) / bound))
            finite = all(bool(jnp.isfinite(x.astype(jnp.float32)).all()) for x in ours)
            ok = finite and max(worst.values()) <= 1.0
            row.update(worst_error_over_bound=worst, finite=finite, ok=ok,
                       status="ok" if ok else "failed")
        except Exception as exc:  # recorded, and the run goes on
            row.update(ok=False, status="failed", error=_error(exc))
        results.append(row)
        print(f"correctness {row}", flush=True)
    return results


def _guarded(row: dict, measure, deadline: Deadline, min_left_s: float = 0.0) -> dict:
    """`row` with what `measure()` gives (and status "ok"), or "skipped" with at most
    `min_left_s` of the budget left, or "failed" with the error it raised."""
    if deadline.left() <= min_left_s:
        return {**row, **SKIPPED}
    try:
        return {**row, "status": "ok", **measure()}
    except Exception as exc:  # recorded, and the run goes on
        traceback.print_exc()
        return {**row, "status": "failed", "error": _error(exc)}


def _timing(fn, args, iters: int, flop: float) -> dict:
    seconds = common.time_call(lambda: fn(*args), repeats=3, number=iters)["median_s"]
    return {"ms": seconds * 1e3, "tflops": flop / seconds / 1e12}


def _measure_modes(attention, batch, seq, heads, d, inputs, iters, deadline, **labels):
    """Forward and forward+backward rows (ms, TFLOP/s) for one attention function and shape."""
    q, k, v, do = inputs
    fwd_flop = 4 * batch * heads * seq * seq * d
    rows = []
    for mode, flop in (("fwd", fwd_flop), ("fwd_bwd", 3.5 * fwd_flop)):
        row = dict(**labels, mode=mode, batch=batch, seq=seq, heads=heads, head_dim=d,
                   dtype="bfloat16")
        fn = jax.jit(attention if mode == "fwd" else functools.partial(_with_grads, attention))
        args = (q, k, v) if mode == "fwd" else (q, k, v, do)
        rows.append(_guarded(row, functools.partial(_timing, fn, args, iters, flop), deadline))
    return rows


def attention_bench(dry_run: bool, quick: bool, iters: int, deadline: Deadline):
    interpret = jax.default_backend() == "cpu"
    impls = attention_impls(interpret)
    # seq 577 first (ViT-B/16 at 384 px): --quick measures it alone. 12 heads: ViT-B, 16: ViT-L.
    seqs = (577,) if quick else (577, 197)
    shapes = [(1, 50, 2, 64)] if dry_run else [
        (128, seq, heads, 64) for seq in seqs for heads in (12, 16)
    ]
    results = []
    for batch, seq, heads, d in shapes:
        inputs = _inputs(jax.random.PRNGKey(0), batch, seq, seq, heads, d, jnp.bfloat16)
        for name, attention in impls.items():
            for row in _measure_modes(attention, batch, seq, heads, d, inputs, iters, deadline,
                                      impl=name):
                results.append(row)
                print(f"attention {row}", flush=True)
    return results


# Tiles tried per kernel after the default (fitted) one and the largest one, in order:
# (query rows, key rows). fwd and dQ keep queries resident, dK/dV keeps keys.
SWEEP_TILES = {
    "fwd": [(64, 64), (128, 128), (64, 32), (128, 64)],
    "dkv": [(64, 128), (32, 64), (16, 128), (32, 128)],
    "dq": [(128, 64), (64, 32), (128, 16), (128, 32)],
}
SWEEP_FLOP = {"fwd": 4, "dkv": 8, "dq": 6}  # x B*H*S^2*D


def _sweep_settings(kernel: str, seq: int, head_dim: int, count: int):
    """The first `count` (BlockSizes, labels) settings of one kernel, the others at their
    defaults: the default for this length, the same with the other warp count (4 <-> 8), the
    unfitted largest tile, then SWEEP_TILES. Settings that clamp to one listed are dropped."""
    from vit.ops.flash_attention import _resolve_blocks, default_block_sizes

    index = ("fwd", "dkv", "dq").index(kernel)
    base = default_block_sizes("gpu", head_dim, seq, seq)
    tile, warps = getattr(base, kernel), base.warps[index]
    largest = getattr(default_block_sizes("gpu", head_dim), kernel)
    candidates = [(tile, warps), (tile, 12 - warps), (largest, warps),
                  *((t, warps) for t in SWEEP_TILES[kernel])]
    settings, seen = [], set()
    for tile_, warps_ in candidates:
        trial = dataclasses.replace(
            base, **{kernel: tile_},
            warps=tuple(warps_ if i == index else w for i, w in enumerate(base.warps)))
        # The wrapper clamps tiles to short sequences; key on what actually runs.
        ran = getattr(_resolve_blocks(False, head_dim, seq, seq, None, None, trial), kernel)
        if (ran, warps_) not in seen:
            seen.add((ran, warps_))
            settings.append((trial, dict(tile=list(ran), num_warps=warps_,
                                         default=not settings)))
    return settings[:count]


def block_sweep(dry_run: bool, iters: int, deadline: Deadline, per_case: int) -> list[dict]:
    """Each kernel over tiles and warps at ViT shapes, with the other two at their defaults:
    the data for tuning `default_block_sizes`. Forward rows time the forward; dK/dV and dQ rows
    time a backward pass asked for that kernel's outputs only (XLA drops the other kernel when
    it can; else it adds the same time to every row). Breadth first: every (kernel, head_dim,
    seq) gets its default measured before any gets a second setting."""
    from vit.ops.flash_attention import flash_attention

    batch, heads = (1, 2) if dry_run else (128, 12)
    cases = [(20, 16)] if dry_run else [(577, 64), (197, 64), (577, 128), (197, 128)]
    grid = {}
    for seq, d in cases:
        for kernel in ("fwd", "dkv", "dq"):
            grid[(seq, d, kernel)] = _sweep_settings(kernel, seq, d, per_case)
    rounds = max(len(v) for v in grid.values())
    inputs = {}
    results = []
    for r in range(rounds):
        for (seq, d, kernel), settings in grid.items():
            if r >= len(settings):
                continue
            blocks, labels = settings[r]
            row = dict(kernel=kernel, seq=seq, head_dim=d, batch=batch, heads=heads,
                       dtype="bfloat16", **labels)
            flop = SWEEP_FLOP[kernel] * batch * heads * seq * seq * d

            def measure(seq=seq, d=d, kernel=kernel, blocks=blocks, flop=flop):
                if (seq, d) not in inputs:
                    inputs[(seq, d)] = _inputs(jax.random.PRNGKey(0), batch, seq, seq, heads,
                                               d, jnp.bfloat16)
                q, k, v, do = inputs[(seq, d)]
                attention = functools.partial(flash_attention, block_sizes=blocks)
                if kernel == "fwd":
                    return _timing(jax.jit(attention), (q, k, v), iters, flop)
                _, vjp_fn = jax.vjp(attention, q, k, v)
                grads = (lambda f, g: f(g)[1:]) if kernel == "dkv" else (lambda f, g: f(g)[0])
                return _timing(jax.jit(grads), (vjp_fn, do), iters, flop)

            row = _guarded(row, measure, deadline)
            results.append(row)
            print(f"blocks {row}", flush=True)
    return results


def _train_step_time(impl: str, batch: int, image_size: int, overrides: dict, iters: int):
    """Seconds per `vit train` step on ViT-B/16 (bfloat16, AdamW) and the first step's
    compile+run seconds; the batch is put on the devices once."""
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


def train_bench(dry_run: bool, iters: int, deadline: Deadline, min_left_s: float) -> dict:
    """One row per attention path; a row starts only with `min_left_s` of its budget left (a
    ViT-B/16 step compiles for tens of seconds), else it is skipped."""
    batch, image_size = (2, 32) if dry_run else (256, 224)
    # Dry run: a one-layer toy with ViT-B/16's structure, so CI stays fast.
    overrides = dict(width=64, depth=1, mlp_dim=128, num_heads=2) if dry_run else {}
    runs = []
    # On CPU "cudnn" falls back to "xla": the dry run skips compiling the same step twice.
    for impl in ("pallas", "xla") if dry_run else ("pallas", "cudnn", "xla"):
        def measure(impl=impl):
            try:
                seconds, first_step_s, config = _train_step_time(
                    impl, batch, image_size, overrides, iters)
            except ModuleNotFoundError as exc:
                # The training step reads its recipe (ml_collections) and builds its state with
                # the data stack (grain); a host with only the model's dependencies skips it.
                return {"status": "skipped", "reason": f"needs {exc.name}, which training "
                        "uses; install the package's full dependencies"}
            return {"step_ms": seconds * 1e3, "images_per_s": batch / seconds,
                    "mfu": batch / seconds * TRAIN_FLOP_PER_IMAGE / PEAK_FLOP_S,
                    "first_step_s": first_step_s, "dispatch": _dispatch(impl, batch, config)}

        row = _guarded(dict(impl=impl, batch=batch, image_size=image_size), measure, deadline,
                       min_left_s)
        runs.append(row)
        print(f"train_step {row}", flush=True)
    return dict(model="vit_b16", dtype="bfloat16", recipe=f"{train_step.RECIPE.name} with "
                f"{' '.join(train_step.ADAMW)}", dry_run_overrides=overrides, runs=runs)


def _forward_time(dtype: str, batch: int, image_size: int, overrides: dict, iters: int):
    """Seconds per eval-mode ViT-B/16 forward, the first call's compile+run seconds, the logits
    and the config. Both dtypes start from the same float32 weights (seed 0)."""
    from flax import nnx

    import vit

    model = vit.create_model("vit_b16", dtype=dtype, image_size=image_size, **overrides)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, images: nnx.merge(graphdef, state)(images))
    images = jax.random.normal(jax.random.PRNGKey(1), (batch, image_size, image_size, 3))
    start = time.perf_counter()
    logits = jax.block_until_ready(forward(state, images))
    first_call_s = time.perf_counter() - start
    seconds = common.time_call(lambda: forward(state, images), repeats=3, number=iters)
    return seconds["median_s"], first_call_s, logits, model.config


def inference_bench(dry_run: bool, iters: int, deadline: Deadline, min_left_s: float) -> list:
    """One row per (batch, dtype), float32 first; a bfloat16 row also gives its speed-up over
    the float32 row and their top-1 agreement. Random weights: the agreement shows the bfloat16
    path runs and is close, not what a trained checkpoint gives (the `agreement` mode)."""
    image_size = 32 if dry_run else 224
    overrides = dict(width=64, depth=1, mlp_dim=128, num_heads=2) if dry_run else {}
    rows = []
    for batch in (2,) if dry_run else (8, 256):
        float32 = None
        for dtype in ("float32", "bfloat16"):
            def measure(dtype=dtype, batch=batch):
                nonlocal float32
                seconds, first_call_s, logits, config = _forward_time(
                    dtype, batch, image_size, overrides, iters)
                out = {"ms": seconds * 1e3, "images_per_s": batch / seconds,
                       "first_call_s": first_call_s,
                       "dispatch": _dispatch("auto", batch, config, dtype)}
                if float32 is None:
                    float32 = (seconds, logits)
                    return out
                return {**out, "speedup_over_float32": float32[0] / seconds,
                        "top1_agreement": float(jnp.mean(jnp.argmax(logits, -1)
                                                         == jnp.argmax(float32[1], -1)))}

            row = _guarded(dict(model="vit_b16", batch=batch, image_size=image_size,
                                dtype=dtype), measure, deadline, min_left_s)
            rows.append(row)
            print(f"inference {row}", flush=True)
    return rows


def _dispatch(impl: str, batch: int, config, dtype: str = "bfloat16") -> str:
    """Which backend the model's attention dispatcher picks for this request, and why."""
    try:
        from vit.ops.attention import choose_impl

        shape = (batch, config.num_tokens, config.num_heads, config.head_dim)
        return " / ".join(choose_impl(impl, shape, shape, jnp.dtype(dtype), has_mask=False,
                                      dropout=False))
    except Exception as exc:
        return f"unknown ({_error(exc)})"


def _status(result: dict) -> dict:
    """Rows per status; a section that failed as a whole (no rows) counts as one failure."""
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    for section in ("correctness", "attention", "block_sweep", "inference"):
        for row in result.get(section, []):
            counts[row["status"]] += 1
    for row in result.get("train_step", {}).get("runs", []):
        counts[row["status"]] += 1
    counts["failed"] += sum(1 for section in ("train_step",)
                            if "error" in result.get(section, {}))
    return counts


def exit_code(status: dict) -> int:
    """1 if any row failed, else 3 if the time budget skipped any, else 0."""
    return 1 if status["failed"] else 3 if status["skipped"] else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks attention",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(common.ROOT / "benchmarks" / "gpu"),
                        help="results directory")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes in interpret mode (CPU CI)")
    parser.add_argument("--quick", action="store_true", help="the seq-577 attention rows only")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per repetition")
    parser.add_argument("--budget-s", type=float, default=300,
                        help="stop starting new measurements after this many seconds")
    args = parser.parse_args(argv)
    iters = args.iters or (1 if args.dry_run else 10)
    deadline = Deadline(args.budget_s)
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_attention.json"
    result = {
        "dry_run": args.dry_run,
        "quick": args.quick,
        "flop_convention": FLOP_CONVENTION,
        "budget_s": args.budget_s,
    }

    def save():
        result["status"] = _status(result)
        common.write_record("bench_attention", result, argv=argv, mode="attention", out=path)

    sweep = train = infer = not args.quick
    if not args.quick:
        result["correctness"] = correctness(args.dry_run)
        save()
    # Each section gets a share of the time left when it starts; what one leaves unused goes
    # to the next. The sweep runs before inference and the training step so it is not starved;
    # inference takes its share from the training step's.
    later = sweep + (infer or train)
    result["attention"] = attention_bench(args.dry_run, args.quick, iters,
                                          deadline.share(1.0 / (1 + 0.8 * later)))
    save()
    if sweep:
        per_case = 1 if args.dry_run else 4
        result["block_sweep"] = block_sweep(args.dry_run, iters, deadline.share(
            0.5 if infer or train else 1.0), per_case)
        save()
    if infer:
        # A row starts with ten seconds of its share left: a ViT-B/16 forward compiles in seconds.
        result["inference"] = inference_bench(args.dry_run, iters, deadline.share(
            0.35 if train else 1.0), min_left_s=0 if args.dry_run else 10)
        save()
    if train:
        try:
            result["train_step"] = train_bench(args.dry_run, max(iters // 2, 2), deadline,
                                               min_left_s=0 if args.dry_run else 40)
        except Exception as exc:  # e.g. the model package fails to import
            result["train_step"] = {"error": _error(exc), "runs": []}
        save()
    save()
    print(f"rows: {result['status']}")
    return exit_code(result["status"])

