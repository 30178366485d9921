"""transformers' DINOv2: `model_type` `dinov2` (`Dinov2Model`, `Dinov2ForImageClassification`).

A ViT encoder (under `dinov2.`) whose layers have `norm1`/`norm2`, layer scale
(`layer_scale1.lambda1`, `layer_scale2.lambda1`) and either an MLP (`mlp.fc1`, `mlp.fc2`) or,
with `use_swiglu_ffn`, a SwiGLU: one `mlp.weights_in` of twice the hidden width whose halves
(x1, x2) give `silu(x1) * x2` (our `mlp_layer='glu'` with SiLU), then `mlp.weights_out`.
`Dinov2ForImageClassification`'s classifier reads the class token and the mean of the patch
tokens side by side (our `classifier='token_gap'`); `Dinov2Model`'s pooled output is the class
token.

transformers resizes the position embeddings at every forward whose patch grid is not the stored
one (bicubic, `align_corners=False`, no antialias; the stored grid is square), and the published
processors crop 224 pixels while `config.json` says 518: the reader resizes them once, the same
way, to the processor's grid, and the model is built for the processor's size.
"""

from __future__ import annotations

import math

import numpy as np

from vit.checkpoints.hf_common import (
    ACT_NAMES,
    VIT_LAYER,
    Fields,
    Read,
    common_problems,
    head_problem,
    labels_json,
    prefix_of,
    read_layer,
    read_patch,
    square_size,
    write_layer,
    write_patch,
)
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.torch_tensors import torch_readers, torch_writers
from vit.errors import CheckpointError
from vit.models.posemb import resize_posemb

MODEL_TYPES = ("dinov2",)
DEFAULTS = {"num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 224,
            "layer_norm_eps": 1e-6, "hidden_act": "gelu", "qkv_bias": True,
            "layerscale_value": 1.0, "use_swiglu_ffn": False}
PATCH = "embeddings.patch_embeddings.projection"
LAYER = {**VIT_LAYER, "norm1": "norm1", "norm2": "norm2", "fc1": "mlp.fc1", "fc2": "mlp.fc2",
         "ls1": "layer_scale1.lambda1", "ls2": "layer_scale2.lambda1"}
SWIGLU_LAYER = {**LAYER, "fc1": "mlp.weights_in", "fc2": "mlp.weights_out"}
NOT_A_CLASSIFIER = (("embeddings.mask_token", "the mask token of masked-image pretraining"),)


def read(model_type: str, hc: dict, arrays: dict, config_file) -> Read:
    f = Fields(hc, config_file, DEFAULTS)
    fields, qkv_bias, swiglu = f.common(), f.bool("qkv_bias"), f.bool("use_swiglu_ffn")
    get = NamedArrays(arrays, prefix_of(arrays, ("dinov2.", ""), f"{PATCH}.weight"))
    linear, norm = torch_readers(get)
    params = read_patch(get, PATCH)
    params["cls_token"] = get("embeddings.cls_token")
    params["pos_embed"] = get("embeddings.position_embeddings")
    names = SWIGLU_LAYER if swiglu else LAYER
    params["blocks"] = {i: read_layer(get, f"encoder.layer.{i}", names, qkv_bias=qkv_bias)
                        for i in range(fields["depth"])}
    params["norm"] = norm("layernorm")
    fields.update(qkv_bias=qkv_bias, layer_scale=f.number("layerscale_value"))
    if swiglu:  # Dinov2SwiGLUFFN: silu(x1) * x2 whatever hidden_act says
        fields.update(mlp_layer="glu", act_layer="silu")
    if get.has("classifier.weight"):
        params["head"] = linear("classifier")
        fields["classifier"], arch = "token_gap", "Dinov2ForImageClassification"
    else:
        arch = "Dinov2Model"
    return Read(get, params, fields, arch, NOT_A_CLASSIFIER)


