"""vit: Vision Transformers in JAX + Flax NNX.

`import vit` is light: names load on first use, so the model runs where only jax and flax are
installed, and nothing from the data, training or CLI stacks is imported until asked for.

    model = vit.create_model("S/16", num_classes=10)
    loaded = vit.load_checkpoint("vit_base_patch16_224")       # any format we read
    vit.save_checkpoint(loaded, "exported", "hf")                # any format we write
    maps = vit.explain(model, images, "rollout")                 # vit.explain.Explanation
    vit.train("digits", "runs/digits")                           # as `vit train` runs it

A user mistake raises a `vit.VitError` (`ConfigError`, `CheckpointError`, `DataError`,
`OutOfSpace`, `OutOfMemory`): one line saying what to fix. `vit.variant_config(name)` is a
model variant's `ViTConfig`.
"""

import importlib

__version__ = "0.2.0"

# public name -> module that defines it
_LAZY = {
    "create_model": "vit.models.vit",
    "VisionTransformer": "vit.models.vit",
    "ViTConfig": "vit.models.config",
    "TextConfig": "vit.models.config",
    "tokenize": "vit.models.text",
    "variant_config": "vit.models.config",
    "VARIANTS": "vit.models.config",
    "dot_product_attention": "vit.ops.attention",
    "model_info": "vit.models.info",
    "load_pretrained": "vit.inference.predictor",
    "load_checkpoint": "vit.checkpoints",
    "save_checkpoint": "vit.checkpoints",
    "VitError": "vit.errors",
    "ConfigError": "vit.errors",
    "CheckpointError": "vit.errors",
    "DataError": "vit.errors",
    "OutOfSpace": "vit.errors",
    "OutOfMemory": "vit.errors",
}

# `train` and `explain` are subpackages that are callable themselves:
# `vit.train(config, workdir, ...)` (vit/train/api.py) and `vit.explain(model, images, ...)`
# (vit/explain/maps.py). As subpackages, importing `vit.train.loop` or `vit.explain.maps`
# binds the same object here.
_CALLABLE_PACKAGES = ("train", "explain")
__all__ = sorted([*_LAZY, *_CALLABLE_PACKAGES])


def __getattr__(name):
    if name in _CALLABLE_PACKAGES:  # a subpackage: importing it binds it here
        return importlib.import_module(f"vit.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
