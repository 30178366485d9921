"""Training-step speed on the CPU: `vit train`'s jitted step against transformers' ViT doing the
same update from the same weights, each side in its own process."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common, peers, tables

RECIPE = common.ROOT / "configs" / "imagefolder.py"
# AdamW at its full rate from the first step, so a peer's optimiser runs the same updates.
ADAMW = ("optim.name=adamw", "optim.lr=0.0001", "optim.weight_decay=0.05",
         "optim.warmup_steps=0", "optim.schedule=constant")
CASES = ("B/16:8", "S/16:32")
CLASSES = 1000
# What transformers' side mirrors (the values it can run, the first the default).
MIRRORED = {"optim.name": ("adamw",), "optim.layer_decay": (1.0, 0.0, None),
            "optim.trainable": (".*",), "optim.lr_mults": (None, []), "optim.no_decay": (None, ""),
            "model.dropout": (0.0,), "model.attention_dropout": (0.0,),
            "model.drop_path": (0.0,), "train.accum_steps": (1,), "train.ema_decay": (0.0,),
            "input.mixup": (0.0,), "input.cutmix": (0.0,)}


def recipe(case: str, dtype: str = "float32"):
    from vit.recipes.load import load_config
    from vit.recipes.model_fields import model_field_types

    model, batch = case.split(":")
    return load_config(RECIPE, [*ADAMW, f"model.dtype={dtype}", f"model.name={model}",
                                f"train.batch_size={batch}"], model_field_types=model_field_types)


def prepare(case: str, folder: str) -> dict:
    """The Hugging Face folder of our initial weights, the batch, and what transformers' worker
    needs of the recipe (its spec), once the recipe is one that worker mirrors."""
    from vit.checkpoints import LoadedCheckpoint, save_checkpoint
    from vit.checkpoints.tree import flatten, nest
    from vit.training.model import build_model

    folder, config = Path(folder), recipe(case)
    for key, allowed in MIRRORED.items():
        section, name = key.split(".")
        if (have := config[section].get(name, allowed[0])) not in allowed:
            raise SystemExit(f"{key}={have!r}: transformers' side here runs {key}="
                             f"{allowed[0]!r} only; leave it at that for this benchmark")
    o, size = config.optim, config.input.image_size
    spec = {"lr": o.lr, "b1": o.b1, "b2": o.b2, "weight_decay": o.weight_decay,
            "clip_norm": o.clip_norm, "label_smoothing": config.input.label_smoothing,
            "batch": config.train.batch_size, "image_size": size}
    # The weights `vit_step`'s program starts from (`build_program` builds the same model).
    model, params = build_model(config, CLASSES, init=config.get("init") or None)
    params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
    save_checkpoint(LoadedCheckpoint(model.config, params, model.preprocessing), folder / "hf",
                    "hf")
    rng = np.random.default_rng(0)
    np.savez(folder / "batch.npz", labels=rng.integers(0, CLASSES, spec["batch"]),
             images=rng.normal(size=(spec["batch"], size, size, 3)).astype(np.float32))
    (folder / "spec.json").write_text(json.dumps(spec))
    return spec


def vit_step(case: str, folder: Path, dtype: str = "float32"):
    """Our side: one step of `vit train`'s own program (`build_program`), waited for: its loss."""
    import jax

    from vit.training.program import build_program

    config = recipe(case, dtype)
    step = build_program(config, CLASSES, init=config.get("init") or None)
    data = np.load(folder / "batch.npz")
    batch = step.put(step.batch(data["images"], data["labels"]))

    def run() -> float:
        metrics = jax.block_until_ready(step(batch))
        assert bool(metrics["finite"]), "the weights became non-finite"
        return float(metrics["loss"])

    return run


def transformers_step(folder: Path, dtype: str = "float32"):
    """transformers' side: one step with the finiteness check; returns the loss."""
    import torch

    spec = json.loads((folder / "spec.json").read_text())
    model = peers.load(folder / "hf", dtype, train=True)
    params = dict(model.named_parameters())
    opt = peers.adamw(model, lr=spec["lr"], b1=spec["b1"], b2=spec["b2"],
                      weight_decay=spec["weight_decay"])
    data = np.load(folder / "batch.npz")
    images = peers.pixels(data["images"], model.dtype)
    labels = torch.from_numpy(data["labels"])

    def step() -> float:
        _, loss = peers.update(model, opt, images, labels,
                               label_smoothing=spec["label_smoothing"], clip=spec["clip_norm"])
        with torch.no_grad():
            finite = torch.stack([p.isfinite().all() for p in params.values()]).all().item()
        assert finite, "the weights became non-finite"
        return loss.item()

    return step


