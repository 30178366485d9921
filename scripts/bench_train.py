"""Training-step speed: the step `vit train` runs against transformers' PyTorch ViT doing the
same step, on the CPU, in float32 and in bfloat16.

Ours is `vit train`'s own jitted step (scripts/train_step.py builds it from the recipe with the
package's functions, as vit/train/loop.py does): `make_train_step` with the optimiser
`make_optimizer` builds (global-norm clipping, then AdamW with weight decay on the weight
matrices), the recipe's loss with its label smoothing, the accuracy metric and the check that
the weights stayed finite. Theirs: `ViTForImageClassification` loaded from a Hugging Face folder
that our writer made of the same initial weights, `torch.optim.AdamW` with the same rate, betas
and decay mask, `clip_grad_norm_` at the same norm, cross-entropy with the same smoothing,
accuracy and the same finiteness check. Both get the same batch (NHWC for us, NCHW for torch).

Every measurement runs in its own process, ours and theirs alternating (the order flips every
round), so neither warms the other's caches or competes for cores; torch uses a thread per
core. Ours runs in the environment the `vit` command gives itself (GLIBC_TUNABLES asking for
huge pages, vit/host_allocator.py), transformers' in the caller's; the record names both.
`--interleave` keeps every process alive instead (compiled and warmed up once) and asks each
for a run in turn, the order flipping every round: rounds cost only their steps and the two
sides of a round run seconds apart, so the host's drift between minutes leaves the ratios.
Each such run starts with `--rewarm` untimed steps (default 1), on both sides: on a virtual
machine that hands a guest's free memory back to its host (free page reporting, as the
Firecracker VMs these records come from do), memory a process freed a second or more ago is
gone, and the first step after the other side's run faults it all in again. Our step frees its
scratch memory (1.4 GiB for ViT-B/16 batch 8) at its end and takes it again at the next start,
so that first step paid ~2 s more (6.2 s against 3.9); transformers' hardly anything. `vit
train` runs its steps back to back and does not pay it; the record keeps those steps' times.
`--plain-malloc` times ours a second time in the caller's environment, to show what that gains;
`--jax-defaults` times ours once more compiled with jax's default XLA:CPU options
(`VIT_XLA_DOTS=0`: YNNPACK's dots instead of XLA's, vit/inference/xla_cpu.py), likewise;
`--mkl-products` times ours once more with every float32 layer product through MKL, the BLAS
torch's CPU build uses (an experiment, scripts/native_gemm.py: what torch's product speed would
give our step; needs `pip install mkl` and a C++ compiler).
Per case: each run's median step time, each round's ratio (transformers' time / ours: above 1
means ours is faster) and their median, each process's peak memory, and each side's loss at its
first and last step: from the same weights and batch the first agrees when the two steps
compute the same thing. The recipe is configs/imagefolder.py with AdamW (train_step.ADAMW);
`--set` changes it further, as it would `vit train`'s.

bfloat16 compares like with like: our mixed-precision step (float32 master weights, bfloat16
matrix products with float32 accumulation) against transformers' model cast with
`.to(torch.bfloat16)`; each round also gives our float32 step over our bfloat16 step. The
record names the CPU and its bfloat16 features (records.py): on a CPU without bfloat16
arithmetic the bfloat16 figures are recorded but say nothing about one that has it.

    python scripts/bench_train.py [--case B/16:8 --case S/16:32] [--dtype float32
        --dtype bfloat16] [--rounds 3] [--steps 3] [--warmup 1] [--set KEY=VALUE ...]
        [--plain-malloc] [--jax-defaults] [--mkl-products] [--interleave] [--note TEXT]
        [--out benchmarks/bench_train.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import memory
import records
import train_step

from vit import host_allocator
from vit.inference import xla_cpu

CASES = ("B/16:8", "S/16:32")
# Ours once more, changed one way (what each change gains, measured in the same run):
# {contestant: (record key, --flag)}. PLAIN: in the caller's environment, without the huge-page
# tunable; DEFAULTS: with jax's default XLA:CPU compile options; MKL: the layer products
# through MKL (scripts/native_gemm.py).
PLAIN, DEFAULTS, MKL = "vit_plain_malloc", "vit_jax_defaults", "vit_mkl_products"
VARIANTS = {PLAIN: ("plain_malloc", "plain_malloc"), DEFAULTS: ("jax_defaults", "jax_defaults"),
            MKL: ("mkl_products", "mkl_products")}
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


def prepare(case: str, sets: list[str], folder: Path) -> None:
    """The Hugging Face folder of our initial weights, the batch, and transformers' spec."""
    import numpy as np

    from vit.checkpoints import save_checkpoint

    config = recipe(case, sets)
    spec = spec_of(config)
    save_checkpoint(train_step.initial_weights(config, CLASSES), folder / "hf", "hf")
    rng = np.random.default_rng(0)
    size = spec["image_size"]
    np.savez(folder / "batch.npz", labels=rng.integers(0, CLASSES, spec["batch"]),
             images=rng.normal(size=(spec["batch"], size, size, 3)).astype(np.float32))
    (folder / "spec.json").write_text(json.dumps(spec))


