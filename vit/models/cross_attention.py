"""Gated cross-attention from image tokens to text tokens (Flamingo), and the text heads.

`x + tanh(g_attn) * xattn(x, text)`, then `x + tanh(g_mlp) * mlp(x)`, with both gates 0 at
initialisation: a cross-attention block added to a pretrained ViT leaves its outputs unchanged
until the gates move. The projections are *not* zeroed, so the gates get gradients at step 0
(a zero projection and a zero gate would both have zero gradients, and nothing would train).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx

from vit.models.blocks import Keys, Mlp, dense, dropout, hooked_attention, layer_norm
from vit.models.config import ViTConfig
from vit.ops.attention import dot_product_attention


class CrossAttentionBlock(nnx.Module):
    """Image tokens (queries) attend to text tokens (keys/values), gated residuals."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        d = cfg.width
        self.num_heads = cfg.num_heads
        self.norm_q = layer_norm(d, cfg, rngs)
        self.norm_kv = layer_norm(d, cfg, rngs)
        self.q = dense(d, d, cfg, rngs)
        self.kv = dense(d, 2 * d, cfg, rngs)
        self.proj = dense(d, d, cfg, rngs)
        self.attn_gate = nnx.Param(jnp.zeros((), jnp.float32))
        self.norm_mlp = layer_norm(d, cfg, rngs)
        self.mlp = Mlp(d, cfg.mlp_dim, cfg, rngs)
        self.mlp_gate = nnx.Param(jnp.zeros((), jnp.float32))
        self.impl, self.rate = cfg.attention_impl, cfg.dropout
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, text: jax.Array, kv_len: jax.Array, keys: Keys,
                 probs_hook: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
        """`x [batch, tokens, width]`, `text [batch, text_len, width]` whose first `kv_len[b]`
        rows are real (null token first, so kv_len >= 1)."""
        q = rearrange(self.q(self.norm_q(x).astype(self.dtype)), "b n (h d) -> b n h d",
                      h=self.num_heads)
        k, v = rearrange(self.kv(self.norm_kv(text).astype(self.dtype)),
                         "b t (two h d) -> two b t h d", two=2, h=self.num_heads)
        if probs_hook is not None:  # image->text probabilities for the bi-modal rules
            out = hooked_attention(q, k, v, kv_len, probs_hook)
        else:
            out = dot_product_attention(q, k, v, kv_len=kv_len, impl=self.impl)
        y = self.proj(rearrange(out, "b n h d -> b n (h d)"))
        y = dropout(y, self.rate, keys(0))
        x = x + jnp.tanh(self.attn_gate[...]).astype(y.dtype) * y
        y = self.mlp(self.norm_mlp(x).astype(self.dtype), Keys(keys(1)))
        return x + jnp.tanh(self.mlp_gate[...]).astype(y.dtype) * y


