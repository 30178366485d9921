"""transformers' CLIP and SigLIP image towers: `model_type` `clip`, `clip_vision_model`, `siglip`,
`siglip_vision_model`.

Both towers sit under `vision_model.` (transformers 5 saves a bare `CLIPVisionModel` or
`SiglipVisionModel` without it; both are read), with layers of `self_attn.{q,k,v,out}_proj`,
`layer_norm1`, `layer_norm2`, `mlp.fc1`, `mlp.fc2`, and a `post_layernorm`. The two-tower
`config.json` (`clip`, `siglip`) keeps the tower's fields in `vision_config`.

CLIP: a class token (`class_embedding`, one vector), a patch convolution without bias, and
`pre_layrnorm` before the blocks (our `pre_norm`). `CLIPVisionModel`'s pooled output is
`post_layernorm` of the class token; `CLIPVisionModelWithProjection` and the two-tower
`CLIPModel` multiply it by `visual_projection` (no bias: our head with a zero bias; the text
tower, its projection and the temperature are skipped, and said). `CLIPForImageClassification`
averages the patch tokens of the encoder's output, before `post_layernorm`, which it never runs:
that norm is skipped and said (our 'gap' without a final norm).

SigLIP: no class token; `SiglipVisionModel` and the two-tower `SiglipModel` pool with the
attention-pooling `head` (a probe, `nn.MultiheadAttention` whose `in_proj` splits into our `q` and
`kv`, a LayerNorm and an MLP: our 'map' head). `SiglipForImageClassification` averages every
token after `post_layernorm` and never runs that head: it is skipped, and said.
"""

from __future__ import annotations

import numpy as np

from vit.checkpoints.hf_common import (
    ACT_NAMES,
    CLIP_LAYER,
    Fields,
    Read,
    common_problems,
    labels_json,
    prefix_of,
    read_layer,
    read_patch,
    reshaped,
    square_size,
    write_layer,
    write_patch,
)
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.torch_tensors import linear_of, torch_readers, torch_writers
from vit.errors import CheckpointError

MODEL_TYPES = ("clip", "clip_vision_model", "siglip", "siglip_vision_model")
DEFAULTS = {
    "clip": {"num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 224,
             "layer_norm_eps": 1e-5, "hidden_act": "quick_gelu"},
    "siglip": {"num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 224,
               "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
               "vision_use_head": True},
}
PATCH = "embeddings.patch_embedding"
# Arrays of a two-tower file outside its image tower, and old files' index buffer.
OUTSIDE = (("text_model.", "the text tower of a two-tower model"),
           ("text_projection.", "the text tower's projection"),
           ("logit_scale", "the contrastive loss's temperature"),
           ("logit_bias", "the contrastive loss's bias"),
           ("embeddings.position_ids", "the position index buffer (0, 1, ..., n - 1) that older "
                                       "transformers saved"))


def _vision_fields(model_type: str, hc: dict, config_file) -> Fields:
    family = model_type.split("_")[0]
    if model_type in ("clip", "siglip"):
        vision = hc.get("vision_config") or {}
        if not isinstance(vision, dict):
            raise CheckpointError(f"{config_file}: vision_config is not an object of the image "
                                  "tower's fields")
        return Fields(vision, config_file, DEFAULTS[family], where="vision_config.")
    return Fields(hc, config_file, DEFAULTS[family])


def read(model_type: str, hc: dict, arrays: dict, config_file) -> Read:
    f = _vision_fields(model_type, hc, config_file)
    fields = f.common()
    get = NamedArrays(arrays, prefix_of(arrays, ("vision_model.", ""), f"{PATCH}.weight"))
    clip = model_type.startswith("clip")
    params = read_patch(get, PATCH, bias=not clip)
    width = params["patch_kernel"].shape[-1] if params["patch_kernel"].ndim == 4 else 0
    pos = get("embeddings.position_embedding.weight")
    params["pos_embed"] = pos[None] if pos.ndim == 2 else pos
    params["blocks"] = {i: read_layer(get, f"encoder.layers.{i}", CLIP_LAYER)
                        for i in range(fields["depth"])}
    result = (_read_clip if clip else _read_siglip)(model_type, get, params, fields, f, width)
    result.skipped = OUTSIDE + result.skipped
    return result


