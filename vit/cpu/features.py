"""What this CPU can do for a narrow compute dtype: bfloat16 arithmetic in hardware or not.

The one reading of /proc/cpuinfo in vit. The dense products (`vit.ops.matmul`), the attention
layer's product shapes (`vit.models.blocks`), the inference compile options
(`vit.cpu.xla_options`), the note `vit train` / `vit predict` print for a bfloat16 that cannot
pay, and the dtype a recipe's `model.dtype='auto'` stands for all ask here.
"""

from __future__ import annotations

import functools

# The narrow compute dtypes, by name: products in them accumulate in float32.
NARROW_DTYPES = ("bfloat16", "float16")
# /proc/cpuinfo flags (x86) and Features (Arm) that mean bfloat16 arithmetic in hardware.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16")
CPUINFO = "/proc/cpuinfo"


@functools.cache
def cpu_bfloat16_features() -> tuple[str, ...]:
    """This CPU's bfloat16 arithmetic features, as /proc/cpuinfo names them (empty: none, or
    no /proc/cpuinfo to read)."""
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    have = set(value.split())
                    return tuple(flag for flag in BF16_FLAGS if flag in have)
    except OSError:
        pass
    return ()


def on_cpu() -> bool:
    """Whether jax computes on the CPU (its default backend)."""
    import jax

    return jax.default_backend() == "cpu"


def is_narrow(dtype) -> bool:
    """Whether `dtype` is a narrow compute dtype (bfloat16, float16)."""
    import jax.numpy as jnp

    return dtype is not None and jnp.dtype(dtype).name in NARROW_DTYPES


def narrow_on_bfloat16_cpu(dtype) -> bool:
    """Whether products in `dtype` are narrow ones on a CPU with bfloat16 arithmetic, where
    jax's YNNPACK runs them on that hardware (the inference compile options and the attention
    layer's product shapes follow from it)."""
    return is_narrow(dtype) and on_cpu() and bool(cpu_bfloat16_features())


def bfloat16_note() -> str | None:
    """One line for a user who asked for bfloat16 where it cannot pay: a CPU without bfloat16
    arithmetic. None where it can (such a CPU, a GPU, a TPU)."""
    if not on_cpu() or cpu_bfloat16_features():
        return None
    return ("bfloat16 is no faster than float32 on this CPU (it has no bfloat16 arithmetic: "
            "no AVX512_BF16 or AMX); float32 is the better choice here, bfloat16 pays on GPUs, "
            "TPUs and CPUs that have it")


# A recipe's `model.dtype` that lets the host choose (`vit.training.from_recipe` resolves it).
AUTO = "auto"


def auto_dtype() -> tuple[str, str]:
    """(the compute dtype `auto` means here, why): bfloat16 on a GPU or TPU and on a CPU with
    bfloat16 arithmetic, float32 on other CPUs (there bfloat16 is converted to float32 and back
    around every product, and is no faster)."""
    import jax

    backend = jax.default_backend()
    if backend != "cpu":
        return "bfloat16", f"the backend is {backend}"
    have = cpu_bfloat16_features()
    if have:
        return "bfloat16", f"this CPU has bfloat16 arithmetic: {', '.join(have)}"
    return "float32", "this CPU has no bfloat16 arithmetic"
