"""XLA:CPU compile options: which ops XLA hands to YNNPACK, and which schedule it takes.

jax's CPU backend hands matmuls, reductions and elementwise ops to YNNPACK fusions by default.
For ViT, XLA's own dot emitter runs the dense layers faster, while YNNPACK's reductions beat
XLA's (the bias and LayerNorm gradients of the backward pass). So:

- inference forwards (`compile_for_inference`, the evaluation forward through `jit_options`):
  no YNNPACK fusions at all (`INFERENCE`; the forward's few reductions gain nothing), except
  in a narrow dtype (bfloat16, float16) on a CPU with bfloat16 arithmetic (AVX512_BF16, AMX):
  there YNNPACK runs a bfloat16 product on that hardware, while XLA's own dot emitter widens
  it to float32 (`inference_options`);
- the float32 training step (`jit_options(training_options("float32"))`, `TRAINING`): XLA's
  dots, YNNPACK's reductions;
- every training step on the CPU (`SCHEDULE`, within `TRAINING`): XLA's memory-optimised
  schedule, which keeps fewer buffers alive at once, so each step touches less fresh memory;
  on a CPU the concurrency the default schedule buys is small, as every big op already uses
  all cores.

benchmarks/ records what each choice measures. The options are given per compile, never
process-wide through `XLA_FLAGS`. `VIT_XLA_DOTS=0` keeps jax's defaults everywhere. A jaxlib
that does not know an option compiles with its defaults too. GPU and TPU compiles get no
options. Standard library only until called.
"""

from __future__ import annotations

import functools
import os

from vit.cpu.features import narrow_on_bfloat16_cpu, on_cpu

INFERENCE = {"xla_cpu_experimental_ynn_fusion_type": ""}  # "": no YNNPACK fusions
SCHEDULE = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}
TRAINING = {**SCHEDULE, "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
OPT_OUT = "VIT_XLA_DOTS"


def wanted() -> bool:
    """Whether options apply at all: the default backend is the CPU and not opted out."""
    return os.environ.get(OPT_OUT) != "0" and on_cpu()


def inference_options(dtype=None) -> dict:
    """The options of an inference forward computing in `dtype` (default float32): `INFERENCE`,
    or none (jax's defaults: YNNPACK's dots) for a narrow dtype on a CPU with bfloat16
    arithmetic."""
    return {} if narrow_on_bfloat16_cpu(dtype) else INFERENCE


def training_options(dtype="float32") -> dict:
    """The options of a training step computing in `dtype`: `TRAINING` in float32, `SCHEDULE`
    alone otherwise (jax's fusions, which run a narrow product on bfloat16 hardware)."""
    return dict(TRAINING if str(dtype) == "float32" else SCHEDULE)


def compile_for_inference(lowered, dtype=None):
    """`lowered.compile()`, with `inference_options(dtype)` when `wanted`; if this jaxlib
    refuses them, with its defaults."""
    if not wanted():
        return lowered.compile()
    try:
        return lowered.compile(inference_options(dtype))
    except Exception:  # noqa: BLE001 - an option this jaxlib does not know: its defaults
        return lowered.compile()


def jit_options(options: dict | None = None) -> dict:
    """`jax.jit` keyword arguments giving `options` (default `INFERENCE`) to its compiles: none
    off the CPU, when opted out, or when this jaxlib refuses them (tried once on a tiny
    function)."""
    options = INFERENCE if options is None else options
    if not wanted():
        return {}
    return {"compiler_options": dict(options)} if _known(tuple(options.items())) else {}


@functools.cache
def _known(options: tuple) -> bool:
    import jax
    import numpy as np

    try:
        jax.jit(lambda x: x + 1, compiler_options=dict(options)).lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - an option this jaxlib does not know
        return False
    return True