def _read_clip(model_type, get, params, fields, f, width) -> Read:
    linear, norm = torch_readers(get)
    params["cls_token"] = reshaped(get("embeddings.class_embedding"), (1, 1, width))
    params["norm_pre"] = norm("pre_layrnorm")
    fields.update(patch_bias=False, pre_norm=True)
    if model_type == "clip" and get.has("classifier.weight"):
        params["head"] = linear("classifier")
        fields.update(classifier="gap", final_norm=False)
        arch = "CLIPForImageClassification"
        return Read(get, params, fields, arch, (
            ("post_layernorm.", f"post_layernorm, which {arch} does not run (it averages the "
                                "encoder's patch tokens before it)"),))
    params["norm"] = norm("post_layernorm")
    if model_type == "clip" or get.has("visual_projection.weight"):
        projection = get("visual_projection.weight")
        params["head"] = linear_of(projection, np.zeros(projection.shape[:1], np.float32))
        arch = "CLIPModel" if model_type == "clip" else "CLIPVisionModelWithProjection"
        return Read(get, params, fields, arch, projection=True)
    return Read(get, params, fields, "CLIPVisionModel")


def _read_siglip(model_type, get, params, fields, f, width) -> Read:
    linear, norm = torch_readers(get)
    params["norm"] = norm("post_layernorm")
    fields.update(class_token=False)
    if model_type == "siglip" and get.has("classifier.weight"):
        params["head"] = linear("classifier")
        fields["classifier"] = "gap"
        arch = "SiglipForImageClassification"
        return Read(get, params, fields, arch, (
            ("head.", f"the attention-pooling head, which {arch} does not run (it averages the "
                      "tokens)"),))
    arch = "SiglipModel" if model_type == "siglip" else "SiglipVisionModel"
    if not f.bool("vision_use_head"):
        raise CheckpointError(f"{f.file}: {f.where}vision_use_head is false: a {arch} without "
                              "its attention-pooling head has no pooled output to reproduce")
    in_w, in_b = get("head.attention.in_proj_weight"), get("head.attention.in_proj_bias")
    params["map_head"] = {
        "probe": get("head.probe"),
        "q": linear_of(in_w[:width], in_b[:width]) if in_w.size else {"kernel": in_w},
        "kv": linear_of(in_w[width:], in_b[width:]) if in_w.size else {"kernel": in_w},
        "proj": linear("head.attention.out_proj"), "norm": norm("head.layernorm"),
        "mlp": {"fc1": linear("head.mlp.fc1"), "fc2": linear("head.mlp.fc2")}}
    fields["classifier"] = "map"
    return Read(get, params, fields, arch)


def _vision_config(cfg) -> dict:
    return {"hidden_size": cfg.width, "intermediate_size": cfg.mlp_dim,
            "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
            "num_channels": cfg.in_channels, "image_size": cfg.image_size[0],
            "patch_size": cfg.patch_size[0], "hidden_act": ACT_NAMES[cfg.act_layer],
            "layer_norm_eps": cfg.layer_norm_eps, "attention_dropout": 0.0}


def _projection(loaded) -> bool:
    """A head that is CLIP's `visual_projection`: on the class token, after the final norm,
    without a bias."""
    cfg, head = loaded.config, loaded.params.get("head")
    return bool(cfg.num_classes and cfg.classifier == "token" and cfg.final_norm
                and not np.any(np.asarray(head["bias"])))