def vit_step(case: str, sets: list[str], folder: Path, dtype: str = "float32",
             mkl: bool = False):
    """Our side of one step, as a function: `vit train`'s jitted step, waited for; returns the
    loss. `mkl`: its float32 layer products through MKL (scripts/native_gemm.py)."""
    import jax
    import numpy as np

    if mkl:
        import native_gemm

        native_gemm.install()

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


def worker(step, steps: int, warmup: int) -> dict:
    """One run: `warmup` untimed steps (the compile), then `steps` timed ones."""
    _, first = timed(step, warmup)
    times, losses = timed(step, steps)
    losses = first + losses
    return {"times": times, "loss_first": losses[0], "loss_last": losses[-1], **memory.probe()}


def serve(step, steps: int, warmup: int, rewarm: int = 0) -> None:
    """`--interleave`'s worker: the warm-up, then for every line read from stdin `rewarm`
    untimed steps and `steps` timed ones, each run's result as one JSON line, until stdin
    closes."""
    _, losses = timed(step, warmup)
    first = losses[0] if losses else None
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        untimed, early = timed(step, rewarm)
        times, losses = timed(step, steps)
        first = (early + losses)[0] if first is None else first
        print(json.dumps({"times": times, "rewarm_times": untimed, "loss_first": first,
                          "loss_last": losses[-1], **memory.probe()}), flush=True)


def worker_command(kind: str, case: str, dtype: str, folder: Path, args) -> tuple[list, dict]:
    """The command line and environment of one contestant's worker process."""
    worker = "vit" if kind in VARIANTS else kind
    cmd = [sys.executable, __file__, "--worker", worker, "--case", case, "--folder", str(folder),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--dtype", dtype,
           *(f"--set={s}" for s in args.set),
           *(["--interleave", "--rewarm", str(args.rewarm)] if args.interleave else []),
           *(["--mkl"] if kind == MKL else [])]
    # Ours runs in the environment the `vit` command gives itself (huge pages for XLA's
    # scratch memory, vit/host_allocator.py); transformers' in the environment as it is.
    env = {**(host_allocator.environment() if kind in ("vit", DEFAULTS, MKL) else os.environ),
           "JAX_PLATFORMS": "cpu"}
    if kind == DEFAULTS:
        env[xla_cpu.OPT_OUT] = "0"
    return cmd, env


