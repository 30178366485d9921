"""vit: Vision Transformers in JAX + Flax NNX.

`import vit` is light: names load on first use, so the model runs where only jax and flax are
installed, and nothing from the data, training or CLI stacks is imported until asked for.

    model = vit.create_model("S/16", num_classes=10)
    loaded = vit.load_checkpoint("vit_base_patch16_224")       # any format we read
    vit.save_checkpoint(loaded, "exported", "hf")                # any format we write
    maps = vit.explain(model, images, "rollout")                 # an Explanation
    vit.train("digits", "runs/digits")                           # as `vit train` runs it

A user mistake raises a `vit.VitError` (`ConfigError`, `CheckpointError`, `DataError`,
`OutOfSpace`, `OutOfMemory`): one line saying what to fix. `vit.variant_config(name)` is a
model variant's `ViTConfig`.
"""

import importlib
from typing import TYPE_CHECKING

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
    "explain": "vit.explanations.maps",  # the package is vit.explanations
    "train": "vit.training.api",  # the package is vit.training
}
__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # what type checkers and IDEs follow; at run time `_LAZY` loads each on use
    from vit.checkpoints import load_checkpoint as load_checkpoint
    from vit.checkpoints import save_checkpoint as save_checkpoint
    from vit.errors import CheckpointError as CheckpointError
    from vit.errors import ConfigError as ConfigError
    from vit.errors import DataError as DataError
    from vit.errors import OutOfMemory as OutOfMemory
    from vit.errors import OutOfSpace as OutOfSpace
    from vit.errors import VitError as VitError
    from vit.explanations.maps import explain as explain
    from vit.inference.predictor import load_pretrained as load_pretrained
    from vit.models.config import VARIANTS as VARIANTS
    from vit.models.config import TextConfig as TextConfig
    from vit.models.config import ViTConfig as ViTConfig
    from vit.models.config import variant_config as variant_config
    from vit.models.info import model_info as model_info
    from vit.models.text import tokenize as tokenize
    from vit.models.vit import VisionTransformer as VisionTransformer
    from vit.models.vit import create_model as create_model
    from vit.ops.attention import dot_product_attention as dot_product_attention
    from vit.training.api import train as train


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
