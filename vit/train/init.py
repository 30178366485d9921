"""Fitting a pretrained checkpoint's parameters to the model being fine-tuned.

Works on (params, config) pairs, so it serves every checkpoint format the loaders read:
- a head for another number of classes is replaced by a zero-initialised one (vit_jax and
  big_vision do the same: fine-tuning starts from uniform predictions);
- a `pre_logits` layer the new model does not have is dropped (vit_jax drops i21k's);
- position embeddings are resized when the patch grid differs;
- any other shape mismatch is an error that names the parameter.
"""

from __future__ import annotations

import numpy as np

from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.posemb import resize_posemb


def adapt_params(src_params: dict, src_config: ViTConfig, dst_config: ViTConfig, *,
                 dst_template: dict, posemb_method: str = "bicubic") -> dict:
    """`src_params` (pure dict) reshaped to fit `dst_config`, whose fresh params are
    `dst_template` (used for shapes and for any new layer)."""
    params = {k: v for k, v in src_params.items()}
    if "pre_logits" in params and "pre_logits" not in dst_template:
        del params["pre_logits"]
    if "head" in dst_template:
        src_head = params.get("head")
        fits = src_head is not None and all(
            np.shape(src_head[k]) == np.shape(dst_template["head"][k]) for k in ("kernel", "bias"))
        if not fits:  # another class count (or a head-less backbone): start from zeros
            params["head"] = {k: np.zeros(np.shape(v), np.float32)
                              for k, v in dst_template["head"].items()}
    else:
        params.pop("head", None)
    if "pos_embed" in params and src_config.grid != dst_config.grid:
        params["pos_embed"] = resize_posemb(np.asarray(params["pos_embed"]), src_config.grid,
                                            dst_config.grid, int(src_config.class_token),
                                            posemb_method)
    _check_shapes(params, dst_template)
    return params


def _check_shapes(params, template, prefix: str = "") -> None:
    missing = set(template) - set(params)
    extra = set(params) - set(template)
    if missing or extra:
        raise CheckpointError(
            f"checkpoint parameters do not fit the model at {prefix or 'top level'}: "
            f"missing {sorted(map(str, missing))}, unexpected {sorted(map(str, extra))}; "
            "check the model fields in the config against the checkpoint's")
    for key, value in template.items():
        if isinstance(value, dict):
            _check_shapes(params[key], value, f"{prefix}{key}/")
        elif np.shape(params[key]) != np.shape(value):
            raise CheckpointError(
                f"checkpoint parameter {prefix}{key} has shape {np.shape(params[key])}, the "
                f"model needs {np.shape(value)}; check the model fields in the config")
