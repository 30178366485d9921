"""The Transformer building blocks shared by the image encoder, the text encoder and the
cross-attention blocks: pre-norm self-attention blocks, MLPs, LayerNorm and dropout helpers.

Parameter layout follows timm (fused `qkv`, `proj`, `fc1`/`fc2`, `norm1`/`norm2`). Parameters
are float32; matmuls run in `config.dtype`; LayerNorm and softmax run in float32.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from vit.cpu import features
from vit.models import diff_attention
from vit.models.config import ViTConfig
from vit.models.norms import make_norm
from vit.models.relpos import RelativePositionBias
from vit.ops import matmul
from vit.ops.attention import dot_product_attention, preferred_layout, reference_attention

xavier = nnx.initializers.xavier_uniform()


# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (Eigen's `generic_fast_erf_float`; |erf| is 1 to
# float32 precision beyond 4). Highest power first.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)


def _erf(x: jax.Array) -> jax.Array:
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p, q = _ERF_P[0], _ERF_Q[0]
    for c in _ERF_P[1:]:
        p = p * x2 + c
    for c in _ERF_Q[1:]:
        q = q * x2 + c
    return x * p / q


@jax.custom_jvp
def _gelu_exact(x: jax.Array) -> jax.Array:
    return 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))


@_gelu_exact.defjvp
def _gelu_exact_jvp(primals, tangents):
    # GELU's own derivative, cdf(x) + x pdf(x), rather than the rational erf's differentiated
    # term by term: one erf and one exp where autodiff left XLA several passes of the
    # polynomials in the backward, and within 2.1e-7 of float64's derivative (the
    # term-by-term one is off by up to 6.8e-6).
    (x,), (dx,) = primals, tangents
    cdf = 0.5 * (1.0 + _erf(x * 0.7071067811865476))
    pdf = jnp.exp(-0.5 * x * x) * 0.3989422804014327
    return x * cdf, dx * (cdf + x * pdf)


def activation(kind: str) -> Callable[[jax.Array], jax.Array]:
    """The MLP's activation by timm's `act_layer` name (vit.models.config.ACT_LAYERS)."""
    if kind == "gelu_tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    if kind == "quick_gelu":  # OpenAI CLIP's
        return lambda x: x * jax.nn.sigmoid(1.702 * x)
    if kind == "silu":
        return jax.nn.silu
    # Exact GELU, x (1 + erf(x / sqrt 2)) / 2, with erf as one rational function: no exp and no
    # branches, so XLA fuses it into the fc1 bias pass more cheaply than jax.nn.gelu or ndtr;
    # within 1.1e-6 of float64. bfloat16/float16 activations go through float32 and back in the
    # same pass.
    def exact(x):
        if x.dtype == jnp.float64:  # the rational erf is a float32 approximation
            return jax.nn.gelu(x, approximate=False)
        return _gelu_exact(x.astype(jnp.float32)).astype(x.dtype)

    return exact


def layer_norm(dim: int, cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=cfg.layer_norm_eps, dtype=jnp.float32, rngs=rngs)


class Linear(nnx.Linear):
    """`nnx.Linear` (same parameters, same names) whose product in a narrow compute dtype goes
    through `vit.ops.matmul.dense`: on CPUs, bfloat16 inputs with float32 accumulation and
    output, rounded once after the bias; float32 weight gradients."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        if self.dtype is None or jnp.dtype(self.dtype) not in matmul.NARROW:
            return super().__call__(inputs, out_sharding=out_sharding)
        bias = self.bias[...] if self.bias is not None else None
        return matmul.dense(inputs, self.kernel[...], bias, self.dtype)


