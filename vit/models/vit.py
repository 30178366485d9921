"""The Vision Transformer in Flax NNX.

Parameter layout follows timm (fused `qkv`, `proj`, `fc1`/`fc2`, `norm1`/`norm2`), which maps
one-to-one onto every checkpoint format we read. Parameters are float32; matmuls run in
`config.dtype`; norms, softmax and the residual stream (tokens between blocks) run in float32.

The parameter tree (a name is absent when its option is off):
- top level: `stem/{i}/{kernel, norm}` (`stem`, vit/models/stem.py), `patch_kernel [ph, pw, c, d]`
  (over the stem's map when there is one), `patch_bias` (`patch_bias`), `patch_norm`
  (`embed_norm`), `cls_token`, `dist_token`, `reg_tokens`, `pos_embed` (rows: class, dist,
  grid; registers carry no position), `norm_pre` (`pre_norm`), `rel_pos_bias/table`
  (`rel_pos_bias="shared"`), `blocks/{i}`, `norm` (`final_norm` without `fc_norm`),
  `fc_norm` (`final_norm` with `fc_norm`), `map_head`, `pre_logits`, `head`, `head_dist`
  (`dist_token` with `dist_head`), `patch_head` (`patch_classes`);
- a norm: LayerNorm `{scale, bias}`, RMSNorm `{scale}` (`norm_layer`);
- `block_fn="block"`: `norm1`, `attn/{qkv, proj, q_norm, k_norm, norm, rel_pos_bias/table}`
  (`qk_norm`, `scale_attn_norm`, `rel_pos_bias="layer"`), `ls1/gamma`, `norm2`, `mlp`, `ls2`;
  `mlp` is `{fc1, fc2, norm}` (`mlp_layer` "mlp" or "glu") or `{fc1_g, fc1_x, fc2, norm}`
  ("swiglu"), `norm` with `scale_mlp_norm`; linears `{kernel, bias}`, no bias in
  `attn/proj` and the MLP's linears with `proj_bias=False`, nor in `qkv` with
  `qkv_bias=False`;
- `block_fn="res_post"`: `attn`, `norm1`, `mlp`, `norm2`; `block_fn="parallel"`:
  `attns/{j}/{norm, attn, ls}`, `ffns/{j}/{norm, mlp, ls}`; `block_fn="parallel_scaling"`:
  `in_norm`, `in_proj`, `mlp_bias`, `q_norm`, `k_norm`, `attn_out_proj`, `mlp_out_proj` (or
  one `out_proj` with differential attention), `ls` (vit/models/block_fns.py);
- `attn_layer="diff"` adds `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2` and `sub_norm`
  beside the attention's projections (vit/models/diff_attention.py);
- `map_head`: `probe`, `q`, `kv`, `proj`, `norm`, `mlp/{fc1, fc2}` (always with biases).

Calling convention: `model(images)` is inference; `model(images, train=True, rng=key)` enables
dropout and stochastic depth, with all randomness from the explicit key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx

from vit.models import posemb as posemb_lib
from vit.models.block_fns import make_block
from vit.models.blocks import Keys, Mlp, dense, dropout, xavier
from vit.models.config import ViTConfig, variant_config
from vit.models.cross_attention import (
    CrossAttentionBlock,
    PatchPromptHead,
    PlacedPromptHead,
    PromptHead,
    SimilarityHead,
    ThingsPromptHead,
)
from vit.models.norms import make_norm
from vit.models.relpos import RelativePositionBias
from vit.models.stem import make_stem
from vit.models.text import PAD, TextPath
from vit.ops.attention import reference_attention

# Probability hook used by the explain tools: (layer_index, probs) -> probs.
ProbsHook = Callable[[int, jax.Array], jax.Array]


class MAPHead(nnx.Module):
    """Multi-head attention pooling (big_vision's MAPHead, timm's AttentionPoolLatent): the
    model's norm and activation, a plain MLP with biases whatever the blocks' MLP."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        d = cfg.width
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.probe = nnx.Param(xavier(rngs.params(), (1, 1, d), jnp.float32))
        self.q = dense(d, d, cfg, rngs)
        self.kv = dense(d, 2 * d, cfg, rngs)
        self.proj = dense(d, d, cfg, rngs)
        self.norm = make_norm(d, cfg, rngs)
        self.mlp = Mlp(d, cfg.mlp_dim, cfg, rngs)
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        b, _, d = x.shape
        probe = jnp.broadcast_to(self.probe[...], (b, 1, d)).astype(self.dtype)
        q = rearrange(self.q(probe), "b 1 (h d) -> b 1 h d", h=self.num_heads)
        k, v = rearrange(self.kv(x), "b n (two h d) -> two b n h d", two=2, h=self.num_heads)
        out = reference_attention(q, k, v)  # 1 query: nothing to tile
        x = self.proj(rearrange(out, "b 1 h d -> b 1 (h d)"))
        x = x + self.mlp(self.norm(x).astype(self.dtype), keys)
        return x[:, 0]


