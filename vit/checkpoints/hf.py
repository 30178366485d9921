"""Hugging Face ViT folders (`config.json` + `model.safetensors` [+ `preprocessor_config.json`]).

Keys as `save_pretrained` writes them (transformers 5 renames modules in memory, not on disk):
`ViTForImageClassification` has `vit.` before the encoder and a `classifier`; `ViTModel` has no
prefix and an optional `pooler` (Dense + tanh on the class token: our `pre_logits`). Linear
weights are `(out, in)`; the patch projection is an OIHW convolution. `layer_norm_eps` (1e-12 by
default) and `hidden_act` come from `config.json`; heads cannot be read from the shapes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from vit.checkpoints.files import (
    field_error,
    json_int,
    json_number,
    json_numbers,
    json_size,
    read_json_object,
    staged,
)
from vit.checkpoints.labels import default_labels
from vit.checkpoints.loaded import LoadedCheckpoint, refuse_text, zero_head_warning
from vit.checkpoints.lossy import lossy_hint
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.safetensors_io import read_safetensors_folder, write_safetensors
from vit.checkpoints.torch_tensors import conv_of, patch_kernel_of, torch_readers, torch_writers
from vit.errors import CheckpointError, ConfigError, DataError
from vit.models.config import ViTConfig
from vit.models.posemb import METHOD_OF_SOURCE
from vit.preprocess import Preprocessing

# hidden_act -> our act_layer
ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}
# PIL's resampling enum, as preprocessor_config.json stores it.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


# -- reading ----------------------------------------------------------------------------------
def is_hf_keys(keys) -> bool:
    return any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings")) for k in keys)


def read(folder: Path) -> LoadedCheckpoint:
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.exists():
        raise CheckpointError(f"{folder}: no config.json beside the weights; a Hugging Face ViT "
                              "needs it (num_attention_heads, layer_norm_eps, hidden_act)")
    hc = read_json_object(config_file)
    if hc.get("model_type", "vit") != "vit":
        raise CheckpointError(f"{config_file}: model_type {hc.get('model_type')!r} is not a "
                              "ViT; only model_type 'vit' folders are read")
    arrays = read_safetensors_folder(folder)
    fields = _config_fields(hc, config_file)
    # ViTForImageClassification keeps the encoder under `vit.`, its classifier outside it.
    get = NamedArrays(arrays, ("vit." if "vit.embeddings.cls_token" in arrays else "", ""))
    params = _encoder(get, fields["depth"], fields["qkv_bias"])
    representation, num_classes = _pooler_and_classifier(get, params, hc, config_file)
    get.check(str(folder), "Hugging Face ViT")
    warnings = get.account_for(str(folder), _skipped_why, what="folder")
    proj = get("embeddings.patch_embeddings.projection.weight")  # (D, C, ph, pw)
    try:
        config = ViTConfig(
            width=proj.shape[0], mlp_dim=params["blocks"][0]["mlp"]["fc1"]["kernel"].shape[1],
            patch_size=proj.shape[2:], in_channels=proj.shape[1], num_classes=num_classes,
            representation_size=representation, posemb_resize=METHOD_OF_SOURCE["hf"], **fields)
    except ConfigError as err:  # the weights and config.json disagree
        assumed = ("" if "num_attention_heads" in hc else
                   " (num_attention_heads is not in it: 12 was assumed, as transformers does)")
        raise CheckpointError(f"{config_file}: does not fit the weights{assumed}: {err}; fix "
                              "config.json") from None
    warning = zero_head_warning(params)
    return LoadedCheckpoint(
        config=config, params=params,
        preprocessing=_preprocessing(folder, config.image_size),
        labels=_labels(hc, num_classes, config_file), source=f"{folder} (Hugging Face ViT)",
        warnings=warnings + ([warning] if warning else []), family="hf")


# Arrays a transformers ViT file may hold that its classifier does not use, and why: skipped,
# and the reader says so once. ViTForImageClassification ignores a pooler the file carries; the
# mask token is for masked-image pretraining (ViTForMaskedImageModeling's input only).
NOT_A_CLASSIFIER = (
    ("pooler.", "the pooler, which ViTForImageClassification does not use"),
    ("embeddings.mask_token", "the mask token of masked-image pretraining"),
)


def _skipped_why(key: str) -> str | None:
    bare = key.removeprefix("vit.")
    return next((why for prefix, why in NOT_A_CLASSIFIER if bare.startswith(prefix)), None)


def _config_fields(hc: dict, config_file: Path) -> dict:
    """The ViTConfig fields `config.json` sets, with transformers' defaults for absent ones."""
    act = hc.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACTS:
        raise CheckpointError(f"{config_file}: hidden_act {act!r} is not supported; "
                              f"supported: {', '.join(ACTS)}")
    qkv_bias = hc.get("qkv_bias", True)
    if not isinstance(qkv_bias, bool):
        raise field_error(config_file, "qkv_bias", qkv_bias, "true or false")
    return {
        "depth": json_int(config_file, "num_hidden_layers", hc.get("num_hidden_layers", 12)),
        "num_heads": json_int(config_file, "num_attention_heads",
                              hc.get("num_attention_heads", 12)),
        "qkv_bias": qkv_bias,
        "image_size": json_size(config_file, "image_size", hc.get("image_size", 224)),
        "layer_norm_eps": json_number(config_file, "layer_norm_eps",
                                      hc.get("layer_norm_eps", 1e-12), positive=True),
        "act_layer": ACTS[act]}


