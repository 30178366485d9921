"""Training-step speed: the step `vit train` runs against transformers' PyTorch ViT doing the
same step, on the CPU, in float32 and in bfloat16.

Ours is `vit train`'s own jitted step (benchmarks/train_step.py builds it from the recipe with the
package's functions, as vit/training/loop.py does): `make_train_step` with the optimiser
`make_optimizer` builds (global-norm clipping, then AdamW with weight decay on the weight
matrices), the recipe's loss with its label smoothing, the accuracy metric and the check that
the weights stayed finite. Theirs: `ViTForImageClassification` loaded from a Hugging Face folder
that our writer made of the same initial weights, `torch.optim.AdamW` with the same rate, betas
and decay mask, `clip_grad_norm_` at the same norm, cross-entropy with the same smoothing,
accuracy and the same finiteness check. Both get the same batch (NHWC for us, NCHW for torch).

Every measurement runs in its own process (`common.run_side`), ours and theirs alternating
(the order flips every round), so neither warms the other's caches or competes for cores;
torch uses a thread per core. Ours runs in the environment the `vit` command gives itself
(GLIBC_TUNABLES asking for huge pages), transformers' in the caller's; the record names both.
`--interleave` keeps every process alive instead (`common.Side`: compiled and warmed up once)
and asks each for a run in turn, the order flipping every round: rounds cost only their steps
and the two sides of a round run seconds apart, so the host's drift between minutes leaves the
ratios.
Each such run starts with `--rewarm` untimed steps (default 1), on both sides: on a virtual
machine that hands a guest's free memory back to its host (free page reporting, as the
Firecracker VMs these records come from do), memory a process freed a second or more ago is
gone, and the first step after the other side's run faults it all in again. Our step frees its
scratch memory at its end and takes it again at the next start, so that first step pays more
than transformers' does. `vit train` runs its steps back to back and does not pay it; the
record keeps those steps' times.
`--plain-malloc` times ours a second time in the caller's environment, to show what that gains;
`--jax-defaults` times ours once more compiled with jax's default XLA:CPU options
(`VIT_XLA_DOTS=0`: YNNPACK's dots instead of XLA's), likewise. With either, the record is
`train_variants` (what our environment and compile options gain), else `train`.
Per case: each run's median step time, each round's ratio (transformers' time / ours: above 1
means ours is faster) and their median, each process's peak memory, and each side's loss at its
first and last step: from the same weights and batch the first agrees when the two steps
compute the same thing. The recipe is configs/imagefolder.py with AdamW (train_step.ADAMW);
`--set` changes it further, as it would `vit train`'s.

bfloat16 compares like with like: our mixed-precision step (float32 master weights, bfloat16
matrix products with float32 accumulation) against transformers' model cast with
`.to(torch.bfloat16)`; each round also gives our float32 step over our bfloat16 step. The
record names the CPU and its bfloat16 features: on a CPU without bfloat16
arithmetic the bfloat16 figures are recorded but say nothing about one that has it.

    python -m benchmarks train [--case B/16:8 --case S/16:32] [--dtype float32
        --dtype bfloat16] [--rounds 3] [--steps 3] [--warmup 1] [--set KEY=VALUE ...]
        [--plain-malloc] [--jax-defaults] [--interleave] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common, memory, train_step

CASES = ("B/16:8", "S/16:32")
# Ours once more, changed one way (what each change gains, measured in the same run):
# {contestant: (record key, --flag)}. PLAIN: in the caller's environment, without the huge-page
# tunable; DEFAULTS: with jax's default XLA:CPU compile options.
PLAIN, DEFAULTS = "vit_plain_malloc", "vit_jax_defaults"
VARIANTS = {PLAIN: ("plain_malloc", "plain_malloc"), DEFAULTS: ("jax_defaults", "jax_defaults")}
CLASSES = 1000
# What transformers' side mirrors (the values it can run, the first being a key's default); a
# recipe that needs more is refused rather than compared.
MIRRORED = {"optim.name": ("adamw",), "optim.layer_decay": (1.0, 0.0, None),
            "optim.trainable": (".*",), "optim.lr_mults": (None, []),
            "optim.no_decay": (None, ""),
            "model.dropout": (0.0,), "model.attention_dropout": (0.0,),
            "model.drop_path": (0.0,), "train.accum_steps": (1,), "train.ema_decay": (0.0,),
            "input.mixup": (0.0,), "input.cutmix": (0.0,)}


def recipe(case: str, sets: list[str], dtype: str = "float32"):
    model, batch = case.split(":")
    return train_step.load_recipe([*train_step.ADAMW, f"model.dtype={dtype}",
                                   f"model.name={model}", f"train.batch_size={batch}", *sets])


def spec_of(config) -> dict:
    """What transformers' worker needs of the recipe, after checking it can mirror it."""
    for key, allowed in MIRRORED.items():
        section, name = key.split(".")
        have = config[section].get(name, allowed[0])
        if have not in allowed:
            raise SystemExit(f"{key}={have!r}: transformers' side here runs {key}="
                             f"{allowed[0]!r} only; leave it at that for this benchmark")
    o = config.optim
    return {"lr": o.lr, "b1": o.b1, "b2": o.b2, "weight_decay": o.weight_decay,
            "clip_norm": o.clip_norm, "label_smoothing": config.input.label_smoothing,
            "batch": config.train.batch_size, "image_size": config.input.image_size}