class VisionTransformer(nnx.Module):
    """ViT: patch embedding, position embedding, encoder blocks, norm, pooling and head."""

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        cfg = self.config = config
        d = cfg.width
        self.dtype = jnp.dtype(cfg.dtype)
        # Patch embedding as a matmul on flattened (ph, pw, c) patches: the same maths as a
        # stride-p convolution with an HWIO kernel, and faster on CPU.
        kh, kw, kc, _ = cfg.patch_kernel_shape  # (ph, pw, in_channels) without a stem
        self.patch_kernel = nnx.Param(
            nnx.initializers.lecun_normal()(rngs.params(), (kh * kw * kc, d))
            .reshape(kh, kw, kc, d))
        self.patch_bias = nnx.Param(jnp.zeros((d,), jnp.float32)) if cfg.patch_bias else None
        self.cls_token = nnx.Param(jnp.zeros((1, 1, d), jnp.float32)) if cfg.class_token else None
        regs = 0.02 * jax.random.normal(rngs.params(), (1, cfg.num_registers, d))
        self.reg_tokens = nnx.Param(regs) if cfg.num_registers else None
        if cfg.posemb == "learn":
            # Rows: [class token, dist token (when present), grid]; registers carry no position.
            rows = cfg.num_posemb_prefix + cfg.grid[0] * cfg.grid[1]
            self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, rows, d)))
        else:
            self.pos_embed = None
        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nnx.List([make_block(cfg, rate, rngs, i) for i, rate in enumerate(rates)])
        self.norm = make_norm(d, cfg, rngs) if cfg.final_norm and not cfg.fc_norm else None
        self.map_head = MAPHead(cfg, rngs) if cfg.classifier == "map" else None
        if cfg.classifier == "token_gap":  # the class token and the patch mean side by side
            d = 2 * cfg.width
        if cfg.representation_size:
            self.pre_logits = dense(d, cfg.representation_size, cfg, rngs)
            d = cfg.representation_size
        else:
            self.pre_logits = None
        # Zero-initialised head, as vit_jax and big_vision: fine-tuning starts from a neutral head.
        self.head = (nnx.Linear(d, cfg.num_classes, kernel_init=nnx.initializers.zeros,
                                dtype=self.dtype, rngs=rngs) if cfg.num_classes else None)
        # The options below are built after the standard layers, so that the standard model's
        # parameters are drawn from the same random streams whether or not they exist.
        w = cfg.width
        self.dist_token = nnx.Param(jnp.zeros((1, 1, w), jnp.float32)) if cfg.dist_token else None
        self.patch_norm = make_norm(w, cfg, rngs) if cfg.embed_norm else None
        self.norm_pre = make_norm(w, cfg, rngs) if cfg.pre_norm else None
        self.fc_norm = make_norm(w, cfg, rngs) if cfg.final_norm and cfg.fc_norm else None
        self.head_dist = (nnx.Linear(w, cfg.num_classes, kernel_init=nnx.initializers.zeros,
                                     dtype=self.dtype, rngs=rngs)
                          if cfg.dist_token and cfg.dist_head and cfg.num_classes else None)
        self.rel_pos_bias = (RelativePositionBias(cfg.grid, cfg.num_heads)
                             if cfg.rel_pos_bias == "shared" else None)
        self.stem = make_stem(cfg, rngs)
        # Zero-initialised as the head is; it reads each final patch token (`patch_logits`).
        self.patch_head = (nnx.Linear(w, cfg.patch_classes, kernel_init=nnx.initializers.zeros,
                                      dtype=self.dtype, rngs=rngs) if cfg.patch_classes else None)
        # Text conditioning lives in its own subtrees (built after, and apart from, the image
        # model's parameters), so a plain ViT checkpoint loads into a text model unchanged.
        if cfg.text is not None:
            self.text_path = TextPath(cfg, rngs)
            self.xattn = nnx.List([CrossAttentionBlock(cfg, rngs)
                                   for _ in cfg.text.xattn_layers(cfg.depth)])
            head = {"pooled": PromptHead, "patches": PatchPromptHead,
                    "placed": PlacedPromptHead, "things": ThingsPromptHead}[cfg.text.head]
            self.prompt_head = head(cfg.width, cfg, rngs)
            self.similarity = (SimilarityHead(cfg.width, cfg.width, cfg.text.similarity_dim, rngs)
                               if cfg.text.similarity_dim else None)
        else:
            self.text_path = self.xattn = self.prompt_head = self.similarity = None

    # -- token layout, used by the explain tools and loaders --------------------------------
    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_prefix_tokens

    def grid_for(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        ph, pw = self.config.patch_size
        if image_hw[0] % ph or image_hw[1] % pw:
            raise ValueError(f"image size {tuple(image_hw)} is not a multiple of the patch size "
                             f"{(ph, pw)}; resize or crop the images first")
        return image_hw[0] // ph, image_hw[1] // pw

    # -- forward pieces -------------------------------------------------------------------
    def _pos_embed(self, grid: tuple[int, int]) -> jax.Array:
        cfg = self.config
        if self.pos_embed is None:
            pe = posemb_lib.sincos_2d(grid, cfg.width)
            return pe if not cfg.class_token else jnp.pad(pe, ((0, 0), (1, 0), (0, 0)))
        pe = self.pos_embed[...]
        if grid != cfg.grid:
            if not cfg.dynamic_image_size:
                raise ValueError(
                    f"images give a {grid} patch grid but the model was built for {cfg.grid} "
                    f"(image_size={cfg.image_size}); resize the images, rebuild with that "
                    "image_size, or set dynamic_image_size=True")
            pe = posemb_lib.resize_posemb(pe, cfg.grid, grid, cfg.num_posemb_prefix,
                                         cfg.posemb_resize)
        return pe

    def embed(self, images: jax.Array, keys: Keys | None = None) -> jax.Array:
        """NHWC images -> `[batch, prefix + h*w, width]` tokens (class, dist, registers,
        patches), after `norm_pre` when the config has one."""
        cfg = self.config
        if images.ndim != 4 or images.shape[-1] != cfg.in_channels:
            raise ValueError(f"expected NHWC images with {cfg.in_channels} channels, "
                             f"got shape {tuple(images.shape)}")
        b, h, w, c = images.shape
        gh, gw = self.grid_for((h, w))
        ph, pw, _, _ = cfg.patch_kernel_shape
        if self.stem is not None:
            for conv in self.stem:
                images = conv(images)
        patches = rearrange(images, "b (gh ph) (gw pw) c -> b (gh gw) (ph pw c)", ph=ph, pw=pw)
        kernel = rearrange(self.patch_kernel[...], "ph pw c d -> (ph pw c) d")
        patches, kernel = patches.astype(self.dtype), kernel.astype(self.dtype)
        # The matmul runs in the compute dtype; the residual stream it starts stays float32
        # (each block adds its bfloat16 output to it), so rounding does not pile up with depth.
        x = jnp.matmul(patches, kernel, preferred_element_type=jnp.float32)
        if self.patch_bias is not None:
            x = x + self.patch_bias[...]
        if self.patch_norm is not None:
            x = self.patch_norm(x)
        prefix = [jnp.broadcast_to(t[...], (b, 1, cfg.width))
                  for t in (self.cls_token, self.dist_token) if t is not None]
        if prefix:
            x = jnp.concatenate([*prefix, x], axis=1)
        x = x + self._pos_embed((gh, gw)).astype(jnp.float32)
        if self.reg_tokens is not None:
            regs = jnp.broadcast_to(self.reg_tokens[...].astype(jnp.float32),
                                    (b, cfg.num_registers, cfg.width))
            n = len(prefix)
            x = jnp.concatenate([x[:, :n], regs, x[:, n:]], axis=1)
        x = dropout(x, cfg.dropout, keys(0) if keys else None)
        return self.norm_pre(x) if self.norm_pre is not None else x

    def features(self, images: jax.Array, *, text: jax.Array | None = None,
                 text_mask: jax.Array | None = None, train: bool = False,
                 rng: jax.Array | None = None, return_intermediates: bool = False,
                 probs_hook: ProbsHook | None = None, xattn_hook: ProbsHook | None = None,
                 encoded_text: tuple | None = None, head_tokens: int | None = None):
        """Final tokens `[batch, tokens, width]`, as timm's `forward_features`: normalised
        unless the config has no final norm or normalises after the pooling (`fc_norm`).

        With `text` (a text model only), cross-attention blocks condition the image tokens on
        it; several prompts per image (`text [batch, prompts, len]`) share the image tokens up
        to the first cross-attention block and give `[batch * prompts, tokens, width]`.
        `encoded_text` (what `encode_text` returns) replaces `text`/`text_mask`, so a caller that
        also needs the encoded text (the prompt head) encodes it once.
        With `return_intermediates`, also the list of every block's (un-normalised) output,
        as timm's `forward_intermediates`. `xattn_hook(j, probs)` sees cross-attention block
        j's image-to-text probabilities (explain mode).
        `head_tokens=n` returns only the first n tokens, computing the last self-attention block
        (and any block after it, all per-token) for those alone: what a class-token head needs.
        """
        keys = _keys_for(train, rng, self.config)
        x = self.embed(images, Keys(keys(0)))
        after = {}
        if text is not None or encoded_text is not None:
            txt, kv_len, prompts = encoded_text or self.encode_text(text, text_mask, keys)
            after = {i: j for j, i in enumerate(self.config.text.xattn_layers(len(self.blocks)))}
        intermediates = []
        last = len(self.blocks) - 1
        bias = self.shared_rel_pos_bias()
        for i, block in enumerate(self.blocks):
            hook = (lambda p, i=i: probs_hook(i, p)) if probs_hook is not None else None
            queries = head_tokens if i == last else None
            if self.config.remat and hook is None:
                x = nnx.remat(_block_call(queries))(block, x, keys(1, i), bias)
            else:
                x = block(x, Keys(keys(1, i)), hook, queries=queries, rel_pos_bias=bias)
            if i in after:
                if x.shape[0] != txt.shape[0]:  # the image prefix, computed once per prompt
                    x = jnp.repeat(x, prompts, axis=0)
                j = after[i]
                xhook = (lambda p, j=j: xattn_hook(j, p)) if xattn_hook is not None else None
                x = self.xattn[j](x, txt, kv_len, Keys(keys(4, i)), xhook)
            if return_intermediates:
                intermediates.append(x)
        x = self.final_norm(x)
        return (x, intermediates) if return_intermediates else x

    def final_norm(self, x: jax.Array) -> jax.Array:
        """The norm after the blocks (timm's `self.norm`), in the compute dtype; none with
        `final_norm=False` or `fc_norm=True` (that one follows the pooling)."""
        return (self.norm(x) if self.norm is not None else x).astype(self.dtype)

    def shared_rel_pos_bias(self) -> jax.Array | None:
        """`[heads, tokens, tokens]`: the relative position bias every block shares
        (`rel_pos_bias="shared"`), else None."""
        return self.rel_pos_bias() if self.rel_pos_bias is not None else None

    @property
    def _head_tokens(self) -> int | None:
        """How many leading tokens the pooling reads: the class (and distillation) token for
        a token head; None (all) for the others, which read the patches."""
        cfg = self.config
        return 1 + int(cfg.dist_token) if cfg.classifier == "token" else None

    @property
    def _dist_pooled(self) -> bool:
        """Whether pooling gives the class and distillation tokens side by side (DeiT's two
        heads, or their mean without a head)."""
        return self.config.dist_token and self.config.dist_head

    def pool(self, tokens: jax.Array, *, train: bool = False,
             rng: jax.Array | None = None) -> jax.Array:
        """Tokens -> one vector per image, as the classifier type says, then `fc_norm`.
        DeiT's two tokens (`dist_token` with `dist_head`) and `token_gap` give two vectors
        side by side, `[batch, 2 * width]`."""
        cfg = self.config
        if cfg.classifier == "token":
            x = (jnp.concatenate([tokens[:, 0], tokens[:, 1]], -1) if self._dist_pooled
                 else tokens[:, 0])
        elif cfg.classifier in ("gap", "token_gap"):
            x = self.pooled_tokens(tokens).astype(jnp.float32).mean(1).astype(self.dtype)
            if cfg.classifier == "token_gap":
                x = jnp.concatenate([tokens[:, 0], x], -1)
        else:
            x = self.map_head(self.pooled_tokens(tokens), Keys(_keys_for(train, rng, cfg)(2)))
        return self.fc_norm(x).astype(self.dtype) if self.fc_norm is not None else x

    def pooled_tokens(self, tokens: jax.Array) -> jax.Array:
        """The tokens 'gap' and 'map' pool: every token, or the patches alone
        (`pool_include_prefix`)."""
        cfg = self.config
        return tokens if cfg.pools_prefix else tokens[:, cfg.num_prefix_tokens:]

    def head_logits(self, pooled: jax.Array) -> jax.Array:
        """Pooled vector -> logits (float32); the pooled features when there is no head.
        DeiT's two heads are averaged, as are its two tokens without a head."""
        if self._dist_pooled:
            x, x_dist = jnp.split(pooled, 2, axis=-1)
            if self.head is None:
                return ((x + x_dist) / 2).astype(jnp.float32)
            return ((self.head(x) + self.head_dist(x_dist)) / 2).astype(jnp.float32)
        x = jnp.tanh(self.pre_logits(pooled)) if self.pre_logits is not None else pooled
        return (self.head(x) if self.head is not None else x).astype(jnp.float32)

    def __call__(self, images: jax.Array, *, text: jax.Array | None = None,
                 text_mask: jax.Array | None = None, train: bool = False,
                 rng: jax.Array | None = None, with_patches: bool = False):
        """NHWC float images -> float32 logits `[batch, num_classes]`; with `with_patches`,
        `(logits, patch_logits [batch, patches, patch_classes])` (`patch_logits`).

        On a text model, `model(images, text=tokens, text_mask=mask)` gives instead the
        prompt-match logit of each (image, prompt): `[batch]`, or `[batch, prompts]` for
        `text [batch, prompts, len]`; sigmoid gives the probability the prompt is true.
        Without text a text model is the plain ViT (its cross-attention is skipped).
        """
        if text is not None:
            return self.prompt_logits(images, text, text_mask, train=train, rng=rng)
        if with_patches:
            tokens = self.features(images, train=train, rng=rng)
            return (self.head_logits(self.pool(tokens, train=train, rng=rng)),
                    self.patch_logits(tokens))
        tokens = self.features(images, train=train, rng=rng, head_tokens=self._head_tokens)
        return self.head_logits(self.pool(tokens, train=train, rng=rng))

    def patch_logits(self, tokens: jax.Array) -> jax.Array:
        """Final tokens -> `[batch, patches, patch_classes]` float32: the per-patch readout
        (`patch_classes`), what the model says lies on each patch."""
        if self.patch_head is None:
            raise ValueError("this model has no per-patch readout; build it with "
                             "patch_classes > 0")
        return self.patch_head(tokens[:, self.num_prefix_tokens:]).astype(jnp.float32)

    # -- text conditioning -----------------------------------------------------------------
    def _flat_prompts(self, text, text_mask):
        """Checks text against the model; flattens `[batch, prompts, ...]` to one batch axis."""
        if self.text_path is None:
            raise ValueError("this model has no text path; build it with a text config "
                             "(ViTConfig.text) to pass text")
        ids = self.config.text.source == "bytes"
        if text_mask is None:
            if not ids:
                raise ValueError("text embeddings need a text_mask [batch, len]")
            text_mask = text != PAD
        prompts = None
        if text.ndim == (3 if ids else 4):
            prompts = text.shape[1]
            text = text.reshape(-1, *text.shape[2:])
            text_mask = text_mask.reshape(-1, text_mask.shape[-1])
        return text, text_mask, prompts

    def encode_text(self, text, text_mask=None, keys: Keys | None = None,
                    text_hook: ProbsHook | None = None):
        """(text tokens `[n, 1 + len, width]` with the null token first, `kv_len [n]`, prompts
        per image or None); `[batch, prompts, ...]` text is flattened to one batch axis.
        `text_hook(layer, probs)` sees the text encoder's self-attention (explain mode)."""
        text, text_mask, prompts = self._flat_prompts(text, text_mask)
        txt, kv_len = self.text_path(text, text_mask, Keys(keys(3) if keys else None),
                                     text_hook)
        return txt, kv_len, prompts

    def prompt_logits(self, images, text, text_mask=None, *, train=False, rng=None):
        """`[batch]` (or `[batch, prompts]`) logits that each prompt is true of its image."""
        if self.prompt_head is None:
            raise ValueError("this model has no text path, so no prompt head")
        encoded = self.encode_text(text, text_mask, _keys_for(train, rng, self.config))
        tokens = self.features(images, encoded_text=encoded, train=train, rng=rng)
        logits = self.answer(tokens, encoded, train=train, rng=rng)
        return logits.reshape(images.shape[0], -1) if logits.shape[0] != images.shape[0] \
            else logits

    def answer_prompts(self, images, text, text_mask=None, *, train=False, rng=None):
        """`[batch, prompts]` logits of every image against every one of `text [prompts, len]`
        (token ids; `[prompts, len, dim]` embeddings), the same prompts for every image.

        Each prompt is encoded once (not once per image, as `text [batch, prompts, len]` would
        be) and its encoding shared by every image; the image tokens before the first
        cross-attention block are shared by every prompt. Equal to `model(images, text=...)`
        with the prompts broadcast over the batch."""
        if self.prompt_head is None:
            raise ValueError("this model has no text path, so no prompt head")
        keys = _keys_for(train, rng, self.config)
        txt, kv_len, _ = self.encode_text(text, text_mask, keys)
        b, p = images.shape[0], txt.shape[0]
        head_text = self.text_path.head_text(txt, kv_len)
        head_text = jnp.tile(head_text, (b,) + (1,) * (head_text.ndim - 1))
        encoded = (jnp.tile(txt, (b, 1, 1)), jnp.tile(kv_len, b), p)  # image-major, as features
        tokens = self.features(images, encoded_text=encoded, train=train, rng=rng)
        logits = self.answer(tokens, encoded, train=train, rng=rng, head_text=head_text)
        return logits.reshape(b, p)

    def answer(self, tokens, encoded, *, train=False, rng=None, head_text=None):
        """Text-conditioned final tokens and the `encode_text` output -> `[n]` prompt logits,
        by the prompt head the config names (`text.head`): the pooled image, or every patch
        scored and soft-maximised (per named thing, for "things"). `head_text` is what the head
        reads of the text (default `TextPath.head_text` of `encoded`). The forward pass and the
        explain tools both answer here."""
        if head_text is None:
            head_text = self.text_path.head_text(*encoded[:2])
        if self.config.text.head != "pooled":
            return self.prompt_head(tokens[:, self.num_prefix_tokens:], head_text)
        return self.prompt_head(self.pool(tokens, train=train, rng=rng), head_text)

    def answer_readout(self, tokens, encoded) -> jax.Array | None:
        """`[n, tokens]`: how much each final token counts in `answer` when the head weighs
        patches by their own scores (`text.head` "patches", "placed" or "things"); None when
        the readout is fixed by the pooling (class token, patch mean, MAP weights)."""
        if self.config.text.head == "pooled":
            return None
        weights = self.prompt_head.weights(tokens[:, self.num_prefix_tokens:],
                                           self.text_path.head_text(*encoded[:2]))
        return jnp.pad(weights, ((0, 0), (self.num_prefix_tokens, 0)))

    def image_embedding(self, images: jax.Array) -> jax.Array:
        """Unit image embeddings `[batch, dim]` of the similarity head (no text involved)."""
        if self.similarity is None:
            raise ValueError("this model has no similarity head (text.similarity_dim is 0)")
        tokens = self.features(images, head_tokens=self._head_tokens)
        return self.similarity.embed_image(self.pool(tokens))

    def text_embedding(self, text: jax.Array, text_mask: jax.Array | None = None) -> jax.Array:
        """Unit text embeddings `[texts, dim]` of the similarity head."""
        if self.similarity is None:
            raise ValueError("this model has no similarity head (text.similarity_dim is 0)")
        tokens, kv_len, _ = self.encode_text(text, text_mask)
        return self.similarity.embed_text(self.text_path.pooled(tokens, kv_len))


def _block_call(queries: int | None):
    """`(block, x, key, bias) -> x` for nnx.remat, with `queries` closed over (remat would
    trace an argument, and the number of queries must stay a Python int)."""
    return lambda block, x, key, bias: block(x, Keys(key), queries=queries, rel_pos_bias=bias)


def _keys_for(train: bool, rng: jax.Array | None, cfg: ViTConfig) -> Keys:
    stochastic = cfg.dropout or cfg.attention_dropout or cfg.drop_path
    if train and stochastic and rng is None:
        raise ValueError("train=True with dropout or drop_path needs a key: model(x, train=True, "
                         "rng=jax.random.key(step))")
    return Keys(rng if train else None)


def create_model(name: str | ViTConfig = "vit_b16", *, num_classes: int | None = None,
                 image_size: int | tuple[int, int] | None = None, rngs: nnx.Rngs | None = None,
                 **overrides: Any) -> VisionTransformer:
    """Builds a ViT by variant name ("vit_b16", "B/16", "vit_base_patch16_224") or config.

    `num_classes` defaults to 1000 and `image_size` to 224 (or the size a timm name carries);
    with a `ViTConfig` they default to its own. `num_classes=0` gives a head-less backbone whose
    call returns pooled features. Any `ViTConfig` field can be overridden by keyword.
    """
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    if image_size is not None:
        overrides["image_size"] = image_size
    if isinstance(name, ViTConfig):
        cfg = name.replace(**overrides)
    else:
        cfg = variant_config(name, **overrides)
    return VisionTransformer(cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))
