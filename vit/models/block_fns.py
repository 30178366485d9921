"""The encoder block families a config's `block_fn` names, beside the pre-norm `Block`.

- `res_post` (timm's `ResPostBlock`): the norm after each branch, `x + norm1(attn(x))`, then
  `x + norm2(mlp(x))`; parameters `attn`, `norm1`, `mlp`, `norm2` (no layer scale).
- `parallel` (timm's `ParallelThingsBlock`): `num_parallel` pre-norm attentions summed into the
  residual, then `num_parallel` pre-norm MLPs: `x + sum_j ls(attn_j(norm_j x))`, then
  `x + sum_j ls(mlp_j(norm_j x))`; parameters `attns/{j}/{norm, attn, ls}` and
  `ffns/{j}/{norm, mlp, ls}`.
- `parallel_scaling` (timm's `ParallelScalingBlock`, ViT-22B): one norm and one input
  projection for the MLP's hidden layer and q, k, v together, attention and MLP side by side:
  `x + ls(attn_out_proj(attn(q, k, v)) + mlp_out_proj(act(h)))`; parameters `in_norm`,
  `in_proj` (rows: MLP hidden, q, k, v), `mlp_bias` (the MLP's when `in_proj` has no bias),
  `q_norm`, `k_norm`, `attn_out_proj`, `mlp_out_proj`, `ls`. With `attn_layer="diff"`
  (timm's `DiffParallelScalingBlock`): differential attention, its `lambda_*` and `sub_norm`,
  and one `out_proj` over the attention and MLP outputs side by side.

Every block takes `(x, keys, probs_hook, kv_len, queries, rel_pos_bias)` as `Block` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit.models import diff_attention
from vit.models.blocks import (
    Attention,
    Block,
    Keys,
    activation,
    dense,
    drop_path,
    dropout,
    hooked_attention,
    layer_scale,
    make_mlp,
)
from vit.models.config import ViTConfig
from vit.models.norms import make_norm
from vit.ops.attention import dot_product_attention


class ResPostBlock(nnx.Module):
    """Post-norm block: each branch's output is normalised before it joins the residual."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs, depth: int = 0):
        self.attn = Attention(cfg, rngs, depth)
        self.norm1 = make_norm(cfg.width, cfg, rngs)
        self.mlp = make_mlp(cfg, rngs)
        self.norm2 = make_norm(cfg.width, cfg, rngs)
        self.drop_path, self.dropout = drop_path, cfg.dropout
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys, probs_hook=None,
                 kv_len: jax.Array | None = None, queries: int | None = None,
                 rel_pos_bias: jax.Array | None = None) -> jax.Array:
        y = self.attn(x.astype(self.dtype), Keys(keys(0)), probs_hook, kv_len, queries,
                      rel_pos_bias)
        x = x[:, :queries]
        y = self.norm1(dropout(y, self.dropout, keys(1)))
        x = x + drop_path(y, self.drop_path, keys(2))
        y = self.norm2(self.mlp(x.astype(self.dtype), Keys(keys(3))))
        return x + drop_path(y, self.drop_path, keys(4))


class AttentionBranch(nnx.Module):
    """One of a parallel block's attentions: norm -> attention -> layer scale."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs, depth: int):
        self.norm = make_norm(cfg.width, cfg, rngs)
        self.attn = Attention(cfg, rngs, depth)
        self.ls = layer_scale(cfg)


class MlpBranch(nnx.Module):
    """One of a parallel block's MLPs: norm -> MLP -> layer scale."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        self.norm = make_norm(cfg.width, cfg, rngs)
        self.mlp = make_mlp(cfg, rngs)
        self.ls = layer_scale(cfg)


