"""The encoder block families a config's `block_fn` names, beside the pre-norm `Block`.

- `res_post` (timm's `ResPostBlock`): the norm after each branch, `x + norm1(attn(x))`, then
  `x + norm2(mlp(x))`; parameters `attn`, `norm1`, `mlp`, `norm2` (no layer scale).
- `parallel` (timm's `ParallelThingsBlock`): `num_parallel` pre-norm attentions summed into the
  residual, then `num_parallel` pre-norm MLPs: `x + sum_j ls(attn_j(norm_j x))`, then
  `x + sum_j ls(mlp_j(norm_j x))`; parameters `attns/{j}/{norm, attn, ls}` and
  `ffns/{j}/{norm, mlp, ls}`.

Every block takes `(x, keys, probs_hook, kv_len, queries, rel_pos_bias)` as `Block` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit.models.blocks import (
    Attention,
    Block,
    Keys,
    drop_path,
    dropout,
    layer_scale,
    make_mlp,
)
from vit.models.config import ViTConfig
from vit.models.norms import make_norm


class ResPostBlock(nnx.Module):
    """Post-norm block: each branch's output is normalised before it joins the residual."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs):
        self.attn = Attention(cfg, rngs)
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

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        self.norm = make_norm(cfg.width, cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.ls = layer_scale(cfg)


class MlpBranch(nnx.Module):
    """One of a parallel block's MLPs: norm -> MLP -> layer scale."""

    def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
        self.norm = make_norm(cfg.width, cfg, rngs)
        self.mlp = make_mlp(cfg, rngs)
        self.ls = layer_scale(cfg)


class ParallelBlock(nnx.Module):
    """`num_parallel` attentions side by side, then `num_parallel` MLPs side by side."""

    def __init__(self, cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs):
        self.attns = nnx.List([AttentionBranch(cfg, rngs) for _ in range(cfg.num_parallel)])
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


BLOCKS = {"block": Block, "res_post": ResPostBlock, "parallel": ParallelBlock}


def make_block(cfg: ViTConfig, drop_path: float, rngs: nnx.Rngs) -> nnx.Module:
    """An encoder block of the config's `block_fn`."""
    return BLOCKS[cfg.block_fn](cfg, drop_path, rngs)
