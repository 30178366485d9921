"""Size and cost of a model: parameters (from abstract shapes) and multiply-adds per image.

MACs are counted as timm and fvcore report them: every matmul's multiply-adds, attention's two
token-by-token products included; norms, softmax, activations and additions are not counted.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from vit.models.config import ViTConfig
from vit.models.vit import create_model


def count_params(config: ViTConfig) -> int:
    """Parameter count without allocating any weights."""
    abstract = nnx.eval_shape(lambda: create_model(config))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    return int(sum(np.prod(leaf.shape) for leaf in leaves))


def count_macs(config: ViTConfig) -> int:
    """Multiply-adds for one image at the config's image size."""
    c = config
    patches = c.grid[0] * c.grid[1]
    n, d, h = c.num_tokens, c.width, c.mlp_dim
    kh, kw, kc, _ = c.patch_kernel_shape
    macs = patches * kh * kw * kc * d
    side, channels = c.image_size, c.in_channels
    for out in c.stem:  # each 3x3 stride-2 convolution, at its output's size
        side = (side[0] // 2, side[1] // 2)
        macs += side[0] * side[1] * 9 * channels * out
        channels = out
    attention = n * d * 3 * d + 2 * n * n * d + n * d * d
    if c.attn_layer == "diff":  # two maps from half-width queries and keys, each mixing v
        attention += n * n * d
    mlp = {"mlp": 2 * n * d * h, "swiglu": 3 * n * d * h,
           "glu": n * d * h + n * (h // 2) * d}[c.mlp_layer]
    branches = c.num_parallel if c.block_fn == "parallel" else 1
    macs += c.depth * branches * (attention + mlp)
    if c.classifier == "map":
        pooled = n if c.pools_prefix else patches
        macs += d * d + pooled * d * 2 * d + 2 * pooled * d + d * d + 2 * d * h
    head_in = 2 * d if c.classifier == "token_gap" else d
    if c.representation_size:
        macs += head_in * c.representation_size
        head_in = c.representation_size
    heads = 2 if c.dist_token and c.dist_head else 1
    return macs + heads * head_in * c.num_classes


def model_info(name: str | ViTConfig, **overrides: Any) -> dict[str, Any]:
    """Parameters, GMACs, tokens and a one-line summary for a variant name or config."""
    cfg = name if isinstance(name, ViTConfig) else None
    if cfg is None:
        from vit.models.config import variant_config

        cfg = variant_config(name, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    params = count_params(cfg)
    gmacs = count_macs(cfg) / 1e9
    stem = f", a stem of {len(cfg.stem)} convolutions {list(cfg.stem)}" if cfg.stem else ""
    summary = (
        f"ViT width {cfg.width}, depth {cfg.depth}, {cfg.num_heads} heads, patch "
        f"{cfg.patch_size[0]}x{cfg.patch_size[1]}{stem}, "
        f"{cfg.image_size[0]}x{cfg.image_size[1]} px, "
        f"{cfg.classifier} classifier, {cfg.num_classes} classes"
    )
    return {
        "name": name if isinstance(name, str) else None,
        "params": params,
        "gmacs": round(gmacs, 3),
        "tokens": cfg.num_tokens,
        "grid": list(cfg.grid),
        "summary": summary,
        "config": cfg.to_dict(),
    }
