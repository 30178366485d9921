"""ViT models. Imports jax, flax and `vit.ops` only: no data, config-file or training stacks."""

from vit.models.config import VARIANTS, ViTConfig, variant_config
from vit.models.vit import VisionTransformer, create_model

__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "create_model",
           "variant_config"]