def cannot_hold(loaded, model_type: str) -> list[str]:
    cfg = loaded.config
    if model_type == "clip":
        problems = common_problems(loaded, allow=("pre_norm", "no_patch_bias", "no_final_norm"))
        if not cfg.pre_norm:
            problems.append("no norm before the blocks (CLIP has pre_layrnorm)")
        if cfg.patch_bias:
            problems.append("a patch embedding bias (CLIP's has none)")
        gap = cfg.classifier == "gap" and not cfg.final_norm and cfg.num_classes
        token = cfg.classifier == "token" and cfg.final_norm and (
            not cfg.num_classes or _projection(loaded))
        if not (gap or token):
            problems.append(f"a '{cfg.classifier}' head {'after' if cfg.final_norm else 'without'}"
                            " a final norm (CLIP classifies the patch mean without one, or "
                            "projects the normalised class token without a bias)")
        elif gap and cfg.pools_prefix:
            problems.append("a patch mean that includes the class token")
    else:
        problems = common_problems(loaded, allow=("no_class_token",))
        if cfg.class_token:
            problems.append("a class token (SigLIP has none)")
        if not (cfg.classifier == "gap" and cfg.num_classes
                or cfg.classifier == "map" and not cfg.num_classes):
            problems.append(f"a '{cfg.classifier}' head {'with' if cfg.num_classes else 'without'}"
                            " a classifier (SigLIP classifies the token mean, or pools by "
                            "attention without a classifier)")
    return problems + square_size(cfg)


def write(loaded, model_type: str) -> tuple[dict, dict, str]:
    cfg, p = loaded.config, loaded.params
    out, prefix = {}, "vision_model."
    put_linear, put_norm = torch_writers(out)
    write_patch(out, f"{prefix}{PATCH}", p)
    out[f"{prefix}embeddings.position_embedding.weight"] = np.asarray(p["pos_embed"])[0]
    for i in range(cfg.depth):
        write_layer(out, prefix, f"encoder.layers.{i}", CLIP_LAYER, p["blocks"][i])
    vision = _vision_config(cfg)
    if model_type == "clip":
        out[f"{prefix}embeddings.class_embedding"] = np.asarray(p["cls_token"]).reshape(-1)
        put_norm(f"{prefix}pre_layrnorm", p["norm_pre"])
        if cfg.final_norm:
            put_norm(f"{prefix}post_layernorm", p["norm"])
        else:  # CLIPForImageClassification has the module but never runs it
            put_norm(f"{prefix}post_layernorm", {"scale": np.ones(cfg.width, np.float32),
                                                 "bias": np.zeros(cfg.width, np.float32)})
        if cfg.classifier == "gap":
            put_linear("classifier", p["head"])
            return out, {"architectures": ["CLIPForImageClassification"], "model_type": "clip",
                         "vision_config": vision, **labels_json(loaded, True)}, \
                "CLIPForImageClassification"
        if cfg.num_classes:
            out["visual_projection.weight"] = np.asarray(p["head"]["kernel"]).T
            arch = "CLIPVisionModelWithProjection"
            vision["projection_dim"] = cfg.num_classes
        else:
            arch = "CLIPVisionModel"
        return out, {"architectures": [arch], "model_type": "clip_vision_model", **vision}, arch
    put_norm(f"{prefix}post_layernorm", p["norm"])
    if cfg.classifier == "gap":
        put_linear("classifier", p["head"])
        vision["vision_use_head"] = False
        return out, {"architectures": ["SiglipForImageClassification"], "model_type": "siglip",
                     "vision_config": vision, **labels_json(loaded, True)}, \
            "SiglipForImageClassification"
    head = p["map_head"]
    out[f"{prefix}head.probe"] = head["probe"]
    out[f"{prefix}head.attention.in_proj_weight"] = np.concatenate(
        [np.asarray(head["q"]["kernel"]).T, np.asarray(head["kv"]["kernel"]).T])
    out[f"{prefix}head.attention.in_proj_bias"] = np.concatenate(
        [np.asarray(head["q"]["bias"]), np.asarray(head["kv"]["bias"])])
    put_linear(f"{prefix}head.attention.out_proj", head["proj"])
    put_norm(f"{prefix}head.layernorm", head["norm"])
    put_linear(f"{prefix}head.mlp.fc1", head["mlp"]["fc1"])
    put_linear(f"{prefix}head.mlp.fc2", head["mlp"]["fc2"])
    return out, {"architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model",
                 **vision, "vision_use_head": True}, "SiglipVisionModel"