def timed(step, count: int) -> tuple[list[float], list[float]]:
    """`count` steps: (their times, their losses)."""
    times, losses = [], []
    for _ in range(count):
        start = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - start)
    return times, losses


def serve(kind: str, case: str, dtype: str, folder: str, steps: int, warmup: int, rewarm: int):
    """A contestant's process (`common.Side`): `warmup` untimed steps once, then per run
    `rewarm` untimed steps and `steps` timed ones."""
    step = (transformers_step(Path(folder), dtype) if kind == "transformers"
            else vit_step(case, Path(folder), dtype))
    seen = timed(step, warmup)[1]  # every loss so far

    def run() -> dict:
        untimed, early = timed(step, rewarm)
        times, losses = timed(step, steps)
        seen.extend(early + losses)
        return {"times": times, "rewarm_times": untimed, "loss_first": seen[0],
                "loss_last": losses[-1]}

    return run


def environment(kind: str) -> dict:
    """Ours as the `vit` command sets it (huge pages); transformers' as it is."""
    from vit.cpu import huge_pages

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return huge_pages.environment(env) if kind == "vit" else env


def contestant(kind: str, dtype: str, case: str, folder: Path, args, kept: bool):
    """A contestant's process, warmed up; one `kept` for many runs settles and rewarms first."""
    return common.Side("benchmarks.train:serve", {
        "kind": kind, "case": case, "dtype": dtype, "folder": str(folder),
        "steps": args.steps, "warmup": args.warmup, "rewarm": 1 if kept else 0},
        env=environment(kind), settle_s=0.5 if kept else 0.0)


def measure(case: str, folder: Path, args) -> dict:
    """Every (library, dtype) once per round, the order reversed every other round."""
    contestants = [(kind, dtype) for dtype in args.dtype for kind in ("vit", "transformers")]
    runs = {c: [] for c in contestants}
    kept = ({c: contestant(*c, case, folder, args, True) for c in contestants}
            if args.interleave else {})
    for r in range(args.rounds):
        for kind, dtype in contestants if r % 2 == 0 else contestants[::-1]:
            side = kept.get((kind, dtype)) or contestant(kind, dtype, case, folder, args, False)
            out = side()
            if not kept:
                side.close()
            runs[kind, dtype].append({**out, "median_step_s": statistics.median(out["times"])})
    for side in kept.values():
        side.close()
    result = {"case": case, "model": case.split(":")[0], "batch": int(case.split(":")[1])}
    for dtype in args.dtype:
        vit, tf = runs["vit", dtype], runs["transformers", dtype]

        def each(key, vit=vit, tf=tf):
            return {"vit": [x[key] for x in vit], "transformers": [x[key] for x in tf]}

        ratios = [t["median_step_s"] / v["median_step_s"] for v, t in zip(vit, tf, strict=True)]
        result[dtype] = {
            "median_step_s": each("median_step_s"), "step_times_s": each("times"),
            "untimed_step_times_s": each("rewarm_times"),
            "ratio_transformers_over_vit": ratios, "median_ratio": statistics.median(ratios),
            "loss_first": {"vit": vit[0]["loss_first"], "transformers": tf[0]["loss_first"]},
            "loss_last": {"vit": vit[0]["loss_last"], "transformers": tf[0]["loss_last"]},
            "loss_last_relative_difference": abs(vit[0]["loss_last"] / tf[0]["loss_last"] - 1)}
    if "float32" in args.dtype and "bfloat16" in args.dtype:
        ours = [f["median_step_s"] / b["median_step_s"] for f, b in
                zip(runs["vit", "float32"], runs["vit", "bfloat16"], strict=True)]
        result["vit_float32_over_bfloat16"] = ours
        result["vit_bfloat16_speedup_median"] = statistics.median(ours)
    return result