def prepare(case: str, sets: list[str], folder: str) -> dict:
    """The Hugging Face folder of our initial weights, the batch, and transformers' spec."""
    import numpy as np

    from vit.checkpoints import save_checkpoint

    folder = Path(folder)
    config = recipe(case, sets)
    spec = spec_of(config)
    save_checkpoint(train_step.initial_weights(config, CLASSES), folder / "hf", "hf")
    rng = np.random.default_rng(0)
    size = spec["image_size"]
    np.savez(folder / "batch.npz", labels=rng.integers(0, CLASSES, spec["batch"]),
             images=rng.normal(size=(spec["batch"], size, size, 3)).astype(np.float32))
    (folder / "spec.json").write_text(json.dumps(spec))
    return spec


def vit_step(case: str, sets: list[str], folder: Path, dtype: str = "float32"):
    """Our side of one step, as a function: `vit train`'s jitted step, waited for; returns the
    loss."""
    import jax
    import numpy as np

    step = train_step.build(recipe(case, sets, dtype), CLASSES)
    data = np.load(folder / "batch.npz")
    batch = step.put(step.batch(data["images"], data["labels"]))

    def run() -> float:
        metrics = jax.block_until_ready(step(batch))
        assert bool(metrics["finite"]), "the weights became non-finite"
        return float(metrics["loss"])

    return run


def transformers_step(folder: Path, dtype: str = "float32"):
    """transformers' side of one step, as a function: forward, loss, backward, clipping,
    AdamW, accuracy and the finiteness check; returns the loss."""
    import numpy as np
    import torch
    from transformers import ViTForImageClassification

    torch.set_num_threads(os.cpu_count())
    spec = json.loads((folder / "spec.json").read_text())
    model = ViTForImageClassification.from_pretrained(folder / "hf").train()
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)  # as people run torch in bfloat16: the weights too
    params = dict(model.named_parameters())
    # Decay on the weight matrices only, as make_optimizer's mask (kernels, not biases,
    # norms, position embeddings or the class token).
    decayed = [p for n, p in params.items() if n.endswith(".weight") and p.ndim >= 2]
    rest = [p for n, p in params.items() if not (n.endswith(".weight") and p.ndim >= 2)]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": spec["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=spec["lr"], betas=(spec["b1"], spec["b2"]), eps=1e-8)
    data = np.load(folder / "batch.npz")
    images = torch.from_numpy(data["images"].transpose(0, 3, 1, 2).copy()).to(model.dtype)
    labels = torch.from_numpy(data["labels"])

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        logits = model(pixel_values=images).logits.float()
        loss = torch.nn.functional.cross_entropy(logits, labels,
                                                 label_smoothing=spec["label_smoothing"])
        loss.backward()
        if spec["clip_norm"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip_norm"])
        opt.step()
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == labels).float().mean()
            finite = torch.stack([p.isfinite().all() for p in params.values()]).all()
        loss, _, finite = loss.item(), accuracy.item(), finite.item()
        assert finite, "the weights became non-finite"
        return loss

    return step


def timed(step, count: int) -> tuple[list[float], list[float]]:
    """`count` steps: (their times, their losses)."""
    times, losses = [], []
    for _ in range(count):
        start = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - start)
    return times, losses


def _step(kind: str, case: str, dtype: str, folder: str, sets: list[str]):
    folder = Path(folder)
    return (transformers_step(folder, dtype) if kind == "transformers"
            else vit_step(case, sets, folder, dtype))


def side(kind: str, case: str, dtype: str, folder: str, sets: list[str], steps: int,
         warmup: int) -> dict:
    """One run in a fresh process: `warmup` untimed steps (the compile), then `steps` timed
    ones."""
    step = _step(kind, case, dtype, folder, sets)
    _, first = timed(step, warmup)
    times, losses = timed(step, steps)
    losses = first + losses
    return {"times": times, "loss_first": losses[0], "loss_last": losses[-1], **memory.probe()}