def _encoder(get: NamedArrays, depth: int, qkv_bias: bool) -> dict:
    """The embeddings, the `depth` blocks and the final norm, in our names."""
    linear, norm = torch_readers(get)
    params = {"patch_kernel": patch_kernel_of(get("embeddings.patch_embeddings.projection.weight")),
              "patch_bias": get("embeddings.patch_embeddings.projection.bias"),
              "cls_token": get("embeddings.cls_token"),
              "pos_embed": get("embeddings.position_embeddings")}
    blocks = {}
    for i in range(depth):
        layer = f"encoder.layer.{i}"
        sa = f"{layer}.attention.attention"
        qkv = [linear(f"{sa}.{n}", qkv_bias) for n in ("query", "key", "value")]
        blocks[i] = {
            "norm1": norm(f"{layer}.layernorm_before"),
            "attn": {"qkv": {k: _fused([part[k] for part in qkv]) for k in qkv[0]},
                     "proj": linear(f"{layer}.attention.output.dense")},
            "norm2": norm(f"{layer}.layernorm_after"),
            "mlp": {"fc1": linear(f"{layer}.intermediate.dense"),
                    "fc2": linear(f"{layer}.output.dense")},
        }
    params["blocks"] = blocks
    params["norm"] = norm("layernorm")
    return params


def _fused(parts: list[np.ndarray]) -> np.ndarray:
    """Separate query, key and value parameters as one fused `qkv` (outputs side by side);
    empty when one is missing, for the missing-keys error to name it."""
    if not all(part.size for part in parts):
        return np.zeros((0,), np.float32)
    return np.concatenate(parts, axis=-1)


def _pooler_and_classifier(get: NamedArrays, params: dict, hc: dict,
                           config_file: Path) -> tuple[int | None, int]:
    """Adds `ViTModel`'s pooler (our `pre_logits`) or the classifier (our `head`) to `params`;
    returns (representation size, number of classes)."""
    linear, _ = torch_readers(get)
    representation, num_classes = None, 0
    if get.has("pooler.dense.weight") and not get.has("classifier.weight"):
        if hc.get("pooler_act", "tanh") != "tanh":
            raise CheckpointError(f"{config_file}: pooler_act {hc['pooler_act']!r} is not "
                                  "supported (only tanh)")
        params["pre_logits"] = linear("pooler.dense")
        representation = params["pre_logits"]["kernel"].shape[1]
    if get.has("classifier.weight"):
        params["head"] = linear("classifier")
        num_classes = params["head"]["kernel"].shape[1]
    return representation, num_classes


def _labels(hc: dict, num_classes: int, config_file: Path) -> list[str] | None:
    id2label = hc.get("id2label") or {}
    if not isinstance(id2label, dict):
        return default_labels(num_classes)
    names = [id2label.get(str(i), id2label.get(i)) for i in range(num_classes)]
    if not num_classes or any(n is None for n in names):
        return default_labels(num_classes)
    if not all(isinstance(n, str) for n in names):
        raise field_error(config_file, "id2label", id2label, 'class names ({"0": "cat", ...})')
    if all(re.fullmatch(r"LABEL_\d+", n) for n in names):  # transformers' placeholders
        return default_labels(num_classes)
    return names


