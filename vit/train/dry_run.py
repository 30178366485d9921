"""`vit train --dry-run`: a recipe's real model and training step at its real size, compiled
for the devices at hand, without training and without writing anything.

It answers before a long run starts: how many parameters, how many FLOPs a step costs, how much
memory XLA plans per device, whether that fits here, and (where it fits) how long one step
takes. The step is the one `vit train` runs (`make_train_step` with the recipe's optimiser,
accumulation, dtype and mesh), lowered on a batch the recipe's own pipeline makes. Where the
recipe's dataset is not on this machine, the batch is random images of the recipe's size, and
the class count is `ASSUMED_CLASSES` (the head is a small part of any model this is asked
about); the printout says so. A staged recipe is dry-run stage by stage.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from vit import device_mesh
from vit.data import open_source, train_iterator
from vit.data.sources import ArraySource
from vit.errors import DataError
from vit.inference import memory
from vit.train import parallel
from vit.train.from_recipe import augment_of
from vit.train.loop import prompt_tokenizer
from vit.train.losses import DEFAULT as DEFAULT_LOSS
from vit.train.losses import get_loss
from vit.train.model import build_model
from vit.train.optim import make_optimizer
from vit.train.placement import Placement
from vit.train.state import new_state
from vit.train.step import make_train_step

ASSUMED_CLASSES = 1000


def dry_run(config, *, init: str | None = None, measure: bool = True,
            out=None) -> list[dict[str, Any]]:
    """Dry-runs `config` (each stage of a staged recipe); prints a summary with `out`; returns
    one dict of figures per stage."""
    out = out or (lambda line: print(line, flush=True))
    if "stages" in config:
        from vit.train.stages import stage_configs

        results = []
        for name, stage in stage_configs(config):
            out(f"stage {name}:")
            results.append({"stage": name, **_dry_run(stage, init=init, measure=measure,
                                                      out=out)})
        return results
    return [_dry_run(config, init=init, measure=measure, out=out)]


def _batch_source(config, out) -> tuple[Any, str]:
    """(a source the recipe's pipeline can batch, where its images come from)."""
    data = config.data
    try:
        return open_source(data.name, data.train_split, data_dir=data.data_dir,
                           labels=data.get("labels")), data.name
    except DataError as err:
        size = config.input.image_size
        out(f"note: {err}; the step is compiled on random {size}x{size} images and "
            f"{ASSUMED_CLASSES} classes instead")
        images = np.random.default_rng(0).integers(0, 256, (8, size, size, 3), np.uint8)
        labels = np.arange(8) % ASSUMED_CLASSES
        return _RandomSource(images, labels, [str(i) for i in range(ASSUMED_CLASSES)],
                             "random"), "random images"


class _RandomSource(ArraySource):
    """Random images, each with a prompt and an answer too, for a recipe whose loss reads
    them; the other losses leave those fields behind."""

    def __getitem__(self, i: int) -> dict:
        return {**super().__getitem__(i), "prompt": "is there a red triangle?", "answer": 0}


def _dry_run(config, *, init: str | None, measure: bool, out) -> dict[str, Any]:
    tc = config.train
    mesh = parallel.mesh_from_config(config)
    loss_name = tc.get("loss", DEFAULT_LOSS)
    source, origin = _batch_source(config, out)
    num_classes = len(source.class_names)
    model, params = build_model(config, num_classes, init=init or config.init or None)
    mc = model.config
    tx, _ = make_optimizer(config.optim, params, mc.depth, tc.steps)
    place = Placement.of(mesh, params, tx, parallel.rules_from_config(config))
    step_fn = make_train_step(model.graphdef, tx, place, accum_steps=tc.accum_steps,
                              compute_dtype=mc.dtype, ema_decay=tc.ema_decay,
                              loss_fn=get_loss(loss_name))
    host_batch = device_mesh.host_batch_size(tc.batch_size, mesh)
    iterator = train_iterator(source, model.preprocessing, augment_of(config),
                              batch_size=host_batch, seed=config.seed, num_classes=num_classes,
                              num_threads=0, tokenize=prompt_tokenizer(mc, loss_name))
    batch = device_mesh.to_global(next(iterator), mesh)
    state = new_state(params, tx, place, ema=tc.ema_decay > 0)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    devices = mesh.devices.size
    kind = mesh.devices.flat[0].device_kind
    out(f"model: {config.model.name} as configured: {mc.width} wide, {mc.depth} deep, "
        f"{memory.tokens(mc)} tokens of {mc.image_size[0]}x{mc.image_size[1]} images, "
        f"{mc.dtype} compute; {n_params:,} parameters ({num_classes} classes)")
    out(f"step: batch {tc.batch_size} in {tc.accum_steps} micro-batch"
        f"{'es' if tc.accum_steps > 1 else ''} of {tc.batch_size // tc.accum_steps}, "
        f"{config.optim.name}, on {devices} {kind} device{'s' if devices > 1 else ''} "
        f"(data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']}); batch from {origin}")

    args = (state.params, state.opt_state, state.ema, batch, config.seed, 0)
    start = time.perf_counter()
    compiled = step_fn.lower(*args).compile()
    result: dict[str, Any] = {"parameters": n_params, "devices": devices,
                              "compile_s": time.perf_counter() - start}
    out(f"compiled in {result['compile_s']:.1f} s")

    flops = _flops(model.graphdef, tx, place, config, mc.dtype, loss_name, args)
    result["flops_per_step"] = flops
    out(f"FLOPs per step: {flops:.3e} ({flops / tc.batch_size:.3e} per image), XLA's count")

    mem = compiled.memory_analysis()
    planned = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
               + mem.temp_size_in_bytes + mem.generated_code_size_in_bytes)
    result.update(memory_bytes_per_device=planned, temp_bytes=mem.temp_size_in_bytes,
                  argument_bytes=mem.argument_size_in_bytes)
    there = memory.available_bytes()
    # Devices of one host share its memory on a CPU; an accelerator's figure is its own.
    need = planned * (devices if mesh.devices.flat[0].platform == "cpu" else 1)
    fits = there is None or need <= there[0]
    result["fits"] = fits
    room = (f"; {there[1]} has {_gb(there[0])} free: {'fits' if fits else 'does NOT fit'}"
            if there else "")
    out(f"memory per device (XLA's plan): {_gb(planned)} = arguments "
        f"{_gb(mem.argument_size_in_bytes)} + outputs {_gb(mem.output_size_in_bytes)} - "
        f"reused {_gb(mem.alias_size_in_bytes)} + temporaries {_gb(mem.temp_size_in_bytes)} "
        f"+ code {_gb(mem.generated_code_size_in_bytes)}{room}")

    rate = _matmul_rate(mc.dtype, mesh.devices.flat[0]) * devices
    at_least = flops / rate
    result["matmul_flops_per_s"] = rate
    if measure and fits and at_least > MEASURE_LIMIT_S:
        out(f"one step: not run: at least {_duration(at_least)} here ({flops:.2e} FLOPs at "
            f"the devices' best {mc.dtype} matrix-product rate, {rate / 1e9:,.0f} GFLOP/s); "
            f"{tc.steps} steps: at least {_duration(at_least * tc.steps)}")
    elif measure and fits:
        seconds, first = _timed_step(compiled, args)
        result["step_s"] = seconds
        warm = "" if seconds == first else f" after a first step of {first:.3f} s"
        out(f"one step: {seconds:.3f} s{warm} ({tc.batch_size / seconds:,.1f} images/s; "
            f"{tc.steps} steps would take about {_duration(seconds * tc.steps)})")
    elif not fits:
        out("one step: not run (it does not fit); lower train.batch_size or raise "
            "train.accum_steps, or set model.remat=true")
    return result