class ParallelBlock(nnx.Module):
    """`num_parallel` attentions side by side, then `num_parallel` MLPs side by side."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs, depth: int = 0):
        self.attns = nnx.List([AttentionBranch(cfg, rngs, depth)
                               for _ in range(cfg.num_parallel)])
        self.ffns = nnx.List([MlpBranch(cfg, rngs) for _ in range(cfg.num_parallel)])
        self.drop_path, self.dropout = drop_path, cfg.dropout
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys, probs_hook=None,
                 kv_len: jax.Array | None = None, queries: int | None = None,
                 rel_pos_bias: jax.Array | None = None) -> jax.Array:
        if probs_hook is not None and len(self.attns) > 1:
            raise ValueError(f"explain mode reads one attention per block; this parallel block "
                             f"has {len(self.attns)} side by side (block_fn='parallel', "
                             f"num_parallel={len(self.attns)}), whose probabilities do not "
                             "chain into one rollout")
        # As timm: the branches are summed first, then added to the residual.
        branches = []
        for j, branch in enumerate(self.attns):
            branch_keys = Keys(keys(0, j))
            y = branch.attn(branch.norm(x).astype(self.dtype), Keys(branch_keys(0)), probs_hook,
                            kv_len, queries, rel_pos_bias)
            y = dropout(y, self.dropout, branch_keys(1))
            y = branch.ls(y) if branch.ls is not None else y
            branches.append(drop_path(y, self.drop_path, branch_keys(2)).astype(x.dtype))
        x = x[:, :queries] + sum(branches[1:], branches[0])
        branches = []
        for j, branch in enumerate(self.ffns):
            branch_keys = Keys(keys(1, j))
            y = branch.mlp(branch.norm(x).astype(self.dtype), Keys(branch_keys(0)))
            y = branch.ls(y) if branch.ls is not None else y
            branches.append(drop_path(y, self.drop_path, branch_keys(1)).astype(x.dtype))
        return x + sum(branches[1:], branches[0])


class ParallelScalingBlock(nnx.Module):
    """ViT-22B's parallel block: the MLP's hidden layer and q, k, v from one projection of one
    norm, attention and MLP side by side, their outputs summed into the residual."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs, depth: int = 0):
        d, hidden = cfg.width, cfg.mlp_dim
        self.num_heads, self.head_dim, self.hidden = cfg.num_heads, cfg.head_dim, hidden
        self.in_norm = make_norm(d, cfg, rngs)
        self.in_proj = dense(d, hidden + 3 * d, cfg, rngs, bias=cfg.qkv_bias)
        # Without a bias on in_proj the MLP still has its own (timm's `mlp_bias`).
        self.mlp_bias = None if cfg.qkv_bias else nnx.Param(jnp.zeros((hidden,), jnp.float32))
        self.diff = cfg.attn_layer == "diff"
        qk_dim = cfg.head_dim // 2 if self.diff else cfg.head_dim
        self.q_norm = make_norm(qk_dim, cfg, rngs) if cfg.qk_norm else None
        self.k_norm = make_norm(qk_dim, cfg, rngs) if cfg.qk_norm else None
        if self.diff:  # one output projection over [attention, MLP]
            diff_attention.add_parameters(self, cfg.head_dim, depth, rngs)
            self.out_proj = dense(d + hidden, d, cfg, rngs, bias=cfg.proj_bias)
        else:
            self.attn_out_proj = dense(d, d, cfg, rngs, bias=cfg.proj_bias)
            self.mlp_out_proj = dense(hidden, d, cfg, rngs, bias=cfg.proj_bias)
        self.ls = layer_scale(cfg)
        self.act = activation(cfg.act_layer)
        self.drop_path, self.dropout, self.attn_rate = drop_path, cfg.dropout, \
            cfg.attention_dropout
        self.impl, self.dtype = cfg.attention_impl, jnp.dtype(cfg.dtype)

    def __call__(self, x: jax.Array, keys: Keys, probs_hook=None,
                 kv_len: jax.Array | None = None, queries: int | None = None,
                 rel_pos_bias: jax.Array | None = None) -> jax.Array:
        if probs_hook is not None and self.diff:
            raise ValueError("explain mode reads one softmax map per block; differential "
                             "attention (attn_layer='diff') mixes the values by the difference "
                             "of two")
        d = self.num_heads * self.head_dim
        y = self.in_proj(self.in_norm(x).astype(self.dtype))
        h, q, k, v = jnp.split(y, [self.hidden, self.hidden + d, self.hidden + 2 * d], axis=-1)
        h, q = h[:, :queries], q[:, :queries]
        if self.mlp_bias is not None:
            h = h + self.mlp_bias[...].astype(h.dtype)
        q, k, v = (t.reshape(*t.shape[:2], self.num_heads, self.head_dim) for t in (q, k, v))
        if self.diff:
            out = diff_attention.attend(self, q, k, v, "bshd", self.q_norm, self.k_norm,
                                        keys(0), self.attn_rate)
        else:
            if self.q_norm is not None:
                q, k = self.q_norm(q).astype(v.dtype), self.k_norm(k).astype(v.dtype)
            if probs_hook is not None:
                out = hooked_attention(q, k, v, kv_len, probs_hook)
            else:
                out = dot_product_attention(q, k, v, kv_len=kv_len,
                                            impl=self.impl if queries is None else "xla",
                                            dropout_rate=self.attn_rate, dropout_rng=keys(0))
        out = out.reshape(*out.shape[:2], d)
        h = dropout(self.act(h), self.dropout, keys(1))
        if self.diff:
            y = self.out_proj(jnp.concatenate([out, h.astype(out.dtype)], axis=-1))
        else:
            y = self.attn_out_proj(out) + self.mlp_out_proj(h)
        y = self.ls(y) if self.ls is not None else y
        return x[:, :queries] + drop_path(y, self.drop_path, keys(2))


BLOCKS = {"block": Block, "res_post": ResPostBlock, "parallel": ParallelBlock,
          "parallel_scaling": ParallelScalingBlock}


def make_block(cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs, depth: int = 0) -> nnx.Module:
    """An encoder block of the config's `block_fn`; `depth`, its index, sets differential
    attention's lambda_init."""
    return BLOCKS[cfg.block_fn](cfg, drop_path, rngs, depth)
