"""transformers' BEiT and data2vec-vision: `model_type` `beit` and `data2vec-vision` (the same
encoder under `beit.` or `data2vec_vision.`; `...Model` and `...ForImageClassification`).

Each layer has a query and a value bias but no key bias (read as a zero one), layer scale
`lambda_1`/`lambda_2` when `layer_scale_init_value > 0`, and with `use_relative_position_bias`
its own relative position bias table; `use_shared_relative_position_bias` puts one table in the
encoder for every layer (our `rel_pos_bias` 'layer' and 'shared'). Absolute position embeddings
are there only with `use_absolute_position_embeddings` (otherwise the model's are zero, the same
function). With `use_mean_pooling` the encoder has no final norm and the pooler averages the
patch tokens and normalises the mean (our 'gap' with `fc_norm`); without it the final
`layernorm` runs and the class token is pooled.
"""

from __future__ import annotations

import numpy as np

from vit.checkpoints.hf_common import (
    ACT_NAMES,
    VIT_LAYER,
    Fields,
    Read,
    common_problems,
    k_bias_is_zero,
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

MODEL_TYPES = ("beit", "data2vec-vision")
PREFIX = {"beit": "beit.", "data2vec-vision": "data2vec_vision."}
NAME = {"beit": "Beit", "data2vec-vision": "Data2VecVision"}
DEFAULTS = {"num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 224,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu", "layer_scale_init_value": 0.1,
            "use_mean_pooling": True, "use_absolute_position_embeddings": False,
            "use_relative_position_bias": False, "use_shared_relative_position_bias": False}
PATCH = "embeddings.patch_embeddings.projection"
REL = "attention.attention.relative_position_bias.relative_position_bias_table"
SHARED_REL = "encoder.relative_position_bias.relative_position_bias_table"
NOT_A_CLASSIFIER = (("embeddings.mask_token", "the mask token of masked-image pretraining"),)


def _layer_names(layer_scale: bool, rel: bool) -> dict:
    return {**VIT_LAYER, **({"ls1": "lambda_1", "ls2": "lambda_2"} if layer_scale else {}),
            **({"rel": REL} if rel else {})}


def read(model_type: str, hc: dict, arrays: dict, config_file) -> Read:
    f = Fields(hc, config_file, DEFAULTS)
    fields = f.common()
    layer_rel = f.bool("use_relative_position_bias")
    shared_rel = f.bool("use_shared_relative_position_bias")
    if layer_rel and shared_rel:
        raise CheckpointError(f"{config_file}: use_relative_position_bias and "
                              "use_shared_relative_position_bias together (two tables added in "
                              "every layer) are not supported; a model has one or the other")
    layer_scale = f.number("layer_scale_init_value")
    mean_pooling = f.bool("use_mean_pooling")
    get = NamedArrays(arrays, prefix_of(arrays, (PREFIX[model_type], ""), f"{PATCH}.weight"))
    linear, norm = torch_readers(get)
    params = read_patch(get, PATCH)
    params["cls_token"] = get("embeddings.cls_token")
    if f.bool("use_absolute_position_embeddings"):
        params["pos_embed"] = get("embeddings.position_embeddings")
    elif params["patch_kernel"].ndim == 4:  # no absolute positions: ours are zero
        ph, pw, _, width = params["patch_kernel"].shape
        size = fields["image_size"]
        rows = 1 + (size[0] // ph) * (size[1] // pw)
        params["pos_embed"] = np.zeros((1, rows, width), np.float32)
    names = _layer_names(layer_scale > 0, layer_rel)
    params["blocks"] = {i: read_layer(get, f"encoder.layer.{i}", names, k_bias=False)
                        for i in range(fields["depth"])}
    if shared_rel:
        params["rel_pos_bias"] = {"table": get(SHARED_REL)}
    fields.update(layer_scale=layer_scale if layer_scale > 0 else None,
                  rel_pos_bias="layer" if layer_rel else "shared" if shared_rel else "none")
    classify = get.has("classifier.weight")
    arch = f"{NAME[model_type]}{'ForImageClassification' if classify else 'Model'}"
    if mean_pooling:
        if not classify and not get.has("pooler.layernorm.weight"):
            raise CheckpointError(f"{config_file}: a {arch} without its pooler "
                                  "(pooler.layernorm) has no pooled output to reproduce")
        params["fc_norm"] = norm("pooler.layernorm")
        fields.update(classifier="gap", fc_norm=True)
    else:
        params["norm"] = norm("layernorm")
    if classify:
        params["head"] = linear("classifier")
    return Read(get, params, fields, arch, NOT_A_CLASSIFIER)


def at_input(read: Read, size: tuple[int, int], config_file) -> None:
    """A BEiT without position embeddings or bias runs at any size: it is built for the
    processor's; one with them is refused when the two sizes differ."""
    image = read.fields["image_size"]
    if tuple(size) == tuple(image):
        return
    if read.fields["rel_pos_bias"] == "none" and not np.any(read.params["pos_embed"]):
        ph, pw, _, width = read.params["patch_kernel"].shape
        rows = 1 + (size[0] // ph) * (size[1] // pw)
        read.params["pos_embed"] = np.zeros((1, rows, width), np.float32)
        read.fields["image_size"] = tuple(size)
        return
    raise CheckpointError(
        f"{config_file}: image_size {image[0]}x{image[1]} but the processor gives "
        f"{size[0]}x{size[1]} images, for which transformers' BEiT resizes its position "
        "embeddings and relative position bias at every forward; that is not reproduced: make "
        "the two agree")


def cannot_hold(loaded, model_type: str) -> list[str]:
    cfg = loaded.config
    problems = common_problems(loaded, allow=("layer_scale", "rel_pos_bias", "fc_norm"))
    problems += square_size(cfg)
    if (cfg.classifier, cfg.fc_norm) not in (("gap", True), ("token", False)):
        problems.append(f"a '{cfg.classifier}' head {'with' if cfg.fc_norm else 'without'} "
                        "fc_norm (BEiT pools the patch mean with a norm after it, or the class "
                        "token after the final norm)")
    elif cfg.classifier == "gap" and cfg.pools_prefix:
        problems.append("a patch mean that includes the class token")
    if cfg.qkv_bias and not k_bias_is_zero(loaded.params, cfg.depth):
        problems.append("a key bias (BEiT's attention has none)")
    return problems


def write(loaded, model_type: str) -> tuple[dict, dict, str]:
    cfg, p = loaded.config, loaded.params
    classify = cfg.num_classes > 0
    prefix = "beit." if classify else ""
    out = {}
    put_linear, put_norm = torch_writers(out)
    out[f"{prefix}embeddings.cls_token"] = p["cls_token"]
    absolute = bool(np.any(np.asarray(p["pos_embed"])))
    if absolute:
        out[f"{prefix}embeddings.position_embeddings"] = p["pos_embed"]
    write_patch(out, f"{prefix}{PATCH}", p)
    names = _layer_names(cfg.layer_scale is not None, cfg.rel_pos_bias == "layer")
    for i in range(cfg.depth):
        write_layer(out, prefix, f"encoder.layer.{i}", names, p["blocks"][i], k_bias=False)
    if cfg.rel_pos_bias == "shared":
        out[f"{prefix}{SHARED_REL}"] = p["rel_pos_bias"]["table"]
    if cfg.fc_norm:
        put_norm(f"{prefix}pooler.layernorm", p["fc_norm"])
    else:
        put_norm(f"{prefix}layernorm", p["norm"])
    arch = "BeitForImageClassification" if classify else "BeitModel"
    if classify:
        put_linear("classifier", p["head"])
    hc = {
        "architectures": [arch], "model_type": "beit", "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "hidden_act": ACT_NAMES[cfg.act_layer],
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.0,
        "layer_norm_eps": cfg.layer_norm_eps, "image_size": cfg.image_size[0],
        "patch_size": cfg.patch_size[0], "num_channels": cfg.in_channels,
        "use_mask_token": False, "use_absolute_position_embeddings": absolute,
        "use_relative_position_bias": cfg.rel_pos_bias == "layer",
        "use_shared_relative_position_bias": cfg.rel_pos_bias == "shared",
        "layer_scale_init_value": cfg.layer_scale or 0.0, "use_mean_pooling": cfg.fc_norm,
        **labels_json(loaded, classify)}
    return out, hc, arch
