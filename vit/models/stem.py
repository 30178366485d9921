"""A convolutional stem before the patch embedding (`ViTConfig.stem`): the ViT paper's hybrid
in its small form, as in "Early convolutions help transformers see better" (Xiao et al., 2021).

Each entry of `stem` is one 3x3 convolution of stride 2 and padding 1 (PyTorch's
`Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False)`) with that many output channels, then
the config's norm over the channels and its activation. The patch embedding then reads the
stem's map: a token still covers `patch_size` pixels of the image (the grid, the position
embeddings and every map of the explain tools are unchanged), and the patch kernel covers
`patch_size / 2**len(stem)` positions of the map. Small images learn faster this way: the
convolutions give the tokens local features that a linear patch embedding leaves to the blocks.

Parameters: `stem/{i}/{kernel [3, 3, c_in, c_out], norm}`, float32; the convolutions run in the
compute dtype and return float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit.models.blocks import activation
from vit.models.config import ViTConfig
from vit.models.norms import make_norm


class StemConv(nnx.Module):
    """One 3x3 convolution of stride 2 (no bias), the config's norm over its channels, the
    config's activation."""

    def __init__(self, cin: int, cout: int, cfg: ViTConfig, rngs: nnx.Rngs):
        self.dtype = jnp.dtype(cfg.dtype)
        self.act = activation(cfg.act_layer)
        # He initialisation, as for a ResNet's convolutions: an activation follows.
        self.kernel = nnx.Param(nnx.initializers.he_normal()(rngs.params(), (3, 3, cin, cout)))
        self.norm = make_norm(cout, cfg, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # The nine taps side by side, then one product: the same sums as a convolution, which
        # XLA:CPU runs (and differentiates) several times slower at these sizes.
        _, h, w, c = x.shape
        ho, wo = (h + 1) // 2, (w + 1) // 2
        xp = jnp.pad(x.astype(self.dtype), ((0, 0), (1, 1), (1, 1), (0, 0)))
        taps = [xp[:, dy:dy + 2 * ho - 1:2, dx:dx + 2 * wo - 1:2, :]
                for dy in range(3) for dx in range(3)]
        x = jnp.dot(jnp.concatenate(taps, axis=-1),
                    self.kernel[...].astype(self.dtype).reshape(9 * c, -1),
                    preferred_element_type=jnp.float32)
        return self.act(self.norm(x))


def make_stem(cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.List | None:
    """The stem's convolutions in order, or None for a plain patch embedding."""
    if not cfg.stem:
        return None
    channels = (cfg.in_channels, *cfg.stem)
    return nnx.List([StemConv(cin, cout, cfg, rngs)
                     for cin, cout in zip(channels[:-1], channels[1:], strict=True)])