def at_input(read: Read, size: tuple[int, int], config_file) -> None:
    """Builds the model for the processor's `size`, with the position embeddings resized as
    transformers resizes them at every forward of that size."""
    pe, patch = read.params["pos_embed"], read.params["patch_kernel"].shape[:2]
    side = math.isqrt(pe.shape[1] - 1)
    if side * side != pe.shape[1] - 1:
        raise CheckpointError(f"{config_file}: position_embeddings has {pe.shape[1] - 1} patch "
                              "rows, not a square grid, which transformers' Dinov2 needs")
    if size[0] % patch[0] or size[1] % patch[1]:
        raise CheckpointError(f"{config_file}: the processor's {size[0]}x{size[1]} images are "
                              f"not a multiple of the {patch[0]}-pixel patch")
    grid = (size[0] // patch[0], size[1] // patch[1])
    if grid != (side, side):
        read.params["pos_embed"] = resize_posemb(np.asarray(pe, np.float32), (side, side), grid,
                                                 1, "bicubic")
        read.notes.append(f"position embeddings resized from {side}x{side} to {grid[0]}x"
                          f"{grid[1]} patches for the processor's {size[0]}x{size[1]} images, "
                          "as transformers' Dinov2 resizes them at every forward (bicubic)")
    read.fields["image_size"] = tuple(size)


def _mlp_ratio(cfg) -> int | None:
    """The `mlp_ratio` (a whole number in transformers 5's Dinov2Config) that gives our MLP's
    width; None when none does."""
    for ratio in range(1, cfg.mlp_dim + 1):
        hidden = cfg.width * ratio
        if cfg.mlp_layer == "glu":  # Dinov2SwiGLUFFN's rounding of the hidden width
            hidden = 2 * ((int(hidden * 2 / 3) + 7) // 8 * 8)
        if hidden == cfg.mlp_dim:
            return ratio
        if hidden > cfg.mlp_dim:
            return None
    return None


def cannot_hold(loaded, model_type: str) -> list[str]:
    cfg = loaded.config
    problems = common_problems(loaded, allow=("layer_scale", "mlp_layer")) + square_size(cfg)
    if cfg.num_classes:
        problems += head_problem(cfg, ("token_gap",), "Dinov2ForImageClassification reads the "
                                 "class token and the patch mean")
    else:
        problems += head_problem(cfg, ("token",), "Dinov2Model pools the class token")
    if cfg.classifier == "token_gap" and cfg.pools_prefix:
        problems.append("a patch mean that includes the prefix tokens")
    if cfg.mlp_layer == "swiglu" or cfg.mlp_layer == "glu" and cfg.act_layer != "silu":
        problems.append(f"mlp_layer {cfg.mlp_layer} with {cfg.act_layer} (DINOv2's SwiGLU is "
                        "one fused weights_in with SiLU)")
    elif _mlp_ratio(cfg) is None:
        problems.append(f"an MLP width {cfg.mlp_dim} that no whole mlp_ratio gives for width "
                        f"{cfg.width}")
    return problems


def write(loaded, model_type: str) -> tuple[dict, dict, str]:
    cfg, p = loaded.config, loaded.params
    classify = cfg.num_classes > 0
    prefix = "dinov2." if classify else ""
    swiglu = cfg.mlp_layer == "glu"
    out = {}
    put_linear, put_norm = torch_writers(out)
    out[f"{prefix}embeddings.cls_token"] = p["cls_token"]
    out[f"{prefix}embeddings.position_embeddings"] = p["pos_embed"]
    write_patch(out, f"{prefix}{PATCH}", p)
    ones = {"gamma": np.ones(cfg.width, np.float32)}  # no layer scale: DINOv2's of 1
    for i in range(cfg.depth):
        block = {"ls1": ones, "ls2": ones, **p["blocks"][i]}
        write_layer(out, prefix, f"encoder.layer.{i}", SWIGLU_LAYER if swiglu else LAYER, block,
                    qkv_bias=cfg.qkv_bias)
    put_norm(f"{prefix}layernorm", p["norm"])
    arch = "Dinov2ForImageClassification" if classify else "Dinov2Model"
    if classify:
        put_linear("classifier", p["head"])
    hc = {
        "architectures": [arch], "model_type": "dinov2", "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
        "mlp_ratio": _mlp_ratio(cfg), "hidden_act": ACT_NAMES[cfg.act_layer],
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": cfg.layer_norm_eps, "image_size": cfg.image_size[0],
        "patch_size": cfg.patch_size[0], "num_channels": cfg.in_channels,
        "qkv_bias": cfg.qkv_bias, "layerscale_value": cfg.layer_scale or 1.0,
        "drop_path_rate": 0.0, "use_swiglu_ffn": swiglu, "use_mask_token": False,
        **labels_json(loaded, classify)}
    return out, hc, arch
