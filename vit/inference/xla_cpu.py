"""XLA:CPU compile options: XLA's own dot emitter instead of YNNPACK fusions.

jax 0.10's CPU backend hands matmuls to YNNPACK fusions by default; for ViT XLA's own dot
emitter is faster, in the inference forward (`scripts/bench_gemm.py` and
`scripts/bench_inference.py --ynn` measure both) and in the training step (about 0.7 of the
step time for ViT-S/16 at batch 32 and ViT-B/16 at batch 8 on a 2-core Zen 3,
docs/benchmarks.md). So the options are given per compile, to the inference forwards
(`compile_for_inference`) and to the jitted training step (`jit_options`), never process-wide
through `XLA_FLAGS`.

`VIT_XLA_DOTS=0` keeps jax's defaults. A jaxlib that does not know an option compiles with its
defaults too. GPU and TPU compiles get no options. Standard library only until called.
"""

from __future__ import annotations

import functools
import os

OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}  # "": no YNNPACK fusions
OPT_OUT = "VIT_XLA_DOTS"


def compile_for_inference(lowered):
    """`lowered.compile()`, with `OPTIONS` when the default backend is the CPU (and not opted
    out); if this jaxlib refuses them, with its defaults."""
    import jax

    if os.environ.get(OPT_OUT) == "0" or jax.default_backend() != "cpu":
        return lowered.compile()
    try:
        return lowered.compile(OPTIONS)
    except Exception:  # noqa: BLE001 - an option this jaxlib does not know: its defaults
        return lowered.compile()


def jit_options() -> dict:
    """`jax.jit` keyword arguments giving `OPTIONS` to its compiles where
    `compile_for_inference` would: none off the CPU, when opted out, or when this jaxlib
    refuses them (tried once on a one-element function)."""
    import jax

    if os.environ.get(OPT_OUT) == "0" or jax.default_backend() != "cpu":
        return {}
    return {"compiler_options": OPTIONS} if _known(tuple(OPTIONS.items())) else {}


@functools.cache
def _known(options: tuple) -> bool:
    import jax
    import numpy as np

    try:
        jax.jit(lambda x: x + 1, compiler_options=dict(options)).lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - an option this jaxlib does not know
        return False
    return True
