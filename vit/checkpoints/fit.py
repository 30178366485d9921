"""Fitting a pretrained checkpoint's parameters to the model being fine-tuned.

Works on (params, config) pairs, so it serves every checkpoint format the loaders read:
- a head for another number of classes is replaced by a zero-initialised one (vit_jax and
  big_vision do the same: fine-tuning starts from uniform predictions);
- a `pre_logits` layer the new model does not have is dropped (vit_jax drops i21k's);
- position embeddings are resized when the patch grid differs;
- a plain checkpoint into a text-conditioned model gets fresh text weights (text_path, xattn,
  prompt_head, similarity), a text checkpoint into a plain model loses them;
- any other shape mismatch is an error that names the parameter.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

from vit.checkpoints.loaded import TEXT_SUBTREES, fit_text
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.posemb import resize_posemb


def adapt_params(src_params: dict, src_config: ViTConfig, dst_config: ViTConfig, *,
                 dst_template: dict, seed: int = 0,
                 notes: list[str] | None = None) -> dict:
    """`src_params` (pure dict) reshaped to fit `dst_config`, whose fresh params are
    `dst_template` (used for shapes and for any new layer).

    New text-conditioning weights come from `dst_template` when it holds arrays; a template of
    shape placeholders (`abstract_params`) has no values, so they are then initialised as a
    model of `dst_config` built with `nnx.Rngs(seed)` would be. What was initialised or dropped
    is appended to `notes`, or issued as a Python warning without it.
    """
    params, text_notes = fit_text(
        dict(src_params), dst_config, fresh=dst_template if _has_values(dst_template) else None,
        seed=seed, hint="; they start from this init (cross-attention gates at 0)")
    for note in text_notes:
        if notes is not None:
            notes.append(note)
        else:
            warnings.warn(note, stacklevel=2)
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
                                            src_config.posemb_resize)  # the source's convention
    _check_shapes(params, dst_template)
    return params


def _has_values(template: dict) -> bool:
    """Whether the template's text subtrees are arrays rather than shape placeholders."""
    leaves = jax.tree.leaves({k: v for k, v in template.items() if k in TEXT_SUBTREES})
    return all(isinstance(leaf, np.ndarray | jax.Array) for leaf in leaves)


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
