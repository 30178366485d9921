"""XLA:CPU compile options for inference: XLA's own dot emitter instead of YNNPACK fusions.

jax 0.10's CPU backend hands matmuls to YNNPACK fusions by default; for ViT inference XLA's own
dot emitter is faster (`scripts/bench_gemm.py` and `scripts/bench_inference.py --ynn` measure
both), but not for training. So the options are given per compile, to the inference forwards
only (`Predictor.compile`), never process-wide through `XLA_FLAGS`.

`VIT_XLA_DOTS=0` keeps jax's defaults. A jaxlib that does not know an option compiles with its
defaults too. GPU and TPU compiles get no options. Standard library only until called.
"""

from __future__ import annotations

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
