"""Where a training step's time goes, ours beside transformers': a per-part table.

Ours: `vit train`'s jitted step (scripts/train_step.py), traced with the JAX profiler; every
thunk XLA:CPU runs is named after its HLO instruction, whose metadata (the JAX op and the
Python stack that made it) says which part of the model it belongs to and whether it is the
forward or the backward pass. Theirs: the step scripts/bench_train.py times
(ViTForImageClassification, AdamW, clipping), under torch.profiler, grouped by aten op.
Each side runs in its own process (ours, then theirs), `--steps` profiled steps after one
warm-up step; ours in the environment the `vit` command gives itself (vit/host_allocator.py).
Prints both tables; `--out` writes them as a record.

    python scripts/profile_train_step.py [--case S/16:32] [--steps 2] [--set KEY=VALUE ...]
        [--out benchmarks/profile_train_step.json]
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

import bench_train
import records
import train_step

from vit import host_allocator

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


def profile_vit(case: str, sets: list[str], folder: Path, steps: int) -> dict:
    import jax
    import numpy as np

    step = train_step.build(bench_train.recipe(case, sets), bench_train.CLASSES)
    data = np.load(folder / "batch.npz")
    batch = step.put(step.batch(data["images"], data["labels"]))
    hlo = step.step_fn.lower(step.params, step.opt_state, step.ema, batch, step.config.seed,
                             step.step).compile().as_text()
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
    return {"step_s": wall / steps, "parts_s": dict(totals)}


def profile_transformers(folder: Path, steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    run = bench_train.transformers_step(folder)
    run()
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
    return {"step_s": wall / steps, "parts_s": dict(totals.most_common(25))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="S/16:32")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--json", "--out", dest="json", metavar="PATH",
                        help="write the record (benchmarks/profile_train_step.json)")
    parser.add_argument("--worker", choices=("vit", "transformers"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out = (profile_vit(args.case, args.set, args.folder, args.steps)
               if args.worker == "vit" else profile_transformers(args.folder, args.steps))
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
                                  env=host_allocator.environment(env)
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
    if args.json:
        records.write(args.json, {
            "benchmark": "where a training step's time goes, ours (vit train's step, in the "
                         "`vit` command's environment) beside transformers' (by aten op)",
            "case": args.case, "profiled_steps": args.steps, **results},
            extra_packages=("torch", "transformers"))


if __name__ == "__main__":
    main()