def dense(din: int, dout: int, cfg: ViTConfig, rngs: nnx.Rngs, *, bias: bool = True,
           kernel_init=xavier) -> nnx.Linear:
    return Linear(din, dout, use_bias=bias, dtype=jnp.dtype(cfg.dtype),
                  kernel_init=kernel_init, rngs=rngs)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    if rate == 0.0 or rng is None:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def drop_path(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
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
    """timm's `Mlp`: fc1 -> act -> [norm] -> fc2. `norm` (scale_mlp_norm) normalises the hidden
    activations before fc2; `bias` is both linears' (timm's `proj_bias`)."""

    def __init__(self, width: int, hidden: int, cfg: ViTConfig, rngs: nnx.Rngs, *,
                 bias: bool = True, norm: bool = False):
        self.fc1 = _mlp_linear(width, hidden, bias, cfg, rngs)
        self.fc2 = _mlp_linear(hidden, width, bias, cfg, rngs)
        self.norm = make_norm(hidden, cfg, rngs) if norm else None
        self.act = activation(cfg.act_layer)
        self.rate = cfg.dropout

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        x = dropout(self.act(self.fc1(x)), self.rate, keys(0))
        if self.norm is not None:
            x = self.norm(x).astype(self.fc2.dtype)
        return dropout(self.fc2(x), self.rate, keys(1))


class SwiGLU(nnx.Module):
    """timm's `SwiGLU`: `act(fc1_g x) * fc1_x x` -> [norm] -> fc2, two `hidden`-wide inputs."""

    def __init__(self, width: int, hidden: int, cfg: ViTConfig, rngs: nnx.Rngs, *,
                 bias: bool = True, norm: bool = False):
        self.fc1_g = _mlp_linear(width, hidden, bias, cfg, rngs)
        self.fc1_x = _mlp_linear(width, hidden, bias, cfg, rngs)
        self.fc2 = _mlp_linear(hidden, width, bias, cfg, rngs)
        self.norm = make_norm(hidden, cfg, rngs) if norm else None
        self.act = activation(cfg.act_layer)
        self.rate = cfg.dropout

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        x = dropout(self.act(self.fc1_g(x)) * self.fc1_x(x), self.rate, keys(0))
        if self.norm is not None:
            x = self.norm(x).astype(self.fc2.dtype)
        return dropout(self.fc2(x), self.rate, keys(1))


class GluMlp(nnx.Module):
    """timm's `GluMlp` with `gate_last=False`: fc1's `hidden` outputs split in halves
    (x1, x2), `act(x1) * x2` -> [norm] -> fc2 from `hidden // 2`."""

    def __init__(self, width: int, hidden: int, cfg: ViTConfig, rngs: nnx.Rngs, *,
                 bias: bool = True, norm: bool = False):
        self.fc1 = _mlp_linear(width, hidden, bias, cfg, rngs)
        self.fc2 = _mlp_linear(hidden // 2, width, bias, cfg, rngs)
        self.norm = make_norm(hidden // 2, cfg, rngs) if norm else None
        self.act = activation(cfg.act_layer)
        self.rate = cfg.dropout

    def __call__(self, x: jax.Array, keys: Keys) -> jax.Array:
        x1, x2 = jnp.split(self.fc1(x), 2, axis=-1)
        x = dropout(self.act(x1) * x2, self.rate, keys(0))
        if self.norm is not None:
            x = self.norm(x).astype(self.fc2.dtype)
        return dropout(self.fc2(x), self.rate, keys(1))


MLPS = {"mlp": Mlp, "swiglu": SwiGLU, "glu": GluMlp}


def make_mlp(cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.Module:
    """An encoder block's MLP: the config's `mlp_layer`, `proj_bias` and `scale_mlp_norm`."""
    return MLPS[cfg.mlp_layer](cfg.width, cfg.mlp_dim, cfg, rngs, bias=cfg.proj_bias,
                               norm=cfg.scale_mlp_norm)


def _mlp_linear(din: int, dout: int, bias: bool, cfg: ViTConfig, rngs: nnx.Rngs) -> Linear:
    return Linear(din, dout, use_bias=bias, dtype=jnp.dtype(cfg.dtype), kernel_init=xavier,
                  bias_init=nnx.initializers.normal(1e-6), rngs=rngs)


def hooked_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_len: jax.Array | None,
                     probs_hook: Callable[[jax.Array], jax.Array],
                     layout: str = "bshd", bias: jax.Array | None = None) -> jax.Array:
    """Explain mode: the probabilities materialised, seen (or perturbed) by `probs_hook`, then
    applied to `v`. `bias`: added to the logits (a relative position bias)."""
    _, probs = reference_attention(q, k, v, kv_len=kv_len, return_probs=True, layout=layout,
                                   bias=bias)
    probs = probs_hook(probs)
    spec = "bhqk,bkhd->bqhd" if layout == "bshd" else "bhqk,bhkd->bhqd"
    return matmul.narrow_einsum(spec, probs, v, v.dtype)


class Attention(nnx.Module):
    """Multi-head self-attention through `vit.ops.attention` (timm's `Attention`).

    Options from the config: `qk_norm` (norms of q and k over head_dim), `scale_attn_norm` (a
    norm over the merged heads before `proj`), `proj_bias`, BEiT's per-layer relative position
    bias (`rel_pos_bias="layer"`) and differential attention (`attn_layer="diff"`, whose lambda
    depends on the block's `depth`; vit/models/diff_attention.py). Attention with a bias, and
    differential attention, run the XLA reference path.
    """

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs, depth: int = 0):
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = dense(cfg.width, 3 * cfg.width, cfg, rngs, bias=cfg.qkv_bias)
        self.proj = dense(cfg.width, cfg.width, cfg, rngs, bias=cfg.proj_bias)
        self.diff = cfg.attn_layer == "diff"
        qk_dim = cfg.head_dim // 2 if self.diff else cfg.head_dim  # diff: half-width q and k
        if cfg.qk_norm:
            self.q_norm = make_norm(qk_dim, cfg, rngs)
            self.k_norm = make_norm(qk_dim, cfg, rngs)
        else:
            self.q_norm = self.k_norm = None
        self.norm = make_norm(cfg.width, cfg, rngs) if cfg.scale_attn_norm else None
        self.rel_pos_bias = (RelativePositionBias(cfg.grid, cfg.num_heads)
                             if cfg.rel_pos_bias == "layer" else None)
        if self.diff:
            diff_attention.add_parameters(self, cfg.head_dim, depth, rngs)
        self.impl, self.attn_rate = cfg.attention_impl, cfg.attention_dropout

    def __call__(self, x: jax.Array, keys: Keys,
                 probs_hook: Callable[[jax.Array], jax.Array] | None = None,
                 kv_len: jax.Array | None = None, queries: int | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        """`queries`: only the first `queries` tokens ask (all tokens still give keys and
        values), so the output is `[batch, queries, width]`. `bias` (`[heads, tokens,
        tokens]`): a relative position bias shared by every block, added to the logits."""
        # The fused `qkv` kernel (timm's layout) is read as [width, 3, heads, head_dim] and q, k
        # and v are three products written straight in the layout attention wants: no copy
        # splits a fused output, and the backward adds three input gradients instead of
        # stitching one [tokens, 3 * width] gradient together. Inference in a narrow dtype on a
        # CPU with bfloat16 arithmetic is the exception (`_fused_qkv`); there the output
        # projection also runs over merged heads (`_merged_proj`), in training too.
        layout = preferred_layout()
        heads = "bhnd" if layout == "bhsd" else "bnhd"
        narrow_cpu = features.narrow_on_bfloat16_cpu(self.qkv.dtype)
        if narrow_cpu and queries is None and keys.rng is None:
            q, k, v = self._fused_qkv(x, layout)
        else:
            q, k, v = self._three_products(x, layout, heads, queries)
        if self.diff:
            if probs_hook is not None:
                raise ValueError("explain mode reads one softmax map per block; differential "
                                 "attention (attn_layer='diff') mixes the values by the "
                                 "difference of two")
            out = diff_attention.attend(self, q, k, v, layout, self.q_norm, self.k_norm,
                                        keys(0), self.attn_rate)
            return self._merged_proj(out, layout)
        if self.q_norm is not None:
            q, k = self.q_norm(q).astype(v.dtype), self.k_norm(k).astype(v.dtype)
        if bias is None and self.rel_pos_bias is not None:
            bias = self.rel_pos_bias()
        if bias is not None:
            if bias.shape[-1] != x.shape[1]:
                raise ValueError(f"{x.shape[1]} tokens, but the relative position bias was "
                                 f"learned for {bias.shape[-1]}; give images of the model's "
                                 "image_size")
            bias = bias[:, :queries]
        if probs_hook is not None:
            out = hooked_attention(q, k, v, kv_len, probs_hook, layout, bias)
        elif bias is not None:  # neither the kernel nor cuDNN takes a bias: the XLA path
            rng = keys(0)
            out = reference_attention(q, k, v, kv_len=kv_len, layout=layout, bias=bias,
                                      dropout_rate=self.attn_rate if rng is not None else 0.0,
                                      dropout_rng=rng)
        else:
            # A few queries against all keys leave nothing for a tiled kernel to do: XLA.
            impl = self.impl if queries is None else "xla"
            out = dot_product_attention(q, k, v, kv_len=kv_len, impl=impl,
                                        dropout_rate=self.attn_rate, dropout_rng=keys(0),
                                        layout=layout)
        if narrow_cpu or self.norm is not None:
            return self._merged_proj(out, layout)
        proj = self.proj.kernel[...].reshape(self.num_heads, self.head_dim, -1)
        proj_bias = self.proj.bias[...] if self.proj.bias is not None else None
        return matmul.einsum_dense(f"{heads},hdc->bnc", out, proj, proj_bias, self.proj.dtype)

    def _merged_proj(self, out, layout: str):
        """The output projection as a plain row-major product over merged heads, after the
        scale norm (`scale_attn_norm`, which needs the heads merged). Where YNNPACK runs it (a
        narrow dtype on a CPU with bfloat16 arithmetic), the per-head product copies the
        weight transposed on every call; merging the heads first spares that copy, in the
        forward and the training step alike. In float32 (XLA's dots) there is no such copy, so
        float32 without a scale norm keeps the per-head product."""
        if layout == "bhsd":
            out = jnp.swapaxes(out, 1, 2)
        out = out.reshape(*out.shape[:2], -1)
        if self.norm is not None:
            out = self.norm(out).astype(self.proj.dtype)
        bias = self.proj.bias[...] if self.proj.bias is not None else None
        return matmul.dense(out, self.proj.kernel[...], bias, self.proj.dtype)

    def _three_products(self, x, layout: str, heads: str, queries: int | None):
        """q, k and v as three products, each written in the layout attention wants."""
        kernel = self.qkv.kernel[...].reshape(x.shape[-1], 3, self.num_heads, self.head_dim)
        bias_shape = ((3, self.num_heads, 1, self.head_dim) if layout == "bhsd" else
                      (3, 1, self.num_heads, self.head_dim))
        bias = self.qkv.bias[...].reshape(bias_shape) if self.qkv.bias is not None else None

        def project(i, tokens):
            return matmul.einsum_dense(f"bnc,chd->{heads}", tokens, kernel[:, i],
                                       None if bias is None else bias[i], self.qkv.dtype)

        return project(0, x[:, :queries]), project(1, x), project(2, x)

    def _fused_qkv(self, x, layout: str):
        """q, k and v as one `[tokens, 3 * width]` product, split after. In a narrow dtype on
        a CPU with bfloat16 arithmetic the products run in YNNPACK, which takes a plain
        row-major product faster than one written in the heads layout (that one copies a
        transposed weight every call; benchmarks/ records the forward both ways). Inference
        only (no training key): in a training step the backward of the one product, whose
        [tokens, 3 * width] gradient is stitched from three, costs more than it saves."""
        qkv = matmul.dense(x, self.qkv.kernel[...],
                           self.qkv.bias[...] if self.qkv.bias is not None else None,
                           self.qkv.dtype)
        qkv = qkv.reshape(*x.shape[:2], 3, self.num_heads, self.head_dim)
        qkv = jnp.moveaxis(qkv, 2, 0)  # [3, b, n, h, d]
        if layout == "bhsd":
            qkv = jnp.swapaxes(qkv, 2, 3)
        return qkv[0], qkv[1], qkv[2]


class LayerScale(nnx.Module):
    def __init__(self, width: int, init: float):
        self.gamma = nnx.Param(jnp.full((width,), init, jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.gamma[...].astype(x.dtype)


class Block(nnx.Module):
    """Pre-norm transformer encoder block (timm's `Block`)."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs, depth: int = 0):
        self.norm1 = make_norm(cfg.width, cfg, rngs)
        self.attn = Attention(cfg, rngs, depth)
        self.norm2 = make_norm(cfg.width, cfg, rngs)
        self.mlp = make_mlp(cfg, rngs)
        self.ls1 = layer_scale(cfg)
        self.ls2 = layer_scale(cfg)
        self.drop_path, self.dropout = drop_path, cfg.dropout
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys, probs_hook=None,
                 kv_len: jax.Array | None = None, queries: int | None = None,
                 rel_pos_bias: jax.Array | None = None) -> jax.Array:
        """`kv_len` (`[batch]`) masks padded tokens as keys (the text encoder's padding).

        `queries` computes the outputs of the first `queries` tokens only, each attending to
        every token: all a class-token head reads of the last block. That skips most of the
        block's matmul work (all but the class token's queries); every other token's output
        would be thrown away. The values are the same up to float rounding (other matmul shapes).
        `rel_pos_bias`: the model's shared relative position bias (`rel_pos_bias="shared"`).
        """
        y = self.attn(self.norm1(x).astype(self.dtype), Keys(keys(0)), probs_hook, kv_len,
                      queries, rel_pos_bias)
        x = x[:, :queries]
        y = dropout(y, self.dropout, keys(1))
        y = self.ls1(y) if self.ls1 is not None else y
        x = x + drop_path(y, self.drop_path, keys(2))
        y = self.mlp(self.norm2(x).astype(self.dtype), Keys(keys(3)))
        y = self.ls2(y) if self.ls2 is not None else y
        return x + drop_path(y, self.drop_path, keys(4))


def layer_scale(cfg: ViTConfig) -> LayerScale | None:
    """A LayerScale of the config's initial value, or None without one."""
    return LayerScale(cfg.width, cfg.layer_scale) if cfg.layer_scale is not None else None
