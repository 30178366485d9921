"""The Vision Transformer in Flax NNX.

Parameter layout follows timm (fused `qkv`, `proj`, `fc1`/`fc2`, `norm1`/`norm2`), which maps
one-to-one onto every checkpoint format we read. Parameters are float32; matmuls run in
`config.dtype`; LayerNorm and softmax run in float32.

Calling convention: `model(images)` is inference; `model(images, train=True, rng=key)` enables
dropout and stochastic depth, with all randomness from the explicit key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
from flax import nnx

from vit.models import posemb as posemb_lib
from vit.models.config import ViTConfig, get_config
from vit.ops.attention import dot_product_attention, reference_attention

xavier = nnx.initializers.xavier_uniform()
# Probability hook used by the explain tools: (layer_index, probs) -> probs.
ProbsHook = Callable[[int, jax.Array], jax.Array]


def _gelu(kind: str) -> Callable[[jax.Array], jax.Array]:
    if kind == "tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    # Exact GELU, x * Phi(x). In float32 it is written with ndtr: on XLA CPU 2.5x faster than
    # jax.nn.gelu's erf form (6 ms vs 15 ms per ViT-B/16 MLP activation at batch 8), same values
    # to 1e-7. ndtr takes float32/64 only, so other dtypes keep the erf form.
    def exact(x):
        if x.dtype in (jnp.float32, jnp.float64):
            return x * jax.scipy.special.ndtr(x)
        return jax.nn.gelu(x, approximate=False)

    return exact


def _layer_norm(dim: int, cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=cfg.layer_norm_eps, dtype=jnp.float32, rngs=rngs)


def _dense(din: int, dout: int, cfg: ViTConfig, rngs: nnx.Rngs, *, bias: bool = True,
           kernel_init=xavier) -> nnx.Linear:
    return nnx.Linear(din, dout, use_bias=bias, dtype=jnp.dtype(cfg.dtype),
                      kernel_init=kernel_init, rngs=rngs)


def _dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    if rate == 0.0 or rng is None:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _drop_path(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    # Stochastic depth: drop a whole residual branch per example.
    if rate == 0.0 or rng is None:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


class Keys:
    """Splits one key into named, per-use keys; hands out None when not training."""

    def __init__(self, rng: jax.Array | None):
        self.rng = rng

    def __call__(self, *tags: int) -> jax.Array | None:
        if self.rng is None:
            return None
        key = self.rng
        for tag in tags:
            key = jax.random.fold_in(key, tag)
        return key


class Mlp(nnx.Module):
    def __init__(self, width: int, hidden: int, cfg: ViTConfig, rngs: nnx.Rngs):
        bias_init = nnx.initializers.normal(1e-6)
        self.fc1 = nnx.Linear(width, hidden, dtype=jnp.dtype(cfg.dtype), kernel_init=xavier,
                              bias_init=bias_init, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, width, dtype=jnp.dtype(cfg.dtype), kernel_init=xavier,
                              bias_init=bias_init, rngs=rngs)
        self.act = _gelu(cfg.gelu)
        self.rate = cfg.dropout

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        x = _dropout(self.act(self.fc1(x)), self.rate, keys(0))
        return _dropout(self.fc2(x), self.rate, keys(1))


class Attention(nnx.Module):
    """Multi-head self-attention through `vit.ops.attention`."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = _dense(cfg.width, 3 * cfg.width, cfg, rngs, bias=cfg.qkv_bias)
        self.proj = _dense(cfg.width, cfg.width, cfg, rngs)
        if cfg.qk_norm:
            self.q_norm = _layer_norm(cfg.head_dim, cfg, rngs)
            self.k_norm = _layer_norm(cfg.head_dim, cfg, rngs)
        else:
            self.q_norm = self.k_norm = None
        self.impl, self.attn_rate = cfg.attention_impl, cfg.attention_dropout

    def __call__(self, x: jax.Array, keys: Keys,
                 probs_hook: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.q_norm is not None:
            q, k = self.q_norm(q).astype(v.dtype), self.k_norm(k).astype(v.dtype)
        if probs_hook is not None:
            # Explain mode: materialise the probabilities and let the hook see (or perturb) them.
            _, probs = reference_attention(q, k, v, return_probs=True)
            probs = probs_hook(probs)
            out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
        else:
            out = dot_product_attention(q, k, v, impl=self.impl, dropout_rate=self.attn_rate,
                                        dropout_rng=keys(0))
        return self.proj(out.reshape(b, n, -1))


class LayerScale(nnx.Module):
    def __init__(self, width: int, init: float):
        self.gamma = nnx.Param(jnp.full((width,), init, jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.gamma[...].astype(x.dtype)


class Block(nnx.Module):
    """Pre-norm transformer encoder block."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs):
        self.norm1 = _layer_norm(cfg.width, cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.norm2 = _layer_norm(cfg.width, cfg, rngs)
        self.mlp = Mlp(cfg.width, cfg.mlp_dim, cfg, rngs)
        scaled = cfg.layer_scale is not None
        self.ls1 = LayerScale(cfg.width, cfg.layer_scale) if scaled else None
        self.ls2 = LayerScale(cfg.width, cfg.layer_scale) if scaled else None
        self.drop_path, self.dropout = drop_path, cfg.dropout
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys, probs_hook=None) -> jax.Array:
        y = self.attn(self.norm1(x).astype(self.dtype), Keys(keys(0)), probs_hook)
        y = _dropout(y, self.dropout, keys(1))
        y = self.ls1(y) if self.ls1 is not None else y
        x = x + _drop_path(y, self.drop_path, keys(2))
        y = self.mlp(self.norm2(x).astype(self.dtype), Keys(keys(3)))
        y = self.ls2(y) if self.ls2 is not None else y
        return x + _drop_path(y, self.drop_path, keys(4))


class MAPHead(nnx.Module):
    """Multi-head attention pooling (big_vision's MAPHead, timm's AttentionPoolLatent)."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        d = cfg.width
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.probe = nnx.Param(xavier(rngs.params(), (1, 1, d), jnp.float32))
        self.q = _dense(d, d, cfg, rngs)
        self.kv = _dense(d, 2 * d, cfg, rngs)
        self.proj = _dense(d, d, cfg, rngs)
        self.norm = _layer_norm(d, cfg, rngs)
        self.mlp = Mlp(d, cfg.mlp_dim, cfg, rngs)
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        b, n, d = x.shape
        probe = jnp.broadcast_to(self.probe[...], (b, 1, d)).astype(self.dtype)
        q = self.q(probe).reshape(b, 1, self.num_heads, self.head_dim)
        kv = self.kv(x).reshape(b, n, 2, self.num_heads, self.head_dim)
        out = reference_attention(q, kv[:, :, 0], kv[:, :, 1])  # 1 query: nothing to tile
        x = self.proj(out.reshape(b, 1, d))
        x = x + self.mlp(self.norm(x).astype(self.dtype), keys)
        return x[:, 0]


class VisionTransformer(nnx.Module):
    """ViT: patch embedding, position embedding, encoder blocks, norm, pooling and head."""

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        cfg = self.config = config
        ph, pw = cfg.patch_size
        d = cfg.width
        self.dtype = jnp.dtype(cfg.dtype)
        # Patch embedding as a matmul on flattened (ph, pw, c) patches: the same maths as a
        # stride-p convolution with an HWIO kernel, and faster on CPU.
        self.patch_kernel = nnx.Param(
            nnx.initializers.lecun_normal()(rngs.params(), (ph * pw * cfg.in_channels, d))
            .reshape(ph, pw, cfg.in_channels, d))
        self.patch_bias = nnx.Param(jnp.zeros((d,), jnp.float32))
        self.cls_token = nnx.Param(jnp.zeros((1, 1, d), jnp.float32)) if cfg.class_token else None
        regs = 0.02 * jax.random.normal(rngs.params(), (1, cfg.num_registers, d))
        self.reg_tokens = nnx.Param(regs) if cfg.num_registers else None
        if cfg.posemb == "learn":
            # Rows: [class token (when present), grid]; registers carry no position.
            rows = int(cfg.class_token) + cfg.grid[0] * cfg.grid[1]
            self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, rows, d)))
        else:
            self.pos_embed = None
        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nnx.List([Block(cfg, rate, rngs) for rate in rates])
        self.norm = _layer_norm(d, cfg, rngs)
        self.map_head = MAPHead(cfg, rngs) if cfg.classifier == "map" else None
        if cfg.representation_size:
            self.pre_logits = _dense(d, cfg.representation_size, cfg, rngs)
            d = cfg.representation_size
        else:
            self.pre_logits = None
        # Zero-initialised head, as vit_jax and big_vision: fine-tuning starts from a neutral head.
        self.head = (nnx.Linear(d, cfg.num_classes, kernel_init=nnx.initializers.zeros,
                                dtype=self.dtype, rngs=rngs) if cfg.num_classes else None)

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
            pe = posemb_lib.resize_posemb(pe, cfg.grid, grid, int(cfg.class_token), "bicubic")
        return pe

    def embed(self, images: jax.Array, keys: Keys | None = None) -> jax.Array:
        """NHWC images -> `[batch, prefix + h*w, width]` tokens (class, registers, patches)."""
        cfg = self.config
        if images.ndim != 4 or images.shape[-1] != cfg.in_channels:
            raise ValueError(f"expected NHWC images with {cfg.in_channels} channels, "
                             f"got shape {tuple(images.shape)}")
        b, h, w, c = images.shape
        gh, gw = self.grid_for((h, w))
        ph, pw = cfg.patch_size
        patches = images.reshape(b, gh, ph, gw, pw, c).transpose(0, 1, 3, 2, 4, 5)
        patches = patches.reshape(b, gh * gw, ph * pw * c).astype(self.dtype)
        kernel = self.patch_kernel[...].reshape(ph * pw * c, -1).astype(self.dtype)
        x = patches @ kernel + self.patch_bias[...].astype(self.dtype)
        if self.cls_token is not None:
            cls = jnp.broadcast_to(self.cls_token[...].astype(self.dtype), (b, 1, cfg.width))
            x = jnp.concatenate([cls, x], axis=1)
        x = x + self._pos_embed((gh, gw)).astype(self.dtype)
        if self.reg_tokens is not None:
            regs = jnp.broadcast_to(self.reg_tokens[...].astype(self.dtype),
                                    (b, cfg.num_registers, cfg.width))
            n_cls = int(cfg.class_token)
            x = jnp.concatenate([x[:, :n_cls], regs, x[:, n_cls:]], axis=1)
        return _dropout(x, cfg.dropout, keys(0) if keys else None)

    def features(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 return_intermediates: bool = False, probs_hook: ProbsHook | None = None):
        """Final normalised tokens `[batch, tokens, width]`, as timm's `forward_features`.

        With `return_intermediates`, also the list of every block's (un-normalised) output,
        as timm's `forward_intermediates`.
        """
        keys = _keys_for(train, rng, self.config)
        x = self.embed(images, Keys(keys(0)))
        intermediates = []
        for i, block in enumerate(self.blocks):
            hook = (lambda p, i=i: probs_hook(i, p)) if probs_hook is not None else None
            if self.config.remat and hook is None:
                x = nnx.remat(lambda blk, x, k: blk(x, Keys(k)))(block, x, keys(1, i))
            else:
                x = block(x, Keys(keys(1, i)), hook)
            if return_intermediates:
                intermediates.append(x)
        x = self.norm(x).astype(self.dtype)
        return (x, intermediates) if return_intermediates else x

    def pool(self, tokens: jax.Array, *, train: bool = False,
             rng: jax.Array | None = None) -> jax.Array:
        """Tokens -> one vector per image, as the classifier type says."""
        cfg = self.config
        if cfg.classifier == "token":
            return tokens[:, 0]
        if cfg.classifier == "gap":
            return tokens[:, cfg.num_prefix_tokens:].astype(jnp.float32).mean(1).astype(self.dtype)
        return self.map_head(tokens, Keys(_keys_for(train, rng, cfg)(2)))

    def head_logits(self, pooled: jax.Array) -> jax.Array:
        """Pooled vector -> logits (float32); the pooled features when there is no head."""
        x = jnp.tanh(self.pre_logits(pooled)) if self.pre_logits is not None else pooled
        return (self.head(x) if self.head is not None else x).astype(jnp.float32)

    def __call__(self, images: jax.Array, *, train: bool = False,
                 rng: jax.Array | None = None) -> jax.Array:
        """NHWC float images -> float32 logits `[batch, num_classes]`."""
        tokens = self.features(images, train=train, rng=rng)
        return self.head_logits(self.pool(tokens, train=train, rng=rng))


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
        cfg = get_config(name, **overrides)
    return VisionTransformer(cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))