def _preprocessing(folder: Path, image: tuple[int, int]) -> Preprocessing:
    """`preprocessor_config.json` (ViTImageProcessor), else its defaults at the model's size.

    As in transformers, a field that is null takes its default, and one number for image_mean
    or image_std stands for every channel.
    """
    file = folder / "preprocessor_config.json"
    if not file.exists():
        return Preprocessing(size=image)
    pc = {k: v for k, v in read_json_object(file).items() if v is not None}
    size = _size_dict(file, "size", pc.get("size", {}), "shortest_edge")
    crop = None
    if pc.get("do_center_crop") and "crop_size" in pc:
        crop = _size_dict(file, "crop_size", pc["crop_size"], "square")
        if "height" not in crop:
            raise field_error(file, "crop_size", pc["crop_size"],
                              '{"height": H, "width": W}')
        crop = crop["height"], crop["width"]
    if "height" in size:
        target, crop_pct = (size["height"], size["width"]), None
        if crop:
            target, crop_pct = crop, crop[0] / size["height"]
    elif "shortest_edge" in size:
        target = crop or (size["shortest_edge"],) * 2
        crop_pct = target[0] / size["shortest_edge"] if crop else None
    else:
        target, crop_pct = image, None
    if pc.get("do_normalize", True):
        mean = json_numbers(file, "image_mean", pc.get("image_mean", [0.5] * 3), allow_scalar=True)
        std = json_numbers(file, "image_std", pc.get("image_std", [0.5] * 3), allow_scalar=True)
    else:
        mean, std = [0.0] * 3, [1.0] * 3
    scale = 255.0
    if pc.get("do_rescale", True):
        scale = json_number(file, "rescale_factor", pc.get("rescale_factor", 1 / 255),
                            positive=True) * 255
    # x * rescale_factor = (x / 255) * scale: fold the scale into mean and std.
    mean, std = [m / scale for m in mean], [s / scale for s in std]
    resample = pc.get("resample", 2)
    if isinstance(resample, bool) or not isinstance(resample, int) or resample not in PIL_RESAMPLE:
        raise field_error(file, "resample", resample, "a PIL resampling code (0 to 5)")
    try:
        return Preprocessing(size=tuple(target), resample=PIL_RESAMPLE[resample],
                             crop_pct=crop_pct, mean=mean, std=std)
    except (ConfigError, DataError) as err:
        raise CheckpointError(f"{file}: {err}; fix or replace the file") from None


def _size_dict(file: Path, field: str, value, number_means: str) -> dict[str, int]:
    """A ViTImageProcessor size as transformers' `get_size_dict` reads it: a dict with height
    and width or shortest_edge, a [height, width] list, or one number (`number_means`:
    "shortest_edge", or "square" for height = width)."""
    if isinstance(value, dict):
        known = {k: value[k] for k in ("height", "width", "shortest_edge") if k in value}
        if ("height" in known) != ("width" in known):
            raise field_error(file, field, value, 'a size ({"height": H, "width": W})')
        return {k: json_int(file, f"{field}.{k}", v) for k, v in known.items()}
    if isinstance(value, list) and len(value) == 2:
        height, width = json_size(file, field, value)
        return {"height": height, "width": width}
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return {"height": value, "width": value} if number_means == "square" else {
            number_means: value}
    return _bad_size(file, field, value)


def _bad_size(file: Path, field: str, value):
    raise field_error(file, field, value, 'a size in pixels (a whole number, [height, width], '
                      '{"height": H, "width": W} or {"shortest_edge": S})')


# -- writing ----------------------------------------------------------------------------------
def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    """The properties of `loaded` that a Hugging Face ViT folder (transformers'
    `ViTForImageClassification` / `ViTModel` and `ViTImageProcessor`) cannot say."""
    cfg, problems = loaded.config, []
    if cfg.classifier != "token":
        problems.append(f"a '{cfg.classifier}' head")
    if cfg.num_registers:
        problems.append(f"{cfg.num_registers} register tokens")
    if cfg.layer_scale is not None:
        problems.append("layer scale")
    if cfg.qk_norm:
        problems.append("qk-norm")
    if cfg.posemb != "learn":
        problems.append(f"{cfg.posemb} position embeddings")
    if cfg.representation_size and cfg.num_classes:
        problems.append("a pre-logits layer before a classifier")
    if cfg.patch_size[0] != cfg.patch_size[1]:
        problems.append(f"non-square patches {cfg.patch_size}")
    if loaded.preprocessing.crop_pct is not None:
        problems.append(f"preprocessing crop_pct {loaded.preprocessing.crop_pct:g} "
                        "(ViTImageProcessor resizes without a crop)")
    return problems


