"""Inference weights stored in the compute dtype.

A layer computing in a narrow dtype (bfloat16, float16) casts its float32 kernel to that dtype
at every call: a training step needs that (its master weights stay float32), an inference
forward does not, and on the CPU the cast is not free (every weight matrix converted on every
call, a visible share of the forward). So an inference model has those kernels
cast once, here, on a copy (the caller's model keeps its weights). The outputs are bit for bit
the same: each layer would round the same values the same way. Biases, norms and embeddings
keep their dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from vit.ops.matmul import NARROW


def narrow_kernels(model):
    """A copy of `model` whose dense layers and patch embedding that compute in a narrow dtype
    hold their kernels in that dtype; `model` itself when none does (it is never changed)."""
    if not any(_narrow_kernel(module) is not None for _, module in nnx.iter_modules(model)):
        return model
    model = nnx.clone(model)
    for _, module in nnx.iter_modules(model):
        variable = _narrow_kernel(module)
        if variable is not None:
            variable.set_value(variable.get_value().astype(module.dtype))
    return model


def _narrow_kernel(module) -> nnx.Param | None:
    """The kernel `module` casts to a narrow compute dtype at every call, if it has one."""
    dtype = getattr(module, "dtype", None)
    if dtype is None or jnp.dtype(dtype) not in NARROW:
        return None
    if isinstance(module, nnx.Linear):
        return module.kernel
    patch = getattr(module, "patch_kernel", None)
    return patch if isinstance(patch, nnx.Param) else None