class PromptHead(nnx.Module):
    """Is the prompt true of the image? One logit from the pooled text-conditioned image
    features and the pooled text: `w . LN(img) + <U LN(img), V txt> / sqrt(d)`.

    The bilinear term lets text and image meet at the head as well as through the gated
    cross-attention. Without it, balanced yes/no data gives the new parts no first-order
    signal at the start (the gates are 0, the head is fresh, and any text-only or image-only
    feature is uncorrelated with the answer), and training often stalls on that saddle.
    Small random init (not zero): a zero head would block every gradient to the gates."""

    def __init__(self, width: int, cfg: ViTConfig, rngs: nnx.Rngs):
        self.norm = layer_norm(width, cfg, rngs)
        self.out = nnx.Linear(width, 1, kernel_init=nnx.initializers.normal(0.02),
                              dtype=jnp.float32, rngs=rngs)
        self.image = nnx.Linear(width, width, use_bias=False, dtype=jnp.float32,
                                kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
        self.text = nnx.Linear(width, width, use_bias=False, dtype=jnp.float32,
                               kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
        self.text_norm = layer_norm(width, cfg, rngs)

    def __call__(self, pooled: jax.Array, text_pooled: jax.Array) -> jax.Array:
        img = self.norm(pooled)
        match = jnp.sum(self.image(img) * self.text(self.text_norm(text_pooled)), axis=-1)
        return (self.out(img)[..., 0] + match / jnp.sqrt(img.shape[-1])).astype(jnp.float32)


class PatchPromptHead(PromptHead):
    """Is the prompt true of the image? Every patch scored against the pooled text, then a soft
    maximum over patches: `t * (logsumexp(s / t) - log n)` with
    `s_i = w . LN(p_i) + <U LN(p_i), V LN(txt)> / sqrt(d)` and a learned temperature `t`.

    Scoring before pooling makes "red triangle" need red and triangle on the *same* patch; a
    pooled head sees red somewhere and triangle somewhere and cannot tell them apart, which is
    what sinks colour x shape pairs never asked in training. At `t` large the soft maximum is
    the patch mean; small `t` approaches the single best patch."""

    def __init__(self, width: int, cfg: ViTConfig, rngs: nnx.Rngs):
        super().__init__(width, cfg, rngs)  # the same scoring layers, applied per patch
        self.log_temperature = nnx.Param(jnp.zeros((), jnp.float32))

    def scores(self, patches: jax.Array, text_pooled: jax.Array) -> jax.Array:
        """`[batch, patches, width]`, `[batch, width]` -> per-patch logits `[batch, patches]`."""
        img = self.norm(patches).astype(jnp.float32)
        txt = self.text(self.text_norm(text_pooled).astype(jnp.float32))
        match = jnp.einsum("bnd,bd->bn", self.image(img), txt)
        return self.out(img)[..., 0] + match / jnp.sqrt(img.shape[-1])

    def weights(self, patches: jax.Array, text_pooled: jax.Array) -> jax.Array:
        """How much each patch counts in the answer, `[batch, patches]` summing to 1 (the soft
        maximum's gradient): the readout the explain tools follow."""
        t = jnp.exp(self.log_temperature[...])
        return jax.nn.softmax(self.scores(patches, text_pooled) / t, axis=-1)

    def __call__(self, patches: jax.Array, text_pooled: jax.Array) -> jax.Array:
        s = self.scores(patches, text_pooled)
        t = jnp.exp(self.log_temperature[...])
        soft_max = jax.nn.logsumexp(s / t, axis=-1) - jnp.log(s.shape[-1])
        return (t * soft_max).astype(jnp.float32)


class PlacedPromptHead(PatchPromptHead):
    """`PatchPromptHead` plus a score for where each patch lies:
    `s_i = w . LN(p_i) + <U LN(p_i), V LN(txt)> / sqrt(d) + <e_i, P LN(txt)> / sqrt(d)`,
    with a learned vector `e_i` per patch position.

    The text then scores what lies on a patch and where the patch is, added: "a bag on the
    left" is high only on a patch that holds a bag and lies on the left. The place gets its own
    text projection `P`: a region word is a small part of the pooled prompt, and sharing `V`
    with what the patch holds leaves it too small to move the answer. `e_i` start at unit scale
    so the place term has gradients of the content term's size from the first step.
    Parameters: `position [patches, width]` (the model's own grid), `place [width, width]`."""

    def __init__(self, width: int, cfg: ViTConfig, rngs: nnx.Rngs):
        super().__init__(width, cfg, rngs)
        n = cfg.grid[0] * cfg.grid[1]
        self.position = nnx.Param(jax.random.normal(rngs.params(), (n, width)))
        self.place = nnx.Linear(width, width, use_bias=False, dtype=jnp.float32,
                                kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)

    def scores(self, patches: jax.Array, text_pooled: jax.Array) -> jax.Array:
        if patches.shape[1] != self.position.shape[0]:
            raise ValueError(f"the placed prompt head knows {self.position.shape[0]} patch "
                             f"positions; these images have {patches.shape[1]} patches (give "
                             "images of the model's own size)")
        content = super().scores(patches, text_pooled)
        place = self.place(self.text_norm(text_pooled).astype(jnp.float32))
        where = jnp.einsum("nd,bd->bn", self.position[...], place)
        return content + where / jnp.sqrt(patches.shape[-1])


class ThingsPromptHead(PlacedPromptHead):
    """`PlacedPromptHead` once per thing the prompt names, then a soft minimum over the things:
    `answer = -u * (logsumexp(-f_k / u) - log K)`, `f_k` the placed head's soft maximum over
    patches for the text of thing `k` (`TextPath.head_text`: `[batch, K, width]`) and `u` a
    learned temperature.

    "a bag and a shirt" must then find the bag on some patch *and* the shirt on some patch; a
    single query scored per patch finds either one and says yes when only one is there. For a
    prompt naming one thing the `K` texts read the same words and the soft minimum is their
    common score."""

    def __init__(self, width: int, cfg: ViTConfig, rngs: nnx.Rngs):
        super().__init__(width, cfg, rngs)
        self.log_min_temperature = nnx.Param(jnp.zeros((), jnp.float32))

    def thing_scores(self, patches: jax.Array, things: jax.Array) -> jax.Array:
        """`[batch, patches, width]`, `[batch, K, width]` -> `[batch, K, patches]`."""
        return jax.vmap(lambda t: PlacedPromptHead.scores(self, patches, t), in_axes=1,
                        out_axes=1)(things)

    def _found(self, patches: jax.Array, things: jax.Array):
        """Each thing's per-patch scores and its soft maximum over the patches."""
        s = self.thing_scores(patches, things)
        t = jnp.exp(self.log_temperature[...])
        return s, t * (jax.nn.logsumexp(s / t, axis=-1) - jnp.log(s.shape[-1]))

    def weights(self, patches: jax.Array, things: jax.Array) -> jax.Array:
        """`d answer / d score` of each patch, summed over the things: each thing's weight in
        the soft minimum times its soft-maximum weights over the patches (sums to 1)."""
        s, found = self._found(patches, things)
        u = jnp.exp(self.log_min_temperature[...])
        per_thing = jax.nn.softmax(-found / u, axis=-1)
        per_patch = jax.nn.softmax(s / jnp.exp(self.log_temperature[...]), axis=-1)
        return jnp.einsum("bk,bkn->bn", per_thing, per_patch)

    def __call__(self, patches: jax.Array, things: jax.Array) -> jax.Array:
        _, found = self._found(patches, things)
        u = jnp.exp(self.log_min_temperature[...])
        soft_min = -u * (jax.nn.logsumexp(-found / u, axis=-1) - jnp.log(found.shape[-1]))
        return soft_min.astype(jnp.float32)


class SimilarityHead(nnx.Module):
    """SigLIP-style image-text similarity: `exp(t) * cos(img, txt) + b`, trained with a sigmoid
    loss over every image-text pair of a batch; text written as prompts gives zero-shot labels."""

    def __init__(self, image_width: int, text_width: int, dim: int, rngs: nnx.Rngs):
        self.image = nnx.Linear(image_width, dim, kernel_init=nnx.initializers.xavier_uniform(),
                                rngs=rngs)
        self.text = nnx.Linear(text_width, dim, kernel_init=nnx.initializers.xavier_uniform(),
                               rngs=rngs)
        self.log_scale = nnx.Param(jnp.log(10.0) * jnp.ones((), jnp.float32))  # SigLIP's init
        self.bias = nnx.Param(-10.0 * jnp.ones((), jnp.float32))

    def embed_image(self, pooled: jax.Array) -> jax.Array:
        return _unit(self.image(pooled.astype(jnp.float32)))

    def embed_text(self, pooled: jax.Array) -> jax.Array:
        return _unit(self.text(pooled.astype(jnp.float32)))

    def logits(self, image_emb: jax.Array, text_emb: jax.Array) -> jax.Array:
        """`[images, dim] x [texts, dim] -> [images, texts]` float32 logits."""
        return jnp.exp(self.log_scale[...]) * image_emb @ text_emb.T + self.bias[...]


def _unit(x: jax.Array) -> jax.Array:
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)