def write(loaded: LoadedCheckpoint, dst) -> list[str]:
    cfg, p = loaded.config, loaded.params
    refuse_text(cfg, "a Hugging Face ViT folder")
    problems = cannot_hold(loaded)
    if problems:
        raise CheckpointError(f"a Hugging Face ViT folder cannot hold {'; '.join(problems)}: "
                              "use --format timm or orbax (orbax keeps everything)"
                              + lossy_hint(loaded, "hf", cannot_hold))
    classify = cfg.num_classes > 0
    prefix = "vit." if classify else ""
    out = {}
    put_linear, put_norm = torch_writers(out, prefix)
    out[f"{prefix}embeddings.cls_token"] = p["cls_token"]
    out[f"{prefix}embeddings.position_embeddings"] = p["pos_embed"]
    out[f"{prefix}embeddings.patch_embeddings.projection.weight"] = conv_of(p["patch_kernel"])
    out[f"{prefix}embeddings.patch_embeddings.projection.bias"] = p["patch_bias"]
    for i in range(cfg.depth):
        b, layer = p["blocks"][i], f"encoder.layer.{i}"
        qkv = b["attn"]["qkv"]
        for name, w in zip(("query", "key", "value"), np.split(np.asarray(qkv["kernel"]), 3, 1),
                           strict=True):
            out[f"{prefix}{layer}.attention.attention.{name}.weight"] = w.T
        if cfg.qkv_bias:
            for name, bias in zip(("query", "key", "value"), np.split(np.asarray(qkv["bias"]), 3),
                                  strict=True):
                out[f"{prefix}{layer}.attention.attention.{name}.bias"] = bias
        put_linear(f"{layer}.attention.output.dense", b["attn"]["proj"])
        put_linear(f"{layer}.intermediate.dense", b["mlp"]["fc1"])
        put_linear(f"{layer}.output.dense", b["mlp"]["fc2"])
        put_norm(f"{layer}.layernorm_before", b["norm1"])
        put_norm(f"{layer}.layernorm_after", b["norm2"])
    put_norm("layernorm", p["norm"])
    if classify:
        out["classifier.weight"], out["classifier.bias"] = np.asarray(p["head"]["kernel"]).T, \
            p["head"]["bias"]
    elif cfg.representation_size:
        out["pooler.dense.weight"] = np.asarray(p["pre_logits"]["kernel"]).T
        out["pooler.dense.bias"] = p["pre_logits"]["bias"]

    labels = loaded.labels or [f"LABEL_{i}" for i in range(cfg.num_classes)]
    hc = {
        "architectures": ["ViTForImageClassification" if classify else "ViTModel"],
        "model_type": "vit", "hidden_size": cfg.width, "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu" if cfg.act_layer == "gelu" else "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": cfg.layer_norm_eps, "image_size": cfg.image_size[0]
        if cfg.image_size[0] == cfg.image_size[1] else list(cfg.image_size),
        "patch_size": cfg.patch_size[0], "num_channels": cfg.in_channels,
        "qkv_bias": cfg.qkv_bias, "pooler_output_size": cfg.representation_size or cfg.width,
        "pooler_act": "tanh", "initializer_range": 0.02, "encoder_stride": cfg.patch_size[0],
    }
    if classify:
        hc["id2label"] = {str(i): name for i, name in enumerate(labels)}
        hc["label2id"] = {name: i for i, name in enumerate(labels)}
    with staged(dst) as tmp:
        tmp.mkdir()
        write_safetensors(out, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(hc, indent=2) + "\n")
        (tmp / "preprocessor_config.json").write_text(
            json.dumps(_preprocessor_config(loaded.preprocessing), indent=2) + "\n")
    return []


def _preprocessor_config(pre: Preprocessing) -> dict:
    pil = {name: code for code, name in PIL_RESAMPLE.items()}
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": pre.size[0], "width": pre.size[1]},
            "resample": pil[pre.resample], "do_rescale": True, "rescale_factor": 1 / 255,
            "do_normalize": True, "image_mean": list(pre.mean), "image_std": list(pre.std)}
