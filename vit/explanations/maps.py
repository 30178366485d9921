"""Attention maps for a batch of images, one jitted pass, memory independent of depth.

`explain(model, images, method=...)` returns one `[rows, cols]` map per image over the patch
grid, with the logits (equal to the normal forward pass's) and the class explained.

How memory stays flat in depth. Only the classifier's readout row of the layer product is
wanted, so no method keeps `layers x tokens^2` per image:

- `attention`, `rollout`: a forward-only pass, a `lax.scan` over the blocks, that carries the
  running product `P <- Ahat_l P` (`tokens x tokens` per image) from layer to layer; each
  layer's probabilities die as soon as they are folded in.
- `grad-rollout`, `relevancy`: the readout row of `M_L ... M_1` is a row vector pushed through
  the layers in reverse order, `v <- v M_l`, which is the order of the backward pass. So the
  vector rides the backward pass as the cotangent of a dummy carry threaded through every layer
  (`_chain_tap`, a `custom_vjp`): each layer's backward turns its attention and gradient into
  `M_l` and applies it on the spot. The blocks run as a rematerialised `lax.scan`, so the
  backward pass keeps each block's input (`tokens x width`), not its attention, and recomputes
  one layer's attention at a time (a per-block `jax.checkpoint` in a Python loop would not do:
  XLA may hoist the recomputations and keep them all alive). The price, for every method: the
  scan reads one stacked copy of the block parameters (the model's size again, whatever the
  batch size).

`tests/test_explain.py` checks with XLA's compiled memory analysis at two depths that only
`tokens x width` per layer and image (and the parameter copy) grow with depth.

Attention is computed on the materialising XLA path whatever `attention_impl` the model was
built with; the encoder loop below mirrors `VisionTransformer.features` (tests check its logits
against the model's own).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit.explanations import rules
from vit.explanations.tokens import TokenLayout, map_readout
from vit.models.blocks import Keys

METHODS = ("attention", "rollout", "grad-rollout", "relevancy")
GRADIENT_METHODS = ("grad-rollout", "relevancy")


class Explanation(NamedTuple):
    maps: jax.Array  # [batch, rows, cols], over the patch grid
    logits: jax.Array  # [batch, classes], as the normal forward pass gives them
    class_index: jax.Array  # [batch], the class each map explains


def _encode(model, images, tap, carry, backward: bool):
    """The encoder with `tap(probs, carry) -> (probs, carry)` at every attention.

    Mirrors `VisionTransformer.features`. The blocks run as a `lax.scan` over their stacked
    parameters, so one layer's attention is alive at a time (unrolled in a Python loop, XLA's
    CPU scheduler may keep every layer's attention alive at once). Passes that will be
    differentiated (`backward`) also rematerialise each layer, so the backward pass is one layer
    at a time.
    (Blocks differ only in their drop-path rate, a static attribute that is inert without a
    key, so the first block's graph serves them all.)
    """

    def step(block, x, carry):
        box = {}

        def hook(probs):
            probs, box["carry"] = tap(probs, carry)
            return probs

        return block(x, Keys(None), hook, rel_pos_bias=bias), box["carry"]

    x = model.embed(images)
    bias = model.shared_rel_pos_bias()
    graphdef, _ = nnx.split(model.blocks[0])
    stacked = jax.tree.map(lambda *layers: jnp.stack(layers),
                           *[nnx.split(block)[1] for block in model.blocks])

    def layer(x_carry, state):
        return step(nnx.merge(graphdef, state), *x_carry), None

    if backward:
        layer = jax.checkpoint(layer)
    (x, carry), _ = jax.lax.scan(layer, (x, carry), stacked)
    return model.final_norm(x), carry


def _readout(model, layout: TokenLayout, tokens: jax.Array) -> jax.Array:
    if layout.classifier == "map":  # over the tokens the head reads (all, or the patches)
        row = map_readout(model.map_head, model.pooled_tokens(tokens))
        return jnp.pad(row, ((0, 0), (tokens.shape[1] - row.shape[1], 0)))
    return layout.fixed_readout(tokens.shape[0])


def _pick_class(logits: jax.Array, class_index: jax.Array) -> jax.Array:
    return jnp.where(class_index < 0, jnp.argmax(logits, -1), class_index).astype(jnp.int32)


def _forward_map(model, images, layout, *, method, head_fusion, discard_ratio):
    """`attention` and `rollout`: a forward pass carrying one `[batch, N, N]` matrix."""
    n = layout.num_tokens
    b = images.shape[0]

    def tap(probs, carry):
        fused = rules.fuse_heads(probs, head_fusion)
        if method == "attention":
            return probs, fused  # the last layer's survives
        step = rules.rollout_matrix(fused, discard_ratio, layout.class_token)
        return probs, jnp.einsum("bqk,bkn->bqn", step, carry)

    start = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), (b, n, n))
    tokens, product = _encode(model, images, tap, start, backward=False)
    logits = model.head_logits(model.pool(tokens))
    row = jnp.einsum("bq,bqk->bk", _readout(model, layout, tokens), product)
    return logits, row


def _chain_tap(layer_matrix):
    """An identity on (probs, v) whose backward applies `v <- v M(probs, grad)`.

    The cotangent arriving for `probs` is d logit / d probs of this very layer, so gradients
    pair with their own layer by construction; it passes through unchanged, and the carry's
    cotangent never reaches the model's gradients.
    """

    @jax.custom_vjp
    def tap(probs, v):
        return probs, v

    def fwd(probs, v):
        return (probs, v), probs

    def bwd(probs, cotangents):
        grad, v_out = cotangents
        return grad, jnp.einsum("bq,bqk->bk", v_out, layer_matrix(probs, grad))

    tap.defvjp(fwd, bwd)
    return tap


def _gradient_map(model, images, class_index, layout, *, method, head_fusion, discard_ratio):
    """`grad-rollout` and `relevancy`: the readout row rides the backward pass."""

    def layer_matrix(probs, grad):
        positive = rules.positive_grad_attention(probs, grad)
        if method == "relevancy":
            abar = positive.mean(1)
            return abar + jnp.eye(abar.shape[-1], dtype=abar.dtype)
        return rules.rollout_matrix(rules.fuse_heads(positive, head_fusion), discard_ratio,
                                    layout.class_token)

    tap = _chain_tap(layer_matrix)

    def forward(v):
        tokens, v = _encode(model, images, tap, v, backward=True)
        logits = model.head_logits(model.pool(tokens))
        return logits, v, jax.lax.stop_gradient(_readout(model, layout, tokens))

    v0 = jnp.zeros((images.shape[0], layout.num_tokens), jnp.float32)
    (logits, _, readout), backward = jax.vjp(forward, v0)
    chosen = _pick_class(logits, class_index)
    seed = jax.nn.one_hot(chosen, logits.shape[-1], dtype=logits.dtype)
    (row,) = backward((seed, readout, jnp.zeros_like(readout)))
    return logits, row


def explain_core(model, images, class_index, *, method, head_fusion, discard_ratio):
    """The unjitted body of `explain` (for `jax.jit(...).lower` in memory checks)."""
    layout = TokenLayout.for_model(model, images.shape[1:3])
    options = dict(method=method, head_fusion=head_fusion, discard_ratio=discard_ratio)
    if method in GRADIENT_METHODS:
        logits, row = _gradient_map(model, images, class_index, layout, **options)
    else:
        logits, row = _forward_map(model, images, layout, **options)
    return Explanation(layout.patch_grid(row), logits, _pick_class(logits, class_index))


_explain = nnx.jit(explain_core, static_argnames=("method", "head_fusion", "discard_ratio"))


def explain(model, images, method: str = "rollout", class_index=None, *,
            head_fusion: str = "mean", discard_ratio: float = 0.0) -> Explanation:
    """Maps for a batch of NHWC images, preprocessed as the model expects.

    `class_index`: None explains each image's top class; an int or a `[batch]` array picks
    the class (-1 for top). Only the gradient methods depend on the class.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if head_fusion not in rules.HEAD_FUSIONS:
        raise ValueError(f"head fusion {head_fusion!r} is not one of "
                         f"{', '.join(rules.HEAD_FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must lie in [0, 1), got {discard_ratio}")
    images = jnp.asarray(images, jnp.float32)
    wanted = -1 if class_index is None else class_index
    wanted = jnp.broadcast_to(jnp.asarray(wanted, jnp.int32), (images.shape[0],))
    return _explain(model, images, wanted, method=method, head_fusion=head_fusion,
                    discard_ratio=float(discard_ratio))


def rollout_of(attentions: list[np.ndarray] | list[jax.Array], head_fusion: str = "mean",
               discard_ratio: float = 0.0, class_token: bool = True) -> jax.Array:
    """Full rollout product `Ahat_L ... Ahat_1` of per-layer `[batch, heads, N, N]` attention."""
    product = None
    for probs in attentions:
        step = rules.rollout_matrix(rules.fuse_heads(jnp.asarray(probs), head_fusion),
                                    discard_ratio, class_token)
        product = step if product is None else jnp.einsum("bqk,bkn->bqn", step, product)
    return product
