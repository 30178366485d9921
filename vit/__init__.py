"""vit: Vision Transformers in JAX + Flax NNX.

`import vit` is light: names load on first use, so the model runs where only jax and flax are
installed, and nothing from the data, training or CLI stacks is imported until asked for.
"""

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "create_model": "vit.models.vit",
    "VisionTransformer": "vit.models.vit",
    "ViTConfig": "vit.models.config",
    "TextConfig": "vit.models.config",
    "tokenize": "vit.models.text",
    "variant_config": "vit.models.config",
    "get_config": "vit.models.config",  # the name of variant_config in earlier releases
    "VARIANTS": "vit.models.config",
    "dot_product_attention": "vit.ops.attention",
    "model_info": "vit.models.info",
    "load_pretrained": "vit.inference.predictor",
    "load_checkpoint": "vit.checkpoints",
}

# `train` is the training subpackage, itself callable: `vit.train(config, workdir, ...)`
# (vit/train/api.py). As a subpackage, importing `vit.train.loop` binds the same object here.
__all__ = sorted([*_LAZY, "train"])


def __getattr__(name):
    if name == "train":  # a subpackage: importing it binds it here
        return importlib.import_module("vit.train")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
