"""`vit train --dry-run`: a recipe's real model and training step at its real size, compiled
for the devices at hand, without training and without writing anything.

It answers before a long run starts: how many parameters, how many FLOPs a step costs, how much
memory XLA plans per device, whether that fits here, and (where it fits) how long one step
takes. The step is the one `vit train` runs (`vit.training.program.build_program`: the
recipe's optimiser, micro-batches, dtype and mesh), compiled for a batch the recipe's own
pipeline makes. Where the recipe's dataset is not on this machine, the batch is random images
of the recipe's size, and the class count is `ASSUMED_CLASSES` (the head is a small part of any
model this is asked about); the printout says so. A staged recipe is dry-run stage by stage.

Where the step runs, the dry run also estimates the whole run (`estimate_run`): start-up and
compile as measured here, the steps at the median of several timed ones (their spread gives
the range), the validations at their count (a forward pass estimated at a third of a training
step's time per image), and the checkpoints at one save timed into a temporary folder (removed
again; the saves before the last are written while the steps run, so only the last is waited
for). It says how sure it is: the range from the steps' spread, and a busy host.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from typing import Any

import jax
import numpy as np

from vit import device_mesh
from vit.data import open_source, train_iterator
from vit.data.sources import ArraySource
from vit.errors import DataError
from vit.inference import memory
from vit.training.from_recipe import augment_of, resolved_dtype
from vit.training.program import TrainProgram, build_program
from vit.training.timings import process_age_s

ASSUMED_CLASSES = 1000


def dry_run(config, *, init: str | None = None, measure: bool = True,
            out=None) -> list[dict[str, Any]]:
    """Dry-runs `config` (each stage of a staged recipe); prints a summary with `out`; returns
    one dict of figures per stage."""
    out = out or (lambda line: print(line, flush=True))
    before = process_age_s()  # the command's start-up so far: its imports, the recipe
    if "stages" in config:
        from vit.training.stages import stage_configs

        results = []
        for k, (name, stage) in enumerate(stage_configs(config)):
            out(f"stage {name}:")
            results.append({"stage": name, **_dry_run(stage, init=init, measure=measure,
                                                      out=out, before=before if k == 0 else 0)})
        return results
    return [_dry_run(config, init=init, measure=measure, out=out, before=before)]


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


def _dry_run(config, *, init: str | None, measure: bool, out, before: float = 0.0
             ) -> dict[str, Any]:
    began = time.perf_counter()
    tc = config.train
    source, origin = _batch_source(config, out)
    num_classes = len(source.class_names)
    program = build_program(config, num_classes, init=init)
    mesh, mc = program.mesh, program.model.config
    host_batch = device_mesh.host_batch_size(tc.batch_size, mesh)
    iterator = train_iterator(source, program.model.preprocessing, augment_of(config),
                              batch_size=host_batch, seed=config.seed, num_classes=num_classes,
                              num_threads=0, tokenize=program.tokenizer)
    batch = program.put(next(iterator))
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(program.state.params))
    devices = mesh.devices.size
    kind = mesh.devices.flat[0].device_kind
    out(f"model: {config.model.name} as configured: {mc.width} wide, {mc.depth} deep, "
        f"{memory.tokens(mc)} tokens of {mc.image_size[0]}x{mc.image_size[1]} images, "
        f"{mc.dtype} compute{' (auto)' if resolved_dtype(config)[1] else ''}; {n_params:,} "
        f"parameters ({num_classes} classes)")
    pieces = program.micro_batches // tc.accum_steps
    split = (f" (each in {pieces} pieces of {tc.batch_size // program.micro_batches} for the "
             f"CPU's cache: train.micro_tokens={tc.get('micro_tokens')})" if pieces > 1 else "")
    out(f"step: batch {tc.batch_size} in {tc.accum_steps} micro-batch"
        f"{'es' if tc.accum_steps > 1 else ''} of {tc.batch_size // tc.accum_steps}{split}, "
        f"{config.optim.name}, on {devices} {kind} device{'s' if devices > 1 else ''} "
        f"(data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']}); batch from {origin}")

    startup = before + time.perf_counter() - began
    compiled = program.compile(batch)
    result: dict[str, Any] = {"parameters": n_params, "devices": devices,
                              "startup_s": startup, "compile_s": program.compile_s}
    out(f"compiled in {result['compile_s']:.1f} s")

    flops = _flops(program, batch)
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
        times = _timed_steps(program, batch)
        seconds = statistics.median(times[1:] or times)
        result.update(step_s=seconds, step_times_s=times)
        timed = len(times) - 1 or 1
        warm = "" if len(times) == 1 else f" after a first step of {times[0]:.3f} s"
        out(f"one step: {seconds:.3f} s{warm} ({tc.batch_size / seconds:,.1f} images/s; the "
            f"median of {timed} timed step{'s' if timed > 1 else ''})")
        estimate = estimate_run(
            steps=tc.steps, step_times=times, startup_s=startup, compile_s=result["compile_s"],
            batch_size=tc.batch_size, evaluations=_evaluations(config, origin),
            saves=math.ceil(tc.steps / tc.checkpoint_every), save_s=_timed_save(program),
            load=_load())
        result["estimate"] = estimate
        out(describe_estimate(estimate))
    elif not fits:
        out("one step: not run (it does not fit); lower train.batch_size or raise "
            "train.accum_steps, or set model.remat=true")
    return result


def _flops(program: TrainProgram, batch: dict) -> float:
    """XLA's count of one step's FLOPs over all devices. The step's accumulation loop would be
    counted once, not once per micro-batch, so the count is of the same step with the batch
    taken whole: the same arithmetic, only traced (never compiled or run)."""
    whole = program.variant(accum_steps=1)
    cost = whole.step_fn.lower(*whole.args(batch)).cost_analysis()
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
# Steps timed after the first, for their median and spread, within a budget of seconds.
TIMED_STEPS, TIMING_BUDGET_S = 5, 10.0


def _timed_steps(program: TrainProgram, batch: dict) -> list[float]:
    """Each step's time, the first's included: the first alone where it is long, else up to
    `TIMED_STEPS` more within `TIMING_BUDGET_S`."""
    times: list[float] = []
    while True:
        start = time.perf_counter()
        jax.block_until_ready(program(batch))
        times.append(time.perf_counter() - start)
        if (times[0] >= RETIME_BELOW_S or len(times) > TIMED_STEPS
                or sum(times[1:]) >= TIMING_BUDGET_S):
            return times


def _evaluations(config, origin: str) -> tuple[int, int | None]:
    """(the validations a run of `config` makes, the images of each: None where the split is
    not on this machine; 0 without a validation split)."""
    tc, data = config.train, config.data
    if not data.val_split:
        return 0, 0
    count = math.ceil(tc.steps / tc.eval_every)  # every eval_every steps, and at the end
    if origin == "random images":
        return count, None
    try:
        return count, len(open_source(data.name, data.val_split, data_dir=data.data_dir,
                                      labels=data.get("labels")))
    except DataError:
        return count, None


def _timed_save(program: TrainProgram) -> float | None:
    """Seconds one checkpoint of the program's state takes to write and finish, saved into a
    temporary folder that is removed again; None where it cannot be (several processes, whose
    folders would differ, or a temporary folder that takes no checkpoint)."""
    if jax.process_count() > 1:
        return None
    from vit.checkpoints import orbax_format
    from vit.training.checkpointing import TrainCheckpoints

    state, model_config = program.state, program.model.config
    params, opt_state, ema = state.params, state.opt_state, state.ema
    try:
        with tempfile.TemporaryDirectory(prefix="vit-dry-run-") as folder:
            start = time.perf_counter()
            ckpts = TrainCheckpoints(folder)
            ckpts.save(1, params=params, opt_state=opt_state, ema_params=ema, data_iter={},
                       train_state={"step": 1}, val_accuracy=0.0,
                       meta=json.loads(json.dumps(orbax_format.make_meta(
                           model_config=model_config.to_dict(), preprocessing={}, labels=[],
                           step=1), default=list)))
            ckpts.close()
            return time.perf_counter() - start
    except Exception:  # noqa: BLE001 - the estimate then says the save was not measured
        return None


def _load() -> tuple[float, int] | None:
    """(the 1-minute load average, the CPUs this process may use) while the steps were timed;
    None where the OS does not say."""
    try:
        return os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# A forward pass costs about a third of a training step (the backward pass about two
# forwards): an evaluation's time per image, and its compile, are estimated from the step's.
FORWARD_SHARE = 1 / 3
# Load above this share of the usable CPUs at timing: the steps may run faster on an idle host.
BUSY_LOAD = 1.25


def estimate_run(*, steps: int, step_times: list[float], startup_s: float, compile_s: float,
                 batch_size: int, evaluations: tuple[int, int | None], saves: int,
                 save_s: float | None, load: tuple[float, int] | None = None) -> dict:
    """The whole run's time from the dry run's timings, in parts, with a range.

    `step_times` are timed steps, the first a warm-up (left out when there are others): the
    steps take `steps` x their median, within `steps` x their fastest and slowest. Each of the
    `evaluations` (count, images each; None: unknown) runs a forward pass per image at
    `FORWARD_SHARE` of a step's time per image, and the first compiles one at that share of
    `compile_s`. Of the `saves`, the last is waited for (`save_s`); the others are written
    while the steps run. Start-up and compile are taken as measured."""
    timed = step_times[1:] or step_times
    median = statistics.median(timed)
    low, high = min(timed), max(timed)
    count, images = evaluations
    per_image = median / batch_size * FORWARD_SHARE
    eval_s = (count * images * per_image + compile_s * FORWARD_SHARE
              if count and images is not None else 0.0)
    save = save_s if saves and save_s is not None else 0.0
    fixed = startup_s + compile_s + save
    scale = (low / median, high / median)
    parts = {"startup_s": startup_s, "compile_s": compile_s, "steps_s": steps * median,
             "evaluations_s": eval_s, "checkpoints_s": save}
    busy = load is not None and load[0] > BUSY_LOAD * load[1]
    return {"total_s": fixed + (steps * median + eval_s),
            "low_s": fixed + (steps * median + eval_s) * scale[0],
            "high_s": fixed + (steps * median + eval_s) * scale[1],
            "parts": parts, "steps": steps, "step_s": median, "timed_steps": len(timed),
            "spread": (high - low) / median, "evaluations": count, "eval_images": images,
            "saves": saves, "save_measured": save_s is not None, "load": load, "busy": busy}


def describe_estimate(e: dict) -> str:
    """`estimate_run`'s figures as one line: the total and its range, each part, how sure."""
    p = e["parts"]
    if e["timed_steps"] > 1:
        sure = (f"range from the spread of {e['timed_steps']} timed steps "
                f"({e['spread']:.0%})")
    else:
        sure = "one timed step: no spread to judge by"
    if e["busy"]:
        sure += (f"; this host was busy while they ran (load {e['load'][0]:.1f} on "
                 f"{e['load'][1]} CPUs): on an idle one the steps may be faster")
    if e["evaluations"] and e["eval_images"] is None:
        evals = (f"{e['evaluations']} validations not counted (the split is not on this "
                 "machine)")
    elif e["evaluations"]:
        evals = (f"{e['evaluations']} validations of {e['eval_images']:,} images "
                 f"{_duration(p['evaluations_s'])} (estimated)")
    else:
        evals = "no validation"
    saves = (f"{e['saves']} checkpoints {_duration(p['checkpoints_s'])} (one timed; the last "
             "is waited for)" if e["save_measured"] else
             f"{e['saves']} checkpoints not counted (no save could be timed)")
    return (f"whole run: about {_duration(e['total_s'])} ({_duration(e['low_s'])} to "
            f"{_duration(e['high_s'])}; {sure}): start-up {_duration(p['startup_s'])}, "
            f"compile {_duration(p['compile_s'])}, {e['steps']} steps "
            f"{_duration(p['steps_s'])} at {e['step_s']:.3f} s, {evals}, {saves}")


def _gb(size: float) -> str:
    return f"{size / 1e9:,.2f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

