"""Where a training step's time goes, ours beside transformers': a per-part table.

Ours: `vit train`'s jitted step (scripts/train_step.py), traced with the JAX profiler; every
thunk XLA:CPU runs is named after its HLO instruction, whose metadata (the JAX op and the
Python stack that made it) says which part of the model it belongs to and whether it is the
forward or the backward pass. Theirs: the step scripts/bench_train.py times
(ViTForImageClassification, AdamW, clipping), under torch.profiler, grouped by aten op.
Each side runs in its own process (ours, then theirs), `--steps` profiled steps after one
warm-up step; ours in the environment the `vit` command gives itself (vit/host_allocator.py),
compiled with jax's default XLA:CPU options (`VIT_XLA_DOTS=0`): there every product is a
YNNPACK fusion the profiler times whole, while XLA's own dots (what `vit train` compiles with,
vit/inference/xla_cpu.py) run asynchronously on its thread pool and their time is not
attributable op by op.
Prints both tables; `--out` writes them as a record.

And `ceiling`: whether a speed ratio to transformers (`--target`, 1.1) is within reach of this
machine at all. Each worker also times one large square float32 product (the best of a few: the
machine's float32 peak as far as that library reaches it, as scripts/bench_gemm.py measures it).
Our step's matrix-product FLOPs are counted from its compiled HLO (every dot, fused or not);
transformers' from the shapes (the same model, every block in full). From them: the time our
products would take at the peak, the time the target allows, and what that leaves for the rest
of the step (LayerNorm, GELU, softmax, residual adds, copies, optimiser), beside what the rest
takes in each library now.

    python scripts/profile_train_step.py [--case S/16:32] [--steps 2] [--set KEY=VALUE ...]
        [--target 1.1] [--out benchmarks/profile_train_step.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_gemm
import bench_train
import records
import train_step

from vit import host_allocator
from vit.inference import xla_cpu

# (file suffix, function name or None, part): the first rule that any frame of an op's stack
# matches, innermost frame first.
RULES = (
    ("vit/ops/attention.py", None, "attention core (QK^T, softmax, PV)"),
    ("flax/nnx/nn/normalization.py", None, "LayerNorm"),
    ("vit/models/blocks.py", "exact", "GELU"),
    ("vit/models/blocks.py", "_erf", "GELU"),
    ("optax/", None, "optimiser (clip + AdamW)"),
    ("vit/train/losses.py", None, "loss + accuracy"),
    ("vit/models/vit.py", "embed", "patch embedding"),
)
LINEAR = ("flax/nnx/nn/linear.py", "vit/ops/matmul.py")
# Side of the square product that measures the machine's float32 peak (17 GFLOP a call).
PEAK_SIZE = 2048
# Parts that are matrix products: what the peak bounds. Ours by part name, theirs by aten op.
OUR_PRODUCTS = ("dense layers", "attention core", "patch embedding")
THEIR_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mkldnn_convolution",
                  "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention")


def _tables(hlo: str):
    """{frame id: [(file, function, line), innermost first]} from the HLO text's stack tables."""
    sections = dict.fromkeys(("FileNames", "FunctionNames", "FileLocations", "StackFrames"))
    current = None
    for line in hlo.splitlines():
        if line in sections:
            current, sections[line] = line, {}
            continue
        if current is None:
            continue
        m = re.match(r"(\d+) (.*)", line)
        if not m:
            if sections["StackFrames"]:
                break
            current = None
            continue
        sections[current][int(m.group(1))] = m.group(2)
    names = {k: v.strip('"') for k, v in (sections["FileNames"] or {}).items()}
    funcs = {k: v.strip('"') for k, v in (sections["FunctionNames"] or {}).items()}
    locs = {}
    for k, v in (sections["FileLocations"] or {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        locs[k] = (names.get(int(f["file_name_id"]), "?"),
                   funcs.get(int(f["function_name_id"]), "?"), int(f["line"]))
    frames = {}
    for k, v in (sections["StackFrames"] or {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        frames[k] = (int(f["file_location_id"]), int(f["parent_frame_id"]))

    def stack(fid):
        out, seen = [], set()
        while fid in frames and fid not in seen:
            seen.add(fid)
            loc, parent = frames[fid]
            out.append(locs.get(loc, ("?", "?", 0)))
            fid = parent
        return out

    return stack


def classify(op_name: str, frames: list) -> str:
    direction = "backward" if "transpose(" in op_name else "forward"
    for file, func, _ in frames:
        for suffix, want, part in RULES:
            if suffix in file and (want is None or func == want):
                if part.startswith("optimiser"):
                    return part
                return f"{part}, {direction}"
        if file.endswith(LINEAR):
            return f"dense layers (qkv, proj, fc1, fc2, head), {direction}"
    if "isfinite" in op_name or "reduce_and" in op_name:
        return "finite check"
    if any(f.endswith("vit/train/step.py") for f, _, _ in frames[:1]):
        return "step (update apply, finite check)"
    return f"other (copies, layout, residual adds), {direction}"


def _shape(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def hlo_dot_flops(hlo: str) -> int:
    """Matrix-product FLOPs (2 per multiply-add) of every dot in a compiled HLO module, inside
    fusions or not: 2 x output elements x the contracted size."""
    shapes = dict(re.findall(r"%([\w.\-]+) = \w+\[([\d,]*)\]", hlo))
    flops = 0
    for out, lhs, dims in re.findall(
            r"= \w+\[([\d,]*)\]\S* dot\(%([\w.\-]+), [^)]*\),[^\n]*?"
            r"lhs_contracting_dims=\{([\d,]*)\}", hlo):
        lhs_shape = _shape(shapes[lhs])
        contracted = 1
        for d in _shape(dims):
            contracted *= lhs_shape[d]
        n = 1
        for d in _shape(out):
            n *= d
        flops += 2 * n * contracted
    return flops


def step_flops(hf_config: dict, batch: int, classes: int) -> int:
    """Matrix-product FLOPs of one training step of transformers' ViT (its config.json), every
    block in full: the forward, then two products in the backward for each forward one (input
    and weight gradients), except the patch embedding's (no gradient for the image)."""
    width, mlp = hf_config["hidden_size"], hf_config["intermediate_size"]
    side, size = hf_config["patch_size"], hf_config["image_size"]
    patches = (size // side) ** 2
    tokens = patches + 1
    rows = batch * tokens
    dense = 2 * rows * (width * 3 * width + width * width + 2 * width * mlp)
    attention = 2 * 2 * batch * tokens * tokens * width
    embed = 2 * batch * patches * side * side * hf_config["num_channels"] * width
    head = 2 * batch * width * classes
    return 3 * (hf_config["num_hidden_layers"] * (dense + attention) + head) + 2 * embed


def peak_rate(library: str, iters: int = 5) -> float:
    """GFLOP/s of `library`'s fastest square float32 product of side PEAK_SIZE."""
    import numpy as np

    a = np.random.RandomState(0).randn(PEAK_SIZE, PEAK_SIZE).astype(np.float32)
    if library == "torch":
        import torch

        t = torch.from_numpy(a)
        return bench_gemm._best_rate(lambda: torch.mm(t, t), 2 * PEAK_SIZE ** 3, iters)
    import jax

    x = jax.numpy.asarray(a)
    square = jax.jit(lambda a: a @ a)
    return bench_gemm._best_rate(lambda: square(x).block_until_ready(), 2 * PEAK_SIZE ** 3,
                                 iters)


def ceiling(results: dict, target: float) -> dict:
    """How fast the rest of the step must be for `target` x transformers' step, if our matrix
    products ran at the machine's peak, beside what the rest takes now."""
    ours, theirs = results["vit"], results["transformers"]
    peak = max(ours["peak_gflop_s"], theirs["peak_gflop_s"])

    def products_s(res, names):
        return sum(v for k, v in res["parts_s"].items() if k.startswith(names))

    allowed = theirs["step_s"] / target
    at_peak = ours["matmul_gflop"] / peak
    return {
        "target": target, "peak_gflop_s": peak, "peak_product_side": PEAK_SIZE,
        "square_product_gflop_s": {"xla": ours["peak_gflop_s"],
                                   "torch": theirs["peak_gflop_s"]},
        "matmul_gflop": {"vit": ours["matmul_gflop"], "transformers": theirs["matmul_gflop"]},
        "step_fraction_of_peak": {
            "vit": ours["matmul_gflop"] / ours["step_s"] / peak,
            "transformers": theirs["matmul_gflop"] / theirs["step_s"] / peak},
        "products_fraction_of_peak": {
            "vit": ours["matmul_gflop"] / products_s(ours, OUR_PRODUCTS) / peak,
            "transformers": theirs["matmul_gflop"] / products_s(theirs, THEIR_PRODUCTS)
            / peak},
        "step_s_target_allows": allowed,
        "vit_products_at_peak_s": at_peak,
        "rest_s_allowed_if_products_at_peak": allowed - at_peak,
        "rest_s_now": {"vit": ours["step_s"] - products_s(ours, OUR_PRODUCTS),
                       "transformers": theirs["step_s"] - products_s(theirs, THEIR_PRODUCTS)},
    }


def profile_vit(case: str, sets: list[str], folder: Path, steps: int) -> dict:
    import jax
    import numpy as np

    step = train_step.build(bench_train.recipe(case, sets), bench_train.CLASSES)
    data = np.load(folder / "batch.npz")
    batch = step.put(step.batch(data["images"], data["labels"]))
    hlo = step.step_fn.lower(step.params, step.opt_state, step.ema, batch, step.config.seed,
                             step.step).compile().as_text()
    peak = peak_rate("jax")
    jax.block_until_ready(step(batch))
    trace = folder / "trace"
    start = time.perf_counter()
    jax.profiler.start_trace(str(trace))
    for _ in range(steps):
        jax.block_until_ready(step(batch))
    jax.profiler.stop_trace()
    wall = time.perf_counter() - start
    stack = _tables(hlo)
    entry = hlo[hlo.index("\nENTRY"):]
    part_of = {}
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = ", line)
        if not m:
            continue
        op = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        part_of[m.group(1)] = classify(op.group(1) if op else "",
                                       stack(int(frame.group(1))) if frame else [])
    pb = glob.glob(str(trace / "**" / "*.xplane.pb"), recursive=True)[-1]
    profile = jax.profiler.ProfileData.from_file(pb)
    totals = collections.Counter()
    for plane in profile.planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name in part_of:
                    totals[part_of[ev.name]] += ev.duration_ns / 1e9 / steps
    return {"step_s": wall / steps, "parts_s": dict(totals),
            "matmul_gflop": hlo_dot_flops(hlo) / 1e9, "peak_gflop_s": peak}


def profile_transformers(case: str, folder: Path, steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    run = bench_train.transformers_step(folder)
    run()
    peak = peak_rate("torch")
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    wall = time.perf_counter() - start
    totals = collections.Counter()
    for ev in prof.key_averages():
        # Self time per aten op: nested ops are not counted twice.
        if ev.key.startswith("aten::") or ev.key.startswith("Optimizer"):
            totals[ev.key] += ev.self_cpu_time_total / 1e6 / steps
    del torch
    hf_config = json.loads((folder / "hf" / "config.json").read_text())
    batch = int(case.split(":")[1])
    flops = step_flops(hf_config, batch, bench_train.CLASSES)
    return {"step_s": wall / steps, "parts_s": dict(totals.most_common(25)),
            "matmul_gflop": flops / 1e9, "peak_gflop_s": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="S/16:32")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--target", type=float, default=1.1,
                        help="the speed ratio to transformers the ceiling is worked out for")
    parser.add_argument("--json", "--out", dest="json", metavar="PATH",
                        help="write the record (benchmarks/profile_train_step.json)")
    parser.add_argument("--worker", choices=("vit", "transformers"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out = (profile_vit(args.case, args.set, args.folder, args.steps)
               if args.worker == "vit"
               else profile_transformers(args.case, args.folder, args.steps))
        print(json.dumps(out))
        return
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"--set={s}" for s in args.set]
        subprocess.run([sys.executable, bench_train.__file__, "--worker", "prepare", "--case",
                        args.case, "--folder", tmp, *sets], env=env, check=True)
        for kind in ("vit", "transformers"):
            proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--case",
                                   args.case, "--folder", tmp, "--steps", str(args.steps),
                                   *sets], capture_output=True, text=True,
                                  env={**host_allocator.environment(env),
                                       xla_cpu.OPT_OUT: "0"}
                                  if kind == "vit" else env)
            if proc.returncode:
                raise SystemExit(f"{kind}:\n{proc.stderr[-3000:]}")
            results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind, res in results.items():
        total = sum(res["parts_s"].values())
        print(f"\n{kind}: step {res['step_s']:.2f} s wall; parts below sum the time of every "
              f"op on every thread ({total:.2f} s)")
        for part, secs in sorted(res["parts_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {secs:8.3f} s  {100 * secs / total:5.1f}%  {part}")
    bound = ceiling(results, args.target)
    print(f"\nceiling for {args.target}x: peak {bound['peak_gflop_s']:.0f} GFLOP/s; our "
          f"{bound['matmul_gflop']['vit']:.0f} GFLOP of products take "
          f"{bound['vit_products_at_peak_s']:.2f} s at the peak of the "
          f"{bound['step_s_target_allows']:.2f} s the target allows, leaving "
          f"{bound['rest_s_allowed_if_products_at_peak']:.2f} s for the rest "
          f"(now: ours {bound['rest_s_now']['vit']:.2f} s, "
          f"transformers' {bound['rest_s_now']['transformers']:.2f} s)")
    if args.json:
        records.write(args.json, {
            "benchmark": "where a training step's time goes, ours (vit train's step, in the "
                         "`vit` command's environment, compiled with jax's default XLA:CPU "
                         "options) beside transformers' (by aten op)",
            "case": args.case, "profiled_steps": args.steps, **results, "ceiling": bound},
            extra_packages=("torch", "transformers"))


if __name__ == "__main__":
    main()
