"""Where each token sits, and which token mix the classifier reads out.

Token order is [class token (when present), registers, patches row-major]. The patch grid comes
from the image shape through the model (`grid_for`), never from `sqrt(N)`, so non-square images,
registers and prefix-less (`gap`, `map`) models all map back to the right patches.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from einops import rearrange


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    class_token: bool
    num_registers: int
    grid: tuple[int, int]  # (rows, cols) of patches
    classifier: str  # token | gap | map

    @classmethod
    def for_model(cls, model, image_hw: tuple[int, int]) -> TokenLayout:
        cfg = model.config
        # DeiT's distillation token sits among the registers: a prefix token, not a patch.
        return cls(cfg.class_token, cfg.num_prefix_tokens - int(cfg.class_token),
                   tuple(model.grid_for(image_hw)),
                   cfg.classifier)

    @property
    def num_prefix(self) -> int:
        return int(self.class_token) + self.num_registers

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + self.num_patches

    def patch_grid(self, row: jax.Array) -> jax.Array:
        """`[batch, tokens]` scores -> `[batch, rows, cols]` over the patches alone."""
        return rearrange(row[:, self.num_prefix:], "b (gh gw) -> b gh gw", gh=self.grid[0])

    def fixed_readout(self, batch: int) -> jax.Array:
        """The readout row for `token` and `gap` heads: `[batch, tokens]`, summing to 1.

        `token` reads the class token; `gap` averages the patch tokens, so its row is uniform
        over patches. `map` heads have an input-dependent readout (`map_readout`).
        """
        n = self.num_tokens
        if self.classifier == "token":
            row = jnp.zeros((n,)).at[0].set(1.0)
        else:
            row = jnp.zeros((n,)).at[self.num_prefix:].set(1.0 / self.num_patches)
        return jnp.broadcast_to(row, (batch, n))


def map_readout(map_head, tokens: jax.Array) -> jax.Array:
    """The MAP head's own pooling weights over tokens, averaged over heads: `[batch, tokens]`.

    This is what the head actually reads, so it is the readout row for `map` classifiers (the
    alternative, a uniform mean over patches, ignores what the probe learned to look at).
    """
    b, _, d = tokens.shape
    probe = jnp.broadcast_to(map_head.probe[...], (b, 1, d)).astype(tokens.dtype)
    q = rearrange(map_head.q(probe), "b 1 (h d) -> b 1 h d", h=map_head.num_heads)
    k = rearrange(map_head.kv(tokens), "b n (two h d) -> two b n h d", two=2,
                  h=map_head.num_heads)[0]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits / jnp.sqrt(map_head.head_dim).astype(jnp.float32), axis=-1)
    return probs[:, :, 0].mean(1)