def run_worker(kind: str, case: str, dtype: str, folder: Path, args) -> dict:
    cmd, env = worker_command(kind, case, dtype, folder, args)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{kind} worker for {case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Server:
    """`--interleave`: one contestant's worker kept alive between rounds (compiled and warmed
    up once), asked for a run at a time."""

    # Between runs, time for the other process's idle threads to stop spinning.
    SETTLE_S = 0.5

    def __init__(self, kind: str, case: str, dtype: str, folder: Path, args):
        cmd, env = worker_command(kind, case, dtype, folder, args)
        self.name = f"{kind} worker for {case}"
        # stderr to a file: a pipe nobody reads while the worker runs could fill and block it.
        self.log = folder / f"{kind}-{dtype}.stderr"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        self._read()  # ready

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise SystemExit(f"{self.name} failed:\n{self.log.read_text()[-3000:]}")
        return json.loads(line)

    def __call__(self) -> dict:
        time.sleep(self.SETTLE_S)
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def measure(case: str, folder: Path, args) -> dict:
    """Every (library, dtype) once per round, the order reversed every other round."""
    contestants = [(kind, dtype) for dtype in args.dtype for kind in ("vit", "transformers")]
    variants = [kind for kind, (_, flag) in VARIANTS.items() if getattr(args, flag)]
    contestants += [(kind, dtype) for kind in variants for dtype in args.dtype]
    runs = {c: [] for c in contestants}
    # --interleave: every contestant's process started (and compiled) once, all alive at once.
    servers = ({c: Server(c[0], case, c[1], folder, args) for c in contestants}
               if args.interleave else {})
    for r in range(args.rounds):
        for kind, dtype in contestants if r % 2 == 0 else contestants[::-1]:
            out = (servers[kind, dtype]() if servers
                   else run_worker(kind, case, dtype, folder, args))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--mkl-products", action="store_true",
                        help="also time ours with its float32 layer products through MKL "
                             "(scripts/native_gemm.py; `pip install mkl`), in the same run")
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
    parser.add_argument("--out", default=records.default_out("bench_train"))
    parser.add_argument("--worker", choices=("prepare", "vit", "transformers"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mkl", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mkl_products and not args.worker:
        import native_gemm

        try:  # before any run: MKL's runtime is there to load
            native_gemm.mkl_runtime()
        except SystemExit as missing:
            parser.error(str(missing))
    cases = args.case or list(CASES)
    if not args.dtype:
        # Without bfloat16 arithmetic torch's bfloat16 step is emulated and takes many times
        # the float32 one: asked for by name only there.
        bf16 = records.cpu().get("bfloat16_arithmetic")
        args.dtype = ["float32", "bfloat16"] if bf16 or args.worker else ["float32"]
        if not args.worker and args.dtype == ["float32"]:
            print("this CPU has no bfloat16 arithmetic: float32 only (--dtype bfloat16 to time "
                  "it anyway)", flush=True)
    if args.worker == "prepare":
        prepare(cases[0], args.set, args.folder)
        return
    if args.worker:
        step = (vit_step(cases[0], args.set, args.folder, args.dtype[0], args.mkl)
                if args.worker == "vit"
                else transformers_step(args.folder, args.dtype[0]))
        if args.interleave:
            serve(step, args.steps, args.warmup, args.rewarm)
        else:
            print(json.dumps(worker(step, args.steps, args.warmup)))
        return

    load_before = os.getloadavg()
    results = []
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, __file__, "--worker", "prepare", "--case", case,
                   "--folder", tmp, *(f"--set={s}" for s in args.set)]
            proc = subprocess.run(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"preparing {case} failed:\n{proc.stderr[-3000:]}")
            spec = json.loads((Path(tmp) / "spec.json").read_text())
            results.append({**measure(case, Path(tmp), args), "recipe": spec})
        for dtype in args.dtype:
            print(f"{case} {dtype}: median ratio (transformers / vit) "
                  f"{results[-1][dtype]['median_ratio']:.2f}", flush=True)
        if "vit_bfloat16_speedup_median" in results[-1]:
            print(f"{case}: ours, float32 step / bfloat16 step "
                  f"{results[-1]['vit_bfloat16_speedup_median']:.2f}", flush=True)
    records.write(args.out, {
        "benchmark": "training step, vit train's against transformers', CPU, "
                     f"{' and '.join(args.dtype)}",
        "recipe": f"{os.path.relpath(train_step.RECIPE, records.ROOT)} with "
                  f"{' '.join(train_step.ADAMW)} model.dtype=<dtype> {' '.join(args.set)}".strip(),
        "dtypes": args.dtype,
        "peer": "transformers ViTForImageClassification (default attention) from our initial "
                "weights (cast with .to(torch.bfloat16) for bfloat16), torch.optim.AdamW, "
                "clip_grad_norm_, threads = cores",
        "environment": {
            "vit": host_allocator.environment().get("GLIBC_TUNABLES", "(none)"),
            "transformers": os.environ.get("GLIBC_TUNABLES", "(none)"),
            "transparent_hugepage": (host_allocator.THP_MODE.read_text().strip()
                                     if host_allocator.THP_MODE.exists() else "(none)")},
        "xla_cpu_options": {"float32": xla_cpu.training_options("float32"),
                            "other dtypes": xla_cpu.training_options("bfloat16")},
        "rounds": args.rounds, "timed_steps_per_run": args.steps, "warmup_steps": args.warmup,
        "interleaved": args.interleave,
        "untimed_steps_per_run": args.rewarm if args.interleave else 0,
        "load_average_before": [round(x, 2) for x in load_before],
        "cases": results,
        "note": args.note,
    }, extra_packages=("torch", "transformers", *(["mkl"] if args.mkl_products else [])))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
