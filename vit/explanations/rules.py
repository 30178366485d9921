"""Per-layer rules of the explanation methods, as pure functions of one layer's attention.

Shapes: attention probabilities and their gradients are `[batch, heads, q, k]`; a fused
(head-free) matrix is `[batch, q, k]`. Every rule works per image, so a batch gives each image
the map it gets alone.

- rollout (Abnar & Zuidema 2020): fuse heads, drop the lowest attentions, `0.5*A + 0.5*I`,
  re-normalise rows; layers multiply as `A_L ... A_1`.
- grad-rollout: the same, on `(grad A * A)^+` per head (the clamp comes before the fusion, so a
  head that argues against the class cannot cancel one that argues for it).
- relevancy (Chefer et al. 2021, "Generic attention-model explainability"): `Abar = E_h[(grad A *
  A)^+]`; self-attention `R <- R + Abar R`, starting from `R = I`; the cross-attention rule for
  text-conditioned models is `cross_attention_update`, and a head that pools the text
  (the prompt head) is one more such layer, `pooling_update`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(a: jax.Array, how: str = "mean") -> jax.Array:
    if how not in HEAD_FUSIONS:
        raise ValueError(f"head fusion {how!r} is not one of {', '.join(HEAD_FUSIONS)}")
    return {"mean": jnp.mean, "max": jnp.max, "min": jnp.min}[how](a, axis=1)


def discard_lowest(a: jax.Array, ratio: float, protect_first: bool) -> jax.Array:
    """Zeroes the lowest `ratio` of each row of `[batch, q, k]`; column 0 is kept when protected.

    Per row, unlike vit-explain's flat threshold over the whole matrix, so that rows with small
    values (registers, background patches) are not wiped out wholesale.
    """
    if ratio <= 0.0:
        return a
    n = a.shape[-1]
    drop = int(n * ratio)
    ranked = a.at[..., 0].set(jnp.inf) if protect_first else a
    ranks = jnp.argsort(jnp.argsort(ranked, axis=-1), axis=-1)
    return jnp.where(ranks < drop, 0.0, a)


def rollout_matrix(fused: jax.Array, discard_ratio: float = 0.0,
                   protect_first: bool = True) -> jax.Array:
    """One layer of rollout: `0.5*A + 0.5*I` with rows re-normalised, `[batch, q, k]`."""
    fused = discard_lowest(fused, discard_ratio, protect_first)
    a = 0.5 * fused + 0.5 * jnp.eye(fused.shape[-1], dtype=fused.dtype)
    return a / a.sum(-1, keepdims=True)


def positive_grad_attention(probs: jax.Array, grads: jax.Array) -> jax.Array:
    """`(grad A * A)^+`, per head: `[batch, heads, q, k]`."""
    return jnp.maximum(probs * grads, 0.0)


def relevancy_self_update(r: jax.Array, abar: jax.Array) -> jax.Array:
    """Chefer's self-attention rule on the full relevance matrix: `R + Abar R`."""
    return r + jnp.einsum("bqk,bkn->bqn", abar, r)


def normalise_relevance(r: jax.Array) -> jax.Array:
    """Chefer's `Rbar`: the rows of `R - I` re-normalised to sum to 1, plus `I` again."""
    eye = jnp.eye(r.shape[-1], dtype=r.dtype)
    off = r - eye
    return off / jnp.maximum(off.sum(-1, keepdims=True), 1e-12) + eye


def cross_attention_update(r_ss: jax.Array, r_sq: jax.Array, r_qq: jax.Array,
                           abar: jax.Array) -> jax.Array:
    """Chefer's bi-modal rule for image queries attending to text keys: the new `R^{sq}`.

    `r_ss` `[b, s, s]` is the image-to-image relevance, `r_sq` `[b, s, q]` image-to-text,
    `r_qq` `[b, q, q]` text-to-text, `abar` `[b, s, q]` the layer's `E_h[(grad A * A)^+]`:
    `R^{sq} <- R^{sq} + Rbar^{ss}^T Abar Rbar^{qq}`. A gate still at zero sends no gradient to
    its attention, so `abar` is 0 and patch-to-text relevance stays exactly 0. (The text tokens
    do not attend to the image, so `R^{ss} <- R^{ss} + Abar R^{qs}` leaves `R^{ss}` unchanged.)
    """
    lhs = jnp.swapaxes(normalise_relevance(r_ss), 1, 2)
    return r_sq + jnp.einsum("bst,btq,bqr->bsr", lhs, abar, normalise_relevance(r_qq))


def pooling_update(r_aq: jax.Array, h: jax.Array, r_qq: jax.Array) -> jax.Array:
    """A head that reads pooled text, as a cross-attention layer of the answer (one query)
    over the text tokens: the answer's text relevance `r_aq` `[b, q]` plus `h Rbar^qq`.

    `h` `[b, q]` is the pooling's `(grad a * a)^+`, the positive part of gradient x input of
    the answer with respect to each token's term `a_j T_j` of the pooled text (one "head", so
    no head mean); `r_qq` `[b, q, q]` the text-to-text relevance. This is
    `cross_attention_update` with the answer's own relevance `Rbar^{aa} = 1` (it attends from
    nowhere else), so the two text routes, through cross-attention and through the head, add
    in the same units.
    """
    return r_aq + jnp.einsum("bq,bqr->br", h, normalise_relevance(r_qq))