def serve(kind: str, case: str, dtype: str, folder: str, sets: list[str], steps: int,
          warmup: int, rewarm: int):
    """`--interleave`'s side (`common.Side`): the warm-up once, then per run `rewarm` untimed
    steps and `steps` timed ones."""
    step = _step(kind, case, dtype, folder, sets)
    _, losses = timed(step, warmup)
    first = [losses[0] if losses else None]

    def run() -> dict:
        untimed, early = timed(step, rewarm)
        times, losses = timed(step, steps)
        first[0] = (early + losses)[0] if first[0] is None else first[0]
        return {"times": times, "rewarm_times": untimed, "loss_first": first[0],
                "loss_last": losses[-1], **memory.probe()}

    return run


def environment(kind: str) -> dict:
    """A contestant's environment: ours as the `vit` command gives itself (huge pages for
    XLA's scratch memory), transformers' and the plain-malloc variant as it is."""
    from vit.cpu import huge_pages, xla_options

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if kind in ("vit", DEFAULTS):
        env = huge_pages.environment(env)
    if kind == DEFAULTS:
        env[xla_options.OPT_OUT] = "0"
    return env


def side_args(kind: str, case: str, dtype: str, folder: Path, args) -> dict:
    return {"kind": "transformers" if kind == "transformers" else "vit", "case": case,
            "dtype": dtype, "folder": str(folder), "sets": args.set, "steps": args.steps,
            "warmup": args.warmup}


