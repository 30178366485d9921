"""Compatibility name: the XLA:CPU compile options live in `vit.cpu.xla_options`."""

from vit.cpu.xla_options import (  # noqa: F401
    INFERENCE,
    OPT_OUT,
    SCHEDULE,
    TRAINING,
    compile_for_inference,
    inference_options,
    jit_options,
    training_options,
)

OPTIONS = INFERENCE
