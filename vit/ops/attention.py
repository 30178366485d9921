"""One entry point for scaled dot-product attention, and the XLA reference path.

Arrays are `[batch, seq, heads, head_dim]`. `impl` picks the backend:

- `"xla"`: plain einsum + float32 softmax; runs everywhere and is the reference.
- `"cudnn"`: `jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs).
- `"pallas"`: our tiled flash-attention kernel (`vit.ops.flash_attention`); on CPU it runs in
  Pallas interpret mode, which is slow and meant for tests.
- `"auto"`: Pallas on GPU/TPU when the shape is supported, else cuDNN on GPU, else XLA. float32
  on GPU goes to XLA (TF32 dots under JAX's default precision); bfloat16/float16 to the kernel.

Whatever is asked for, a user is never left without a working path: a backend that does not
apply to the platform or shape falls back to the next one, and the choice and its reason are
logged once; a backend asked for by name and replaced also warns once (`RuntimeWarning`).
Under `"auto"` on a GPU or TPU the chosen backend (the kernel, or cuDNN) is compiled once per
shape on its own before it is used (fast: one small program); if it fails to lower or compile
there (a new GPU, a new jax), the call goes to the next one (Pallas -> cuDNN -> XLA), with one
warning naming each error. `impl="pallas"` asked for by name gets no such net: its failure is
the caller's to see.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings

import jax
import jax.numpy as jnp
from einops import rearrange

from vit.ops import matmul

IMPLS = ("auto", "pallas", "cudnn", "xla")

log = logging.getLogger(__name__)


@functools.cache
def _log_choice(requested: str, chosen: str, reason: str) -> None:
    """Logs each distinct decision once per process; an explicitly requested backend that is
    replaced also warns once, so the fallback is visible without logging set up."""
    log.info("attention impl=%s -> %s (%s)", requested, chosen, reason)
    if requested not in ("auto", chosen):
        warnings.warn(f"attention impl={requested!r} is not used here: {reason}; running "
                      f"{chosen!r} instead", RuntimeWarning, stacklevel=4)


def _platform() -> str:
    return jax.default_backend()


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _backend_fn(backend: str, kv_len, scale):
    if backend == "pallas":
        from vit.ops.flash_attention import flash_attention

        return lambda q, k, v: flash_attention(q, k, v, kv_len=kv_len, scale=scale)
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=scale,
                                                        implementation="cudnn")


@functools.cache
def _compile_failure(backend: str, q_shape: tuple, k_shape: tuple, dtype, has_kv_len: bool,
                     scale: float | None) -> str | None:
    """Why `backend` ("pallas" or "cudnn") cannot lower or compile here for this call (forward
    and backward), or None when it can. Compiled from shapes alone, once per process and
    signature."""

    def fwd_bwd(q, k, v, kv_len):
        out, vjp = jax.vjp(_backend_fn(backend, kv_len, scale), q, k, v)
        return out, vjp(out)

    spec = lambda shape: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    kv_len = jax.ShapeDtypeStruct(q_shape[:1], jnp.int32) if has_kv_len else None
    try:
        jax.jit(fwd_bwd).lower(spec(q_shape), spec(k_shape), spec(k_shape), kv_len).compile()
    except Exception as e:  # noqa: BLE001 - any failure to build it means: not here
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:300]}"
    return None


_NAMES = {"pallas": "the Pallas kernel", "cudnn": "cuDNN attention"}


def _first_that_compiles(chosen: str, reason: str, q_shape: tuple, k_shape: tuple, dtype,
                         has_kv_len: bool, scale) -> tuple[str, str]:
    """Under `auto` on a GPU/TPU: `chosen` if it compiles here, else the next backend that
    does (Pallas -> cuDNN -> XLA), with one warning naming each failure."""
    failures = []
    while chosen in _NAMES:
        failure = _compile_failure(chosen, q_shape, k_shape, dtype, has_kv_len, scale)
        if failure is None:
            break
        failures.append(f"{_NAMES[chosen]} failed to compile here ({failure})")
        if chosen == "pallas":
            chosen, reason = choose_impl("cudnn", q_shape, k_shape, dtype, has_mask=False,
                                         dropout=False, has_kv_len=has_kv_len)
        else:
            chosen, reason = "xla", "cuDNN failed to compile here"
    if failures:
        _warn_once(f"attention: {'; '.join(failures)}; running {chosen!r} instead. Set "
                   "attention_impl='xla' (or 'cudnn') to skip the attempt")
    return chosen, reason


def choose_impl(
    impl: str, q_shape: tuple, k_shape: tuple, dtype, *, has_mask: bool, dropout: bool,
    has_kv_len: bool = False,
) -> tuple[str, str]:
    """Returns (backend, reason) for a request; never raises for a valid `impl`."""
    if impl not in IMPLS:
        raise ValueError(f"attention impl {impl!r} is not one of {', '.join(IMPLS)}")
    platform = _platform()
    if dropout:
        return "xla", "attention dropout needs the materialised probabilities"
    if impl == "xla":
        return "xla", "requested"
    if impl in ("auto", "pallas"):
        if has_mask:
            # Neither the kernel nor the cuDNN path here takes a dense mask.
            return "xla", "the Pallas kernel takes kv_len, not a general mask"
        if impl == "auto" and platform not in ("gpu", "tpu"):
            return "xla", f"auto on {platform}"
        if impl == "auto" and platform == "gpu" and jnp.dtype(dtype) == jnp.float32:
            # Our policy for float32 on GPU: XLA, whose dots use TF32 tensor cores under JAX's
            # default matmul precision; the kernel's float32 path uses exact IEEE dots (no
            # tensor cores, register spills) and is meant for checks. bf16/f16 get the kernel.
            return "xla", "float32 on GPU: XLA (TF32 dots) is the fast path"
        from vit.ops import flash_attention as fa

        ok, reason = fa.flash_attention_supported(q_shape, k_shape, dtype, platform)
        if ok:
            return "pallas", reason or (
                "interpret mode" if platform not in ("gpu", "tpu") else "supported")
        if platform != "gpu":
            return "xla", reason
    # cuDNN: requested, or the fallback from Pallas on GPU.
    if has_kv_len:
        # cuDNN would need a dense mask built from kv_len; XLA takes kv_len as it is.
        return "xla", "cuDNN path here takes no kv_len"
    if platform == "gpu" and not has_mask and q_shape[-1] <= 128 and q_shape[-1] % 8 == 0:
        if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
            return "cudnn", "requested" if impl == "cudnn" else "fallback from pallas"
        return "xla", "cuDNN flash attention needs bfloat16 or float16"
    return "xla", f"cuDNN unavailable on {platform} for this shape"


def key_padding_mask(kv_len, kv_seq: int):
    """`[batch, 1, 1, kv_seq]` boolean mask, True for the first `kv_len[b]` keys of example b."""
    return (jnp.arange(kv_seq)[None, :] < jnp.asarray(kv_len)[:, None])[:, None, None, :]


def preferred_layout() -> str:
    """The q/k/v layout a layer should hand `dot_product_attention`: `"bhsd"` on the CPU, where
    the XLA path runs and XLA's dots are much faster with the batch dimensions leading (the
    projections write that layout, so the core needs no transposes of its own); `"bshd"`
    elsewhere, the layout of the kernel and cuDNN."""
    return "bhsd" if _platform() == "cpu" else "bshd"


def reference_attention(q, k, v, *, mask=None, kv_len=None, scale=None, dropout_rate=0.0,
                        dropout_rng=None, return_probs=False, layout: str = "bshd", bias=None):
    """Materialising softmax attention: float32 logits and softmax, output in q's dtype.

    `mask` is boolean, broadcastable to `[batch, heads, q_len, kv_len]`, True where a query may
    attend. `kv_len` (`[batch]` ints) lets example b attend to its first `kv_len[b]` keys
    only, as the Pallas kernel does. `bias` (float, broadcastable to `[batch, heads, q_len,
    kv_len]`) is added to the scaled logits before the softmax: a relative position bias
    (BEiT). With `return_probs` the `[batch, heads, q_len, kv_len]` probabilities come back
    too.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if kv_len is not None:
        keys = key_padding_mask(kv_len, k.shape[1 if layout == "bshd" else 2])
        mask = keys if mask is None else jnp.logical_and(mask, keys)
        # Padded K/V rows may hold anything (NaN included): p == 0 times NaN is still NaN.
        real = keys[:, 0, 0, :, None, None] if layout == "bshd" else keys[:, 0, 0, None, :, None]
        k, v = jnp.where(real, k, 0), jnp.where(real, v, 0)
    # Heads before sequence: XLA's CPU dots are much faster with the batch dimensions leading
    # than in einsum's "bqhd" layout.
    if layout == "bshd":
        q, k, v = (rearrange(x, "b s h d -> b h s d") for x in (q, k, v))
    # The scale goes on q (n*d values) rather than on the n*n logits: fewer multiplies.
    logits = jnp.einsum("bhqd,bhkd->bhqk", q * jnp.asarray(scale, q.dtype), k,
                        preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    if mask is not None:
        # A row with no key to attend to gets zero output, as in the kernel (not a uniform mix).
        probs = jnp.where(mask, probs, 0.0)
    kept = probs
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        kept = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = matmul.narrow_einsum("bhqk,bhkd->bhqd", kept, v, v.dtype)
    if layout == "bshd":
        out = rearrange(out, "b h s d -> b s h d")
    out = out.astype(q.dtype)
    return (out, probs) if return_probs else out


def dot_product_attention(q, k, v, *, mask=None, kv_len=None, impl: str = "auto", scale=None,
                          dropout_rate: float = 0.0, dropout_rng=None, layout: str = "bshd"):
    """Attention over `[batch, seq, heads, head_dim]` arrays through the chosen backend
    (`layout="bhsd"`: `[batch, heads, seq, head_dim]` in and out, see `preferred_layout`).

    `kv_len` (`[batch]` ints) masks keys beyond each example's length (padded text tokens):
    the Pallas kernel takes it natively; the XLA path masks the same way.
    """
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"attention layout {layout!r} is not 'bshd' or 'bhsd'")
    to_bshd = (lambda x: x) if layout == "bshd" else (
        lambda x: rearrange(x, "b h s d -> b s h d"))
    q_shape, k_shape = (tuple(x.shape) if layout == "bshd" else
                        (x.shape[0], x.shape[2], x.shape[1], x.shape[3]) for x in (q, k))
    dropout = dropout_rate > 0.0 and dropout_rng is not None
    chosen, reason = choose_impl(
        impl, q_shape, k_shape, q.dtype, has_mask=mask is not None, dropout=dropout,
        has_kv_len=kv_len is not None,
    )
    if impl == "auto" and chosen in _NAMES and _platform() in ("gpu", "tpu"):
        # A backend that does not build on this device: the next one that does, visibly once.
        chosen, reason = _first_that_compiles(chosen, reason, q_shape, k_shape,
                                              jnp.dtype(q.dtype), kv_len is not None, scale)
    _log_choice(impl, chosen, reason)
    if chosen in _NAMES:
        out = _backend(chosen, impl, to_bshd(q), to_bshd(k), to_bshd(v), kv_len, scale)
        if out is not None:
            return out if layout == "bshd" else rearrange(out, "b s h d -> b h s d")
    return reference_attention(
        q, k, v, mask=mask, kv_len=kv_len, scale=scale,
        dropout_rate=dropout_rate if dropout else 0.0, dropout_rng=dropout_rng, layout=layout,
    )


def _backend(chosen: str, impl: str, q, k, v, kv_len, scale):
    """The Pallas kernel's or cuDNN's output on `[batch, seq, heads, head_dim]` arrays; None
    when cuDNN refuses the call at trace time (the caller runs XLA)."""
    if chosen == "pallas":
        from vit.ops.flash_attention import flash_attention

        return flash_attention(q, k, v, kv_len=kv_len, scale=scale)
    try:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")
    except (RuntimeError, ValueError, NotImplementedError) as e:
        # cuDNN rejects some GPUs, shapes and layouts at trace time: use XLA, visibly.
        why = (f"cuDNN refused this call ({type(e).__name__}: "
               f"{str(e).splitlines()[0] if str(e) else ''})")
        _log_choice(impl, "xla", why)
        if impl == "auto":
            _warn_once(f"attention: {why}; running 'xla' instead")
        return None
