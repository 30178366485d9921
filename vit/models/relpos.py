"""BEiT's relative position bias: one learned value per (relative offset, head), added to the
attention logits (transformers' `BeitRelativePositionBias`, timm's beit `Attention`).

The table has `(2 gh - 1) (2 gw - 1)` rows for the offsets between two patches and three more
for class -> patch, patch -> class and class -> class, in that order; tokens are
`[class, patches]`. Parameter: `table [(2 gh - 1) (2 gw - 1) + 3, heads]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@functools.cache
def relative_position_index(grid: tuple[int, int]) -> np.ndarray:
    """`[1 + gh gw, 1 + gw gh]` table rows, as BEiT builds them."""
    gh, gw = grid
    distances = (2 * gh - 1) * (2 * gw - 1) + 3
    coords = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    rel[:, :, 0] += gh - 1
    rel[:, :, 1] += gw - 1
    rel[:, :, 0] *= 2 * gw - 1
    index = np.zeros((gh * gw + 1,) * 2, np.int32)
    index[1:, 1:] = rel.sum(-1)
    index[0, 0:] = distances - 3  # class -> patch
    index[0:, 0] = distances - 2  # patch -> class
    index[0, 0] = distances - 1  # class -> class
    return index


class RelativePositionBias(nnx.Module):
    """The table for one patch grid; calling it gives the `[heads, tokens, tokens]` bias."""

    def __init__(self, grid: tuple[int, int], num_heads: int):
        self.grid = tuple(grid)
        rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
        self.table = nnx.Param(jnp.zeros((rows, num_heads), jnp.float32))

    def __call__(self) -> jax.Array:
        """`[heads, 1 + gh gw, 1 + gh gw]` for the grid the table was learned for (other
        image sizes are refused where the bias meets the tokens)."""
        index = relative_position_index(self.grid)
        bias = self.table[...][index.reshape(-1)].reshape(*index.shape, -1)
        return jnp.transpose(bias, (2, 0, 1))