def _flops(graphdef, tx, place, config, dtype: str, loss_name: str, args) -> float:
    """XLA's count of one step's FLOPs over all devices. The step's accumulation loop would be
    counted once, not once per micro-batch, so the count is of the same step with the batch
    taken whole: the same arithmetic, only traced (never compiled or run)."""
    whole = make_train_step(graphdef, tx, place, accum_steps=1, micro_tokens=None,
                            compute_dtype=dtype, ema_decay=config.train.ema_decay,
                            loss_fn=get_loss(loss_name))
    cost = whole.lower(*args).cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get("flops", float("nan")))


# A step that would take longer than this (at the best matrix-product rate) is not run: a
# full-size B/16 step on a CPU takes most of an hour, and the estimate already says so.
MEASURE_LIMIT_S = 120.0


def _matmul_rate(dtype: str, device) -> float:
    """FLOP/s of a 1024x1024 matrix product in `dtype` on `device`, the best of three: what no
    step can beat, so `flops / rate` is a lower bound of the step's time."""
    import jax.numpy as jnp

    n = 1024
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    product = jax.jit(lambda x: x @ x)
    jax.block_until_ready(product(a))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(product(a))
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# A step this short is timed again: its first run also pays for first-touch allocations.
RETIME_BELOW_S = 10.0


def _timed_step(compiled, args) -> tuple[float, float]:
    """(the step's time, the first run's time): a second run where the first was short. The
    step donates its state, so the second run takes the first's outputs."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        outputs = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
        if times[0] >= RETIME_BELOW_S:
            break
        args = (*outputs[:3], *args[3:])
    return times[-1], times[0]


def _gb(size: float) -> str:
    return f"{size / 1e9:,.2f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