def measure(case: str, folder: Path, args) -> dict:
    """Every (library, dtype) once per round, the order reversed every other round."""
    contestants = [(kind, dtype) for dtype in args.dtype for kind in ("vit", "transformers")]
    variants = [kind for kind, (_, flag) in VARIANTS.items() if getattr(args, flag)]
    contestants += [(kind, dtype) for kind in variants for dtype in args.dtype]
    runs = {c: [] for c in contestants}
    # --interleave: every contestant's process started (and compiled) once, all alive at once.
    # Between runs, time for the other process's idle threads to stop spinning.
    servers = ({(kind, dtype): common.Side(
        "benchmarks.train:serve", {**side_args(kind, case, dtype, folder, args),
                                   "rewarm": args.rewarm},
        env=environment(kind), settle_s=0.5) for kind, dtype in contestants}
        if args.interleave else {})
    for r in range(args.rounds):
        for kind, dtype in contestants if r % 2 == 0 else contestants[::-1]:
            out = (servers[kind, dtype]() if servers
                   else common.run_side("benchmarks.train:side",
                                        side_args(kind, case, dtype, folder, args),
                                        env=environment(kind)))
            runs[kind, dtype].append({**out, "median_step_s": statistics.median(out["times"])})
            print(f"{case} round {r}: {kind} {dtype} median step "
                  f"{runs[kind, dtype][-1]['median_step_s']:.3f} s, peak RSS "
                  f"{out['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    for server in servers.values():
        server.close()
    result = {"case": case, "model": case.split(":")[0], "batch": int(case.split(":")[1])}
    for dtype in args.dtype:
        vit, tf = runs["vit", dtype], runs["transformers", dtype]
        ratios = [t["median_step_s"] / v["median_step_s"] for v, t in zip(vit, tf, strict=True)]
        result[dtype] = {
            "median_step_s": {"vit": [x["median_step_s"] for x in vit],
                              "transformers": [x["median_step_s"] for x in tf]},
            "step_times_s": {"vit": [x["times"] for x in vit],
                             "transformers": [x["times"] for x in tf]},
            "untimed_step_times_s": {"vit": [x.get("rewarm_times", []) for x in vit],
                                     "transformers": [x.get("rewarm_times", []) for x in tf]},
            "ratio_transformers_over_vit": ratios,
            "median_ratio": statistics.median(ratios),
            "peak_rss_bytes": {"vit": max(x["peak_rss_bytes"] for x in vit),
                               "transformers": max(x["peak_rss_bytes"] for x in tf)},
            "loss_first": {"vit": vit[0]["loss_first"], "transformers": tf[0]["loss_first"]},
            "loss_last": {"vit": vit[0]["loss_last"], "transformers": tf[0]["loss_last"]},
            "loss_last_relative_difference": abs(vit[0]["loss_last"] / tf[0]["loss_last"] - 1)}
        for kind in variants:
            other = [x["median_step_s"] for x in runs[kind, dtype]]
            gains = [o / v["median_step_s"] for o, v in zip(other, vit, strict=True)]
            result[dtype][VARIANTS[kind][0]] = {"median_step_s": other, "ratio_over_vit": gains,
                                                "median_ratio": statistics.median(gains),
                                                "loss_last": runs[kind, dtype][0]["loss_last"]}
    if "float32" in args.dtype and "bfloat16" in args.dtype:
        # Our own bfloat16 step against our float32 step, round by round.
        ours = [f["median_step_s"] / b["median_step_s"] for f, b in
                zip(runs["vit", "float32"], runs["vit", "bfloat16"], strict=True)]
        result["vit_float32_over_bfloat16"] = ours
        result["vit_bfloat16_speedup_median"] = statistics.median(ours)
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", metavar="MODEL:BATCH",
                        help=f"model and batch size, repeatable (default: {' and '.join(CASES)})")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps (compile) per run")
    parser.add_argument("--dtype", action="append", choices=("float32", "bfloat16"),
                        help="compute dtype, repeatable (default: float32, and bfloat16 on a "
                             "CPU with bfloat16 arithmetic); "
                             "transformers' side runs the same (its model cast to bfloat16)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override, as `vit train --set`")
    parser.add_argument("--jax-defaults", action="store_true",
                        help="also time ours compiled with jax's default XLA:CPU options "
                             "(VIT_XLA_DOTS=0), in the same run")
    parser.add_argument("--plain-malloc", action="store_true",
                        help="also time ours without the huge-page tunable the `vit` command "
                             "sets (what it gains)")
    parser.add_argument("--interleave", action="store_true",
                        help="keep every contestant's process alive (compiled once) and "
                             "alternate their runs round by round: many short rounds, so the "
                             "host's drift between minutes cancels out of each round's ratio")
    parser.add_argument("--rewarm", type=int, default=1,
                        help="--interleave: untimed steps at the start of every run, both "
                             "sides (memory a VM took back while the process waited)")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--out", default=None, help="record path (default benchmarks/records/)")
    args = parser.parse_args(argv)
    cases = args.case or list(CASES)
    if not args.dtype:
        # Without bfloat16 arithmetic torch's bfloat16 step is emulated and takes many times
        # the float32 one: asked for by name only there.
        bf16 = common.cpu().get("bfloat16_arithmetic")
        args.dtype = ["float32", "bfloat16"] if bf16 else ["float32"]
        if args.dtype == ["float32"]:
            print("this CPU has no bfloat16 arithmetic: float32 only (--dtype bfloat16 to time "
                  "it anyway)", flush=True)
    from vit.cpu import huge_pages, xla_options

    load_before = os.getloadavg()
    results = []
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            spec = common.run_side("benchmarks.train:prepare",
                                   {"case": case, "sets": args.set, "folder": tmp},
                                   env={"JAX_PLATFORMS": "cpu"})
            results.append({**measure(case, Path(tmp), args), "recipe": spec})
        for dtype in args.dtype:
            print(f"{case} {dtype}: median ratio (transformers / vit) "
                  f"{results[-1][dtype]['median_ratio']:.2f}", flush=True)
        if "vit_bfloat16_speedup_median" in results[-1]:
            print(f"{case}: ours, float32 step / bfloat16 step "
                  f"{results[-1]['vit_bfloat16_speedup_median']:.2f}", flush=True)
    variants = args.plain_malloc or args.jax_defaults
    path = common.write_record("train_variants" if variants else "train", {
        "setup": "training step, vit train's against transformers', CPU, "
                 f"{' and '.join(args.dtype)}",
        "recipe": f"{os.path.relpath(train_step.RECIPE, common.ROOT)} with "
                  f"{' '.join(train_step.ADAMW)} model.dtype=<dtype> {' '.join(args.set)}".strip(),
        "dtypes": args.dtype,
        "peer": "transformers ViTForImageClassification (default attention) from our initial "
                "weights (cast with .to(torch.bfloat16) for bfloat16), torch.optim.AdamW, "
                "clip_grad_norm_, threads = cores",
        "environment": {
            "vit": environment("vit").get("GLIBC_TUNABLES", "(none)"),
            "transformers": os.environ.get("GLIBC_TUNABLES", "(none)"),
            "transparent_hugepage": (huge_pages.THP_MODE.read_text().strip()
                                     if huge_pages.THP_MODE.exists() else "(none)")},
        "xla_cpu_options": {"float32": xla_options.training_options("float32"),
                            "other dtypes": xla_options.training_options("bfloat16")},
        "rounds": args.rounds, "timed_steps_per_run": args.steps, "warmup_steps": args.warmup,
        "interleaved": args.interleave,
        "untimed_steps_per_run": args.rewarm if args.interleave else 0,
        "load_average_before": [round(x, 2) for x in load_before],
        "cases": results,
        "note": args.note,
    }, argv=argv, mode="train", out=args.out)
    print(f"-> {path}")
