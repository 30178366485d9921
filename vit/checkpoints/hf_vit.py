"""transformers' ViT and DeiT: `model_type` `vit` and `deit`.

`ViTForImageClassification` keeps the encoder under `vit.` and a `classifier`; `ViTModel` has no
prefix and an optional `pooler` (Dense + tanh on the class token: our `pre_logits`). DeiT is
the same encoder (under `deit.`) with a distillation token after the class token, one more
position row for it, and three heads: `DeiTForImageClassification`'s `classifier` reads the
class token alone; `DeiTForImageClassificationWithTeacher` averages `cls_classifier` on the
class token and `distillation_classifier` on the distillation token (our `dist_head`).
"""

from __future__ import annotations

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
    write_layer,
    write_patch,
)
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.torch_tensors import torch_readers, torch_writers
from vit.errors import CheckpointError

MODEL_TYPES = ("vit", "deit")
DEFAULTS = {"num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 224,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu", "qkv_bias": True,
            "pooler_act": "tanh"}
PATCH = "embeddings.patch_embeddings.projection"
NOT_A_CLASSIFIER = (("embeddings.mask_token", "the mask token of masked-image pretraining"),)


def read(model_type: str, hc: dict, arrays: dict, config_file) -> Read:
    f = Fields(hc, config_file, DEFAULTS)
    fields, qkv_bias = f.common(), f.bool("qkv_bias")
    deit = model_type == "deit"
    get = NamedArrays(arrays, prefix_of(arrays, (f"{model_type}.", ""), f"{PATCH}.weight"))
    linear, norm = torch_readers(get)
    params = read_patch(get, PATCH)
    params["cls_token"] = get("embeddings.cls_token")
    if deit:
        params["dist_token"] = get("embeddings.distillation_token")
    params["pos_embed"] = get("embeddings.position_embeddings")
    params["blocks"] = {i: read_layer(get, f"encoder.layer.{i}", VIT_LAYER, qkv_bias=qkv_bias)
                        for i in range(fields["depth"])}
    params["norm"] = norm("layernorm")
    fields["qkv_bias"] = qkv_bias
    name = "DeiT" if deit else "ViT"
    if deit and get.has("cls_classifier.weight"):
        params["head"], params["head_dist"] = linear("cls_classifier"), linear(
            "distillation_classifier")
        arch = f"{name}ForImageClassificationWithTeacher"
    elif get.has("classifier.weight"):
        params["head"] = linear("classifier")
        arch = f"{name}ForImageClassification"
    else:
        arch = f"{name}Model"
        if get.has("pooler.dense.weight"):
            if f.raw("pooler_act") != "tanh":
                raise CheckpointError(f"{config_file}: pooler_act {f.raw('pooler_act')!r} is "
                                      "not supported (only tanh)")
            params["pre_logits"] = linear("pooler.dense")
            fields["representation_size"] = params["pre_logits"]["kernel"].shape[1]
    if deit:  # the distillation head only in ...WithTeacher
        fields.update(dist_token=True, dist_head="head_dist" in params)
    skipped = NOT_A_CLASSIFIER
    if "head" in params:
        skipped += (("pooler.", f"the pooler, which {arch} does not use"),)
    return Read(get, params, fields, arch, skipped)


def cannot_hold(loaded, model_type: str) -> list[str]:
    cfg = loaded.config
    deit = model_type == "deit"
    problems = common_problems(loaded, allow=("pre_logits", "dist_token") if deit else
                               ("pre_logits",))
    if deit and not cfg.dist_token:
        problems.append("no distillation token (DeiT always has one)")
    if deit and cfg.dist_token and cfg.dist_head and not cfg.num_classes:
        problems.append("the mean of the class and distillation tokens as the output "
                        "(DeiTModel pools the class token)")
    problems += head_problem(cfg, ("token",), "transformers' ViT and DeiT read the class token")
    return problems


def write(loaded, model_type: str) -> tuple[dict, dict, str]:
    cfg, p = loaded.config, loaded.params
    deit = model_type == "deit"
    classify = cfg.num_classes > 0
    prefix = f"{model_type}." if classify else ""
    out = {}
    put_linear, put_norm = torch_writers(out)
    out[f"{prefix}embeddings.cls_token"] = p["cls_token"]
    if deit:
        out[f"{prefix}embeddings.distillation_token"] = p["dist_token"]
    out[f"{prefix}embeddings.position_embeddings"] = p["pos_embed"]
    write_patch(out, f"{prefix}{PATCH}", p)
    for i in range(cfg.depth):
        write_layer(out, prefix, f"encoder.layer.{i}", VIT_LAYER, p["blocks"][i],
                    qkv_bias=cfg.qkv_bias)
    put_norm(f"{prefix}layernorm", p["norm"])
    name = "DeiT" if deit else "ViT"
    if classify and deit and cfg.dist_head:
        put_linear("cls_classifier", p["head"])
        put_linear("distillation_classifier", p["head_dist"])
        arch = f"{name}ForImageClassificationWithTeacher"
    elif classify:
        put_linear("classifier", p["head"])
        arch = f"{name}ForImageClassification"
    else:
        arch = f"{name}Model"
        if cfg.representation_size:
            put_linear("pooler.dense", p["pre_logits"])
    hc = {
        "architectures": [arch], "model_type": model_type, "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "hidden_act": ACT_NAMES[cfg.act_layer],
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": cfg.layer_norm_eps, "image_size": cfg.image_size[0]
        if cfg.image_size[0] == cfg.image_size[1] else list(cfg.image_size),
        "patch_size": cfg.patch_size[0], "num_channels": cfg.in_channels,
        "qkv_bias": cfg.qkv_bias, "pooler_output_size": cfg.representation_size or cfg.width,
        "pooler_act": "tanh", "initializer_range": 0.02, "encoder_stride": cfg.patch_size[0],
        **labels_json(loaded, classify)}
    return out, hc, arch
