"""Explain mode that keeps every layer: attention probabilities and their gradients.

These hold `layers x heads x tokens^2` per image, fine for small models, analysis and tests (they
are the independent reference the streaming maps in `maps.py` are checked against). Attention is
recomputed on the materialising XLA path whatever `attention_impl` the model was built with, so
the logits match the normal forward pass, flash kernel or not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def _logits_with_hook(model, images, hook):
    return model.head_logits(model.pool(model.features(images, probs_hook=hook)))


@nnx.jit
def attention_probs(model, images: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    """Logits and every layer's probabilities, `[batch, heads, q, k]` each, in layer order."""
    recorded = {}

    def record(i, probs):
        recorded[i] = probs
        return probs

    logits = _logits_with_hook(model, images, record)
    return logits, [recorded[i] for i in sorted(recorded)]


@nnx.jit
def attention_grads(model, images: jax.Array, class_index: jax.Array):
    """Logits, every layer's probabilities and d logit[class] / d probabilities of that layer.

    The gradient is taken with respect to a zero `delta` added to each layer's probabilities,
    so layer `i`'s gradient is paired with layer `i`'s attention by construction.
    """
    cfg = model.config
    gh, gw = model.grid_for(images.shape[1:3])
    n = cfg.num_prefix_tokens + gh * gw
    shape = (images.shape[0], cfg.num_heads, n, n)

    def logit_of_class(deltas):
        recorded = {}

        def perturb(i, probs):
            recorded[i] = probs
            return probs + deltas[i]

        logits = _logits_with_hook(model, images, perturb)
        picked = jnp.take_along_axis(logits, class_index[:, None], axis=1).sum()
        return picked, (logits, [recorded[i] for i in range(cfg.depth)])

    deltas = [jnp.zeros(shape, jnp.float32) for _ in range(cfg.depth)]
    grads, (logits, probs) = jax.grad(logit_of_class, has_aux=True)(deltas)
    return logits, probs, grads
