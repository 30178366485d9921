"""XLA:CPU compile options for inference: XLA's own dot emitter instead of YNNPACK fusions.

jax 0.10's CPU backend hands matmuls to YNNPACK fusions by default. For ViT inference XLA's own
dot emitter is faster: 1.14x over qkv, proj, fc1 and fc2 at ViT-B/16's batch-8 shapes
(`scripts/bench_gemm.py` -> benchmarks/bench_gemm.json) and 1.10x on the whole float32 forward
(median of 4 rounds, `scripts/bench_inference.py --ynn`; 1.16x in an earlier run). It is not a
win for training: a ViT-B/16 AdamW step was no faster, and the digits demo (a tiny model, 16
tokens) trained in 130 s against 106 s with jax's default. So the options are given per
compile, to the inference forwards only (`Predictor.compile`), never process-wide through
`XLA_FLAGS`.

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