def main(argv: list[str]) -> None:
    args = common.parser(
        "train", __doc__, case=([], f"MODEL:BATCH (default: {' '.join(CASES)})"), rounds=3,
        steps=(3, "timed steps per run"), warmup=(1, "untimed steps per run"),
        interleave=(False, "keep every contestant's process alive between rounds"),
    ).parse_args(argv)
    # Without bfloat16 arithmetic torch's bfloat16 is emulated: float32 alone is timed.
    args.dtype = ["float32", "bfloat16"] if common.cpu().get("bfloat16_arithmetic") else ["float32"]
    from vit.cpu import huge_pages

    load_before = os.getloadavg()
    results = []
    for case in args.case or CASES:
        with tempfile.TemporaryDirectory() as tmp:
            spec = common.run_side("benchmarks.train:prepare", {"case": case, "folder": tmp},
                                   env={"JAX_PLATFORMS": "cpu"})
            results.append({**measure(case, Path(tmp), args), "recipe": spec})
    common.write_record("train", {
        "recipe": f"{RECIPE} with {' '.join(ADAMW)} model.dtype=<dtype>", "dtypes": args.dtype,
        "environment": {
            "vit": environment("vit").get("GLIBC_TUNABLES", "(none)"),
            "transformers": os.environ.get("GLIBC_TUNABLES", "(none)"),
            "transparent_hugepage": (huge_pages.THP_MODE.read_text().strip()
                                     if huge_pages.THP_MODE.exists() else "(none)")},
        "rounds": args.rounds, "timed_steps_per_run": args.steps, "warmup_steps": args.warmup,
        "interleaved": args.interleave, "untimed_steps_per_run": 1 if args.interleave else 0,
        "load_average_before": [round(x, 2) for x in load_before], "cases": results},
        argv=argv, mode="train", out=args.out)


def table(r: dict) -> list[str]:
    num, med, env = tables.num, statistics.median, r["environment"]
    rows, ours = [], []
    for c in r["cases"]:
        for dtype in r["dtypes"]:
            d = c[dtype]
            rows.append([f"ViT-{c['model']}", c["batch"], dtype,
                         *(num(med(d["median_step_s"][k])) for k in ("vit", "transformers")),
                         " / ".join(num(x) for x in d["ratio_transformers_over_vit"]),
                         num(d["median_ratio"]), f"{d['loss_last_relative_difference']:.1e}"])
        if "vit_bfloat16_speedup_median" in c:
            ours.append(f"ViT-{c['model']} batch {c['batch']}: our bfloat16 step is "
                        f"{num(c['vit_bfloat16_speedup_median'])}x our float32 step.")
    how = f"median of each run's {r['timed_steps_per_run']} timed steps, {r['rounds']} rounds"
    if r["interleaved"]:
        how += ", both processes alive throughout, their runs alternating"
    if r["untimed_steps_per_run"]:
        how += (f", each run after {r['untimed_steps_per_run']} untimed step(s) (memory the VM "
                "took back while the process waited)")
    return [f"`vit train`'s step against transformers' (CPU), seconds a step, {how}:", "",
            *tables.table(["model", "batch", "dtype", "vit", "transformers",
                           "speed vs transformers, by round", "median",
                           "loss difference after the last step (relative)"], rows),
            "", *ours, f"Environment: ours `GLIBC_TUNABLES={env['vit']}` (as the `vit` command "
            f"sets it), transformers' `{env['transformers']}`; transparent huge pages "
            f"`{env['transparent_hugepage']}`."]


def targets(r: dict) -> list[tuple[str, str, bool]]:
    out = []
    for c in r["cases"]:
        ratio = c["float32"]["median_ratio"]  # float32 is timed on every host
        out.append((f"ViT-{c['model']} batch {c['batch']}: the float32 step at least 1.10x "
                    "transformers'", f"{ratio:.2f}x", ratio >= 1.1))
        if "vit_bfloat16_speedup_median" in c:
            gain = c["vit_bfloat16_speedup_median"]
            out.append((f"ViT-{c['model']} batch {c['batch']}: the bfloat16 step at least 1.30x "
                        "our float32 step", f"{gain:.2f}x", gain >= 1.3))
    return out
