"""Hugging Face folders (`config.json` + `model.safetensors` [+ `preprocessor_config.json`]).

`config.json`'s `model_type` picks the family that reads the arrays: `hf_vit` (vit, deit),
`hf_dinov2` (dinov2), `hf_clip` (clip, clip_vision_model, siglip, siglip_vision_model) and
`hf_beit` (beit, data2vec-vision); any other type is refused in one line naming these. Keys are
read as `save_pretrained` writes them (transformers 5 renames modules in memory, not on disk);
linear weights are `(out, in)`, the patch projection an OIHW convolution. Heads, epsilon and
activation come from `config.json` (heads cannot be read from the shapes). The image is prepared
as that model type's transformers image processor prepares it (`Preprocessing.from_hf`).

Writing picks the first family, in `WRITE_ORDER`, that holds every property of the model, and
writes the class of it that computes the same output; a model no family holds is refused,
naming what the nearest one cannot hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import vit.checkpoints.hf_beit as hf_beit
import vit.checkpoints.hf_clip as hf_clip
import vit.checkpoints.hf_dinov2 as hf_dinov2
import vit.checkpoints.hf_vit as hf_vit
from vit.checkpoints.files import field_error, read_json_object, staged
from vit.checkpoints.labels import default_labels
from vit.checkpoints.loaded import LoadedCheckpoint, refuse_text, zero_head_warning
from vit.checkpoints.lossy import lossy_hint
from vit.checkpoints.safetensors_io import read_safetensors_folder, write_safetensors
from vit.errors import CheckpointError, ConfigError
from vit.models.config import ViTConfig
from vit.models.posemb import METHOD_OF_SOURCE
from vit.preprocess import Preprocessing

FAMILIES = {model_type: family for family in (hf_vit, hf_dinov2, hf_clip, hf_beit)
            for model_type in family.MODEL_TYPES}
# The families a model is written as, first fit first: a plain ViT stays `vit`.
WRITE_ORDER = (("vit", hf_vit), ("deit", hf_vit), ("dinov2", hf_dinov2), ("clip", hf_clip),
               ("siglip", hf_clip), ("beit", hf_beit))


# -- reading ----------------------------------------------------------------------------------
def is_hf_keys(keys) -> bool:
    """Whether safetensors keys look like a transformers vision model's."""
    return any(".patch_embedding" in k and k.split(".")[0] in (
        "embeddings", "vit", "deit", "dinov2", "beit", "data2vec_vision", "vision_model")
        for k in keys)


def read(folder: Path) -> LoadedCheckpoint:
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.exists():
        raise CheckpointError(f"{folder}: no config.json beside the weights; a Hugging Face model "
                              "needs it (model_type, num_attention_heads, layer_norm_eps, "
                              "hidden_act)")
    hc = read_json_object(config_file)
    model_type = hc.get("model_type", "vit")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise CheckpointError(f"{config_file}: model_type {model_type!r} is not read; supported: "
                              f"{', '.join(FAMILIES)}")
    arrays = read_safetensors_folder(folder)
    got = family.read(model_type, hc, arrays, config_file)
    got.get.check(str(folder), f"Hugging Face {model_type}")
    warnings = got.get.account_for(str(folder), got.skipped_why, what="folder")
    preprocessing = _preprocessing(folder, got.fields["image_size"], model_type)
    if hasattr(family, "at_input"):
        family.at_input(got, preprocessing.size, config_file)
    params = got.params
    kernel = params["patch_kernel"]  # (ph, pw, C, D)
    num_classes = params["head"]["kernel"].shape[1] if "head" in params else 0
    try:
        config = ViTConfig(
            width=kernel.shape[3], mlp_dim=params["blocks"][0]["mlp"]["fc1"]["kernel"].shape[1],
            patch_size=kernel.shape[:2], in_channels=kernel.shape[2], num_classes=num_classes,
            posemb_resize=METHOD_OF_SOURCE["hf"], **got.fields)
    except ConfigError as err:  # the weights and config.json disagree
        tower = hc.get("vision_config") if model_type in ("clip", "siglip") else hc
        stated = isinstance(tower, dict) and tower.get("num_attention_heads") is not None
        assumed = "" if stated else (" (num_attention_heads is not in it: 12 was assumed, as "
                                     "transformers does)")
        raise CheckpointError(f"{config_file}: does not fit the weights{assumed}: {err}; fix "
                              "config.json") from None
    warning = None if got.projection else zero_head_warning(params)
    labels = None if got.projection else _labels(hc, num_classes, config_file)
    return LoadedCheckpoint(
        config=config, params=params, preprocessing=preprocessing, labels=labels,
        source=f"{folder} (Hugging Face {got.arch})",
        warnings=warnings + got.notes + ([warning] if warning else []), family="hf")


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


def _preprocessing(folder: Path, image: tuple[int, int], model_type: str) -> Preprocessing:
    """What the model type's transformers image processor does with `preprocessor_config.json`;
    without the file, that processor's defaults at the model's size."""
    file = folder / "preprocessor_config.json"
    try:
        if file.exists():
            return Preprocessing.from_hf(read_json_object(file), model_type, file)
        return Preprocessing.from_hf({}, model_type, file).with_size(image)
    except ConfigError as err:
        raise CheckpointError(str(err)) from None


# -- writing ----------------------------------------------------------------------------------
def _problems(loaded: LoadedCheckpoint, model_type: str, family) -> list[str]:
    """What the `model_type` family (and its image processor) cannot hold of `loaded`."""
    problems = family.cannot_hold(loaded, model_type)
    pre = loaded.preprocessing
    try:
        pre.to_hf_processor(model_type)
    except ConfigError:
        what = f"crop_pct {pre.crop_pct:g}, " if pre.crop_pct is not None else ""
        problems.append(f"preprocessing {what}{pre.describe_geometry()} (transformers' image "
                        "processors have no equal)")
    return problems


def _choose(loaded: LoadedCheckpoint) -> tuple[str, list[str]]:
    """The first model type that holds `loaded` and no problems, else the nearest type (fewest
    problems) and its problems."""
    nearest = None
    for model_type, family in WRITE_ORDER:
        problems = _problems(loaded, model_type, family)
        if not problems:
            return model_type, []
        if nearest is None or len(problems) < len(nearest[1]):
            nearest = model_type, problems
    return nearest


def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    """The properties of `loaded` that no Hugging Face folder here can say (those of the
    nearest model type); empty when one can."""
    return _choose(loaded)[1]


def write(loaded: LoadedCheckpoint, dst) -> list[str]:
    refuse_text(loaded.config, "a Hugging Face ViT folder")
    model_type, problems = _choose(loaded)
    if problems:
        raise CheckpointError(f"a Hugging Face ViT folder cannot hold {'; '.join(problems)} "
                              f"(nearest: model_type {model_type}): use --format timm or orbax "
                              "(orbax keeps everything)"
                              + lossy_hint(loaded, "hf", cannot_hold))
    arrays, hc, _ = dict(WRITE_ORDER)[model_type].write(loaded, model_type)
    processor = loaded.preprocessing.to_hf_processor(hc["model_type"])
    with staged(dst) as tmp:
        tmp.mkdir()
        write_safetensors(arrays, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(hc, indent=2) + "\n")
        (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return []
