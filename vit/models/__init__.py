"""ViT models. Imports jax, flax and `vit.ops` only: no data, config-file or training stacks."""

from vit.models.config import VARIANTS, ViTConfig, get_config, variant_config
from vit.models.vit import VisionTransformer, create_model

__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "create_model", "get_config",
           "variant_config"]
