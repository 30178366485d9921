"""Matrix products in a narrow compute dtype (bfloat16, float16), issued the way the hardware
runs them fastest.

On CPUs with bfloat16 arithmetic (AVX512_BF16, AMX), oneDNN/XLA run a bfloat16 product with
float32 accumulation *and float32 output* far faster than one that writes bfloat16 (the
rounding pass on the output tile is the slow part); elsewhere the float32 output costs little.
So on the CPU a narrow product asks for float32 output (`preferred_element_type`) and rounds
after the bias is added, in the same fused pass. On GPUs and TPUs the dot units accumulate in
float32 anyway and a narrow output halves the memory traffic: the plain narrow product.

The backward pass does the same for both gradient products (JAX's own transpose rule would
widen the incoming float32 gradient and run them in float32), and gives the weight gradient
in float32, the master weights' dtype, without a bfloat16 rounding in between.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vit.cpu import features

NARROW = tuple(jnp.dtype(name) for name in features.NARROW_DTYPES)


def wide_output() -> bool:
    """Whether narrow products here should write float32 (the CPU) rather than narrow."""
    return features.on_cpu()


def _transposed(spec: str) -> tuple[str, str]:
    """For `spec` "A,B->C": the specs of the two gradient products, "C,B->A" and "A,C->B"."""
    ins, out = spec.split("->")
    a, b = ins.split(",")
    return f"{out},{b}->{a}", f"{a},{out}->{b}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5))
def _narrow_product(spec, x, kernel, dtype, x_dtype, kernel_dtype):
    return _narrow_fwd(spec, x, kernel, dtype, x_dtype, kernel_dtype)[0]


def _narrow_fwd(spec, x, kernel, dtype, x_dtype, kernel_dtype):
    xs, ks = x.astype(dtype), kernel.astype(dtype)
    return jnp.einsum(spec, xs, ks, preferred_element_type=jnp.float32), (xs, ks)


def _narrow_bwd(spec, dtype, x_dtype, kernel_dtype, res, g):
    xs, ks = res
    g = g.astype(dtype)
    dx_spec, dk_spec = _transposed(spec)
    dx = jnp.einsum(dx_spec, g, ks, preferred_element_type=jnp.float32).astype(x_dtype)
    dk = jnp.einsum(dk_spec, xs, g, preferred_element_type=jnp.float32).astype(kernel_dtype)
    return dx, dk


_narrow_product.defvjp(_narrow_fwd, _narrow_bwd)


def einsum_dense(spec: str, x: jax.Array, kernel: jax.Array, bias: jax.Array | None,
                 dtype) -> jax.Array:
    """`jnp.einsum(spec, x, kernel) + bias` computed in `dtype`, returned in `dtype`; `spec`
    is "A,B->C" with every index of A and B in another of the three (a layer's product, its
    output laid out as the caller needs it: XLA folds that layout into the product).

    A narrow `dtype` on the CPU: narrow inputs, float32 accumulation and output, the bias
    added in float32, one rounding at the end. Otherwise the plain product in `dtype`.
    """
    dtype = jnp.dtype(dtype)
    if dtype in NARROW and wide_output():
        y = _narrow_product(spec, x, kernel, dtype, jnp.dtype(x.dtype), jnp.dtype(kernel.dtype))
        if bias is not None:
            y = y + bias.astype(jnp.float32)
        return y.astype(dtype)
    y = jnp.einsum(spec, x.astype(dtype), kernel.astype(dtype))
    return y if bias is None else y + bias.astype(dtype)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, dtype) -> jax.Array:
    """`x @ kernel + bias` over x's last axis, computed and returned in `dtype` (as
    `einsum_dense`)."""
    lead = "abcdefgh"[:x.ndim - 1]
    return einsum_dense(f"{lead}y,yz->{lead}z", x, kernel, bias, dtype)


def narrow_einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """`jnp.einsum(spec, a, b)` in `dtype`: on the CPU with float32 accumulation and output,
    rounded to `dtype` after."""
    dtype = jnp.dtype(dtype)
    if dtype in NARROW and wide_output():
        return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                          preferred_element_type=jnp.float32).astype(dtype)
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype))

