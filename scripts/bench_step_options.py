"""`vit train`'s step compiled with each set of XLA:CPU options, alternating in one process.

The step (scripts/train_step.py, float32) is lowered once and compiled several ways: with jax's
defaults (YNNPACK for dots, reductions and elementwise ops) and with the options a float32 step
gets (`vit.inference.xla_cpu.TRAINING`: XLA's own dots, YNNPACK's reductions, the
memory-optimised schedule), plus any `--variant NAME:KEY=VALUE[;KEY=VALUE]`. One process,
the same batch and state passed along, the variants alternating (the order rotated by one
every round): the fairest comparison of compile options this host allows, where separate processes
drift with the other tenants. Per round, each variant's faster of `--steps` steps; then each
variant's ratio to the defaults by round and the median, and each compile's scratch memory a
step (`memory_analysis().temp_size_in_bytes`). Runs in the `vit` command's environment (huge
pages, vit/host_allocator.py). `--whole-batch` adds `vit_whole_batch`: our options on the step
as it was before a CPU step split a large batch into cache-sized micro-batches
(vit/train/step.py `MICRO_TOKENS`), its batch in one piece. `--dtype bfloat16` times the
bfloat16 step instead (its options: `xla_cpu.SCHEDULE` alone).

    python scripts/bench_step_options.py [--case S/16:32 --case B/16:8] [--rounds 4]
        [--steps 2] [--variant NAME:KEY=VALUE ...] [--whole-batch] [--dtype bfloat16]
        [--out benchmarks/bench_step_options.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import bench_train
import records
import train_step

from vit import host_allocator
from vit.inference import xla_cpu

WHOLE = "vit_whole_batch"


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, options = text.partition(":")
    pairs = (pair.split("=", 1) for pair in options.split(";") if pair)
    # XLA takes a boolean option only as a bool, not as the text "true".
    return name, {k: {"true": True, "false": False}.get(v.lower(), v) for k, v in pairs}


def measure(case: str, variants: dict, rounds: int, steps: int, whole_batch: bool,
            dtype: str = "float32") -> dict:
    import jax
    import numpy as np

    config = bench_train.recipe(case, [], dtype)
    step = train_step.build(config, bench_train.CLASSES)
    batch_size = int(case.split(":")[1])
    rng = np.random.default_rng(0)
    batch = step.put(step.batch(rng.normal(size=(batch_size, 224, 224, 3)).astype(np.float32),
                                rng.integers(0, bench_train.CLASSES, batch_size)))
    args = (step.params, step.opt_state, step.ema, batch, step.config.seed, 0)
    lowered = step.step_fn.lower(*args)
    compiled = {name: lowered.compile(options) for name, options in variants.items()}
    if whole_batch:  # the same state and batch; only the step's trace differs
        whole = train_step.build(config, bench_train.CLASSES, whole_batch=True)
        compiled[WHOLE] = whole.step_fn.lower(*args).compile(xla_cpu.training_options(dtype))
    state = (step.params, step.opt_state, step.ema)

    def run(fn, state):
        *state, metrics = fn(*state, batch, step.config.seed, 0)
        jax.block_until_ready(metrics)
        return tuple(state)

    for fn in compiled.values():  # one untimed step each: warm caches and allocator
        state = run(fn, state)
    times = {name: [] for name in compiled}
    order = list(compiled)
    for r in range(rounds):
        # The order rotates by one each round: every variant follows every other equally
        # often and never itself (a program run straight after itself runs faster here).
        for name in order[r % len(order):] + order[:r % len(order)]:
            best = float("inf")
            for _ in range(steps):
                start = time.perf_counter()
                state = run(compiled[name], state)
                best = min(best, time.perf_counter() - start)
            times[name].append(best)
        print(f"{case} round {r}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
              file=sys.stderr, flush=True)
    base = times["jax_defaults"]
    ratios = {name: [b / t for b, t in zip(base, ts, strict=True)]
              for name, ts in times.items() if name != "jax_defaults"}
    return {"case": case, "step_s": times,
            "scratch_bytes": {n: c.memory_analysis().temp_size_in_bytes
                              for n, c in compiled.items()},
            "speedup_over_jax_defaults": ratios,
            "median_speedup": {n: statistics.median(r) for n, r in ratios.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="model:batch, repeatable "
                        f"(default: {' and '.join(bench_train.CASES)})")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant a round")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE",
                        help="another set of compile options, repeatable")
    parser.add_argument("--whole-batch", action="store_true",
                        help=f"also time {WHOLE}: the step with its batch in one piece")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the step's compute dtype")
    parser.add_argument("--out", default=records.default_out("bench_step_options"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = {"jax_defaults": {}, "vit": xla_cpu.training_options(args.dtype),
                **dict(parse_variant(v) for v in args.variant)}
    if args.worker:
        print(json.dumps(measure(args.worker, variants, args.rounds, args.steps,
                                 args.whole_batch, args.dtype)))
        return
    # The jit's own options are off (VIT_XLA_DOTS=0), so "jax_defaults" compiles with none.
    env = {**host_allocator.environment(), "JAX_PLATFORMS": "cpu", xla_cpu.OPT_OUT: "0"}
    cases = []
    for case in args.case or bench_train.CASES:
        argv = [sys.executable, __file__, "--worker", case, "--rounds", str(args.rounds),
                "--steps", str(args.steps), *(f"--variant={v}" for v in args.variant),
                *(["--whole-batch"] if args.whole_batch else []), "--dtype", args.dtype]
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode:
            raise SystemExit(f"{case}: the worker failed")
        cases.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{case}: " + ", ".join(f"{n} {m:.2f}x" for n, m in
                                      cases[-1]["median_speedup"].items()) + " jax's defaults")
    records.write(args.out, {
        "benchmark": f"vit train's {args.dtype} step compiled with each set of XLA:CPU "
                     "options, alternating in one process",
        "dtype": args.dtype,
        "variants": {**variants,
                     **({WHOLE: {**xla_cpu.training_options(args.dtype), "micro_tokens": None}}
                        if args.whole_batch else {})},
        "rounds": args.rounds, "timed_steps_per_round": args.steps,
        "environment": host_allocator.environment().get("GLIBC_TUNABLES", "(none)"),
        "cases": cases})


if __name__ == "__main__":
    main()
