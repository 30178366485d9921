"""timm's ViT weights: its state-dict layout in safetensors, and its model names.

Keys: `patch_embed.proj` (OIHW), `cls_token`, `reg_token`, `pos_embed`, `blocks.{i}.norm1`,
`attn.qkv` (fused, output rows laid out (3, heads, head_dim) like ours), `attn.q_norm/k_norm`,
`attn.proj`, `ls1.gamma`, `norm2`, `mlp.fc1/fc2`, `ls2.gamma`, `norm`, `attn_pool.*` (a MAP
head), `head`. The hub's timm repos carry a `config.json` with `architecture`, `model_args` and
`pretrained_cfg` (input size, interpolation, mean/std, crop_pct). timm uses exact GELU and
LayerNorm eps 1e-6.

`pos_embed` holds rows for the prefix tokens unless timm's `no_embed_class` is set; our model
gives registers no position, so register rows are folded into the register tokens (one float
addition either way, so the outputs stay bit-identical).
"""

from __future__ import annotations

import json
import math
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
from vit.checkpoints.safetensors_io import read_safetensors, write_safetensors
from vit.checkpoints.torch_tensors import conv_of, patch_kernel_of, torch_readers, torch_writers
from vit.errors import CheckpointError, ConfigError, DataError
from vit.models.config import WIDTHS, ViTConfig, variant_config
from vit.models.posemb import METHOD_OF_SOURCE
from vit.preprocess import RESAMPLE, Preprocessing

TIMM_SIZE_NAMES = {"Ti": "tiny", "S": "small", "M": "medium", "B": "base", "L": "large",
                   "H": "huge", "g": "giant", "G": "gigantic"}
LAYER_SCALE_INIT = 1e-5  # only the initial value: loaded weights replace it
HUB_ORG = "timm"


def is_timm_keys(keys) -> bool:
    return any(k.startswith(("patch_embed.proj.", "blocks.0.attn.qkv.")) for k in keys)


def is_timm_name(name: str) -> bool:
    """`vit_base_patch16_224` or `vit_base_patch16_224.augreg2_in21k_ft_in1k`."""
    return re.fullmatch(r"vit_\w+_patch\d+\w*(\.\w+)?", name) is not None


def hub_repo(name: str) -> str:
    """The hub repository timm publishes a model name under."""
    return f"{HUB_ORG}/{name}"


def timm_name(cfg: ViTConfig) -> str:
    """The timm architecture name of a config (`vit_base_patch16_224`), when it has one."""
    dims = (cfg.width, cfg.depth, cfg.mlp_dim, cfg.num_heads)
    size = next((s for s, w in WIDTHS.items() if w == dims and s in TIMM_SIZE_NAMES), None)
    if size is None or cfg.patch_size[0] != cfg.patch_size[1]:
        return "vit_custom"
    return f"vit_{TIMM_SIZE_NAMES[size]}_patch{cfg.patch_size[0]}_{cfg.image_size[0]}"


# -- reading ----------------------------------------------------------------------------------
def _config_file(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / "config.json"


def _timm_config(path: Path) -> dict:
    file = _config_file(path)
    if not file.exists():
        return {}
    tc = read_json_object(file)
    for key in ("model_args", "pretrained_cfg"):
        if not isinstance(tc.get(key, {}), dict):
            raise CheckpointError(f"{file}: {key} is not a JSON object; fix or replace the file")
    return tc


def _heads(tc: dict, width: int, arrays: dict, warnings: list[str], file: Path) -> int:
    if "num_heads" in tc.get("model_args", {}):
        return json_int(file, "model_args.num_heads", tc["model_args"]["num_heads"])
    if "blocks.0.attn.q_norm.weight" in arrays:
        return width // arrays["blocks.0.attn.q_norm.weight"].shape[0]
    arch = tc.get("architecture", "")
    if isinstance(arch, str) and is_timm_name(arch):
        try:
            cfg = variant_config(arch.split(".")[0])
        except ConfigError:  # a timm name we have no variant for: the width decides below
            cfg = None
        if cfg is not None and cfg.width == width:
            return cfg.num_heads
    for w, _, _, heads in WIDTHS.values():
        if w == width:
            return heads
    warnings.append(f"number of heads unknown (no config.json): assumed {width // 64} "
                    "(head_dim 64)")
    return max(width // 64, 1)


def read(path: Path) -> LoadedCheckpoint:
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    arrays = read_safetensors(file)
    tc, config_file = _timm_config(path), _config_file(path)
    args = tc.get("model_args", {})
    get, warnings = NamedArrays(arrays), []
    linear, norm = torch_readers(get)
    if not get.has("patch_embed.proj.weight"):
        raise CheckpointError(f"{file}: unknown timm layout: expected keys missing: "
                              f"patch_embed.proj.weight, blocks.0.attn.qkv.weight")
    proj = get("patch_embed.proj.weight")  # (D, C, ph, pw)
    params = {"patch_kernel": patch_kernel_of(proj), "patch_bias": get("patch_embed.proj.bias")}
    class_token = get.has("cls_token")
    if class_token:
        params["cls_token"] = get("cls_token")
    registers = arrays["reg_token"].shape[1] if get.has("reg_token") else 0
    if registers:
        params["reg_tokens"] = get("reg_token")
    params["blocks"], block_fields = _blocks(get)
    params["norm"] = norm("norm")
    grid = _grid(tc, arrays, proj.shape[2:], int(class_token) + registers, str(file), config_file)
    if get.has("pos_embed"):
        params.update(_split_posemb(get("pos_embed"), grid, class_token, registers,
                                    params.get("reg_tokens")))
    classifier = _pooling(get, params, args, tc, class_token, registers, file)
    num_classes = 0
    if get.has("head.weight"):
        params["head"] = linear("head")
        num_classes = params["head"]["kernel"].shape[1]
    get.check(str(file), "timm")
    if get.unused():  # fc_norm, norm_pre, attn_pool.q_norm, ...: a different model than ours
        raise CheckpointError(f"{file}: timm keys not supported by this ViT: "
                              f"{', '.join(get.unused()[:6])}")
    heads = _heads(tc, proj.shape[0], arrays, warnings, config_file)
    layer_scale = None
    if get.has("blocks.0.ls1.gamma"):
        layer_scale = json_number(config_file, "model_args.init_values",
                                  args.get("init_values") or LAYER_SCALE_INIT)
    try:
        config = ViTConfig(
            width=proj.shape[0], num_heads=heads, patch_size=proj.shape[2:],
            image_size=(grid[0] * proj.shape[2], grid[1] * proj.shape[3]),
            in_channels=proj.shape[1], num_classes=num_classes, class_token=class_token,
            classifier=classifier, num_registers=registers,
            posemb="learn" if get.has("pos_embed") else "sincos2d", layer_norm_eps=1e-6,
            gelu="tanh" if args.get("act_layer") == "gelu_tanh" else "exact",
            dynamic_image_size=bool(args.get("dynamic_img_size", False)),
            layer_scale=layer_scale, posemb_resize=METHOD_OF_SOURCE["timm"], **block_fields)
    except ConfigError as err:  # the weights and config.json disagree
        raise CheckpointError(f"{file}: does not fit {config_file}: {err}; fix config.json"
                              ) from None
    warning = zero_head_warning(params)
    labels = _label_names(tc, num_classes, file) or default_labels(num_classes)
    return LoadedCheckpoint(
        config=config, params=params,
        preprocessing=_preprocessing(tc, config.image_size, config_file),
        labels=list(labels) if labels else None, source=f"{path} (timm safetensors)",
        warnings=warnings + ([warning] if warning else []), family="timm")


def _blocks(get: NamedArrays) -> tuple[dict, dict]:
    """(the blocks in our names, the ViTConfig fields their keys decide)."""
    linear, norm = torch_readers(get)
    depth = 0
    while get.has(f"blocks.{depth}.norm1.weight"):
        depth += 1
    qkv_bias = get.has("blocks.0.attn.qkv.bias")
    qk_norm = get.has("blocks.0.attn.q_norm.weight")
    layer_scale = get.has("blocks.0.ls1.gamma")
    blocks = {}
    for i in range(depth):
        b = f"blocks.{i}"
        attn = {"qkv": linear(f"{b}.attn.qkv", qkv_bias), "proj": linear(f"{b}.attn.proj")}
        if qk_norm:
            attn["q_norm"], attn["k_norm"] = norm(f"{b}.attn.q_norm"), norm(f"{b}.attn.k_norm")
        blocks[i] = {"norm1": norm(f"{b}.norm1"), "attn": attn, "norm2": norm(f"{b}.norm2"),
                     "mlp": {"fc1": linear(f"{b}.mlp.fc1"), "fc2": linear(f"{b}.mlp.fc2")}}
        if layer_scale:
            blocks[i]["ls1"] = {"gamma": get(f"{b}.ls1.gamma")}
            blocks[i]["ls2"] = {"gamma": get(f"{b}.ls2.gamma")}
    mlp_dim = blocks[0]["mlp"]["fc1"]["kernel"].shape[1] if depth else 0
    return blocks, {"depth": depth, "mlp_dim": mlp_dim, "qkv_bias": qkv_bias, "qk_norm": qk_norm}


def _pooling(get: NamedArrays, params: dict, args: dict, tc: dict, class_token: bool,
             registers: int, file: Path) -> str:
    """The classifier (`token`, `gap` or `map`, whose attention-pool head joins `params`)."""
    linear, norm = torch_readers(get)
    classifier = "token" if class_token else "gap"
    if tc.get("global_pool", args.get("global_pool")) == "avg":
        classifier = "gap"
    if get.has("attn_pool.latent"):
        classifier = "map"
        probe = get("attn_pool.latent")
        if probe.shape[1] != 1:
            raise CheckpointError(f"{file}: attn_pool with {probe.shape[1]} latents is not "
                                  "supported (only 1)")
        params["map_head"] = {"probe": probe, "q": linear("attn_pool.q"),
                              "kv": linear("attn_pool.kv"), "proj": linear("attn_pool.proj"),
                              "norm": norm("attn_pool.norm"),
                              "mlp": {"fc1": linear("attn_pool.mlp.fc1"),
                                      "fc2": linear("attn_pool.mlp.fc2")}}
    # Recent timm pools the patch tokens only unless `pool_include_prefix`; our MAP head
    # attends to every token and our 'gap' averages the patches only.
    include_prefix = args.get("pool_include_prefix")
    if (include_prefix is not None and classifier != "token" and int(class_token) + registers
            and bool(include_prefix) != (classifier == "map")):
        raise CheckpointError(f"{file}: model_args.pool_include_prefix={include_prefix} pools "
                              f"differently from this ViT's '{classifier}' head (its 'map' "
                              "attends to the class and register tokens too, its 'gap' "
                              "averages the patches only)")
    return classifier


def _label_names(tc: dict, num_classes: int, where) -> list[str] | None:
    """timm's `label_names`: a list, or a dict {index: name} when ids have gaps."""
    names = tc.get("label_names")
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i)) for i in range(num_classes)]
    if not names:
        return None
    if len(names) != num_classes or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{where}: label_names does not name each of the {num_classes} "
                              "classes once; fix config.json")
    return list(names)


def _grid(tc: dict, arrays: dict, patch: tuple[int, int], prefix: int,
          where: str, config_file: Path) -> tuple[int, int]:
    """The patch grid: from the config's input size, else from a square `pos_embed`."""
    # The model's own size first: the eval transform's input_size may differ from it.
    field = "model_args.img_size"
    size = tc.get("model_args", {}).get("img_size")
    if not size:
        field, size = "pretrained_cfg.input_size", tc.get("pretrained_cfg", {}).get("input_size")
    rows = arrays["pos_embed"].shape[1] if "pos_embed" in arrays else None
    if size:
        size = json_size(config_file, field, size)
        grid = size[0] // patch[0], size[1] // patch[1]
        if rows is None or rows - grid[0] * grid[1] in (0, prefix):
            return grid
    if rows is None:
        return 224 // patch[0], 224 // patch[1]
    for n in (rows - prefix, rows):
        side = math.isqrt(max(n, 0))
        if side * side == n:
            return side, side
    raise CheckpointError(f"{where}: pos_embed has {rows} rows, not a square grid; add a "
                          "config.json with pretrained_cfg.input_size")


def _split_posemb(pe: np.ndarray, grid: tuple[int, int], class_token: bool, registers: int,
                  reg_tokens: np.ndarray | None) -> dict[str, np.ndarray]:
    """timm's pos_embed -> ours: [class row, patches]; register rows folded into the tokens."""
    d = pe.shape[-1]
    embedded_prefix = pe.shape[1] - grid[0] * grid[1]
    out = {}
    if embedded_prefix == 0:  # no_embed_class: prefix tokens get no position
        cls_row = np.zeros((1, 1, d), np.float32)
    else:
        cls_row = pe[:, :1]
        if registers:
            regs = pe[:, int(class_token):embedded_prefix]
            out["reg_tokens"] = (reg_tokens + regs).astype(np.float32)
    patches = pe[:, embedded_prefix:]
    out["pos_embed"] = np.concatenate([cls_row, patches], 1) if class_token else patches
    return out


def _preprocessing(tc: dict, image: tuple[int, int], file: Path) -> Preprocessing:
    # As timm's resolve_data_config: a null field takes its default.
    pc = {k: v for k, v in tc.get("pretrained_cfg", {}).items() if v is not None}
    if not pc:  # timm's default for ViTs: [-1, 1], bicubic, crop 0.9
        return Preprocessing(size=image, resample="bicubic", crop_pct=0.9)
    field = "pretrained_cfg."
    size = json_size(file, field + "input_size", pc.get("input_size", [3, *image]))
    # crop_mode "squash" resizes straight to the size: our crop_pct=None.
    crop_pct = None
    if pc.get("crop_mode") != "squash":
        crop_pct = json_number(file, field + "crop_pct", pc.get("crop_pct", 0.9), positive=True)
    resample = pc.get("interpolation", "bicubic")
    if not isinstance(resample, str) or resample not in RESAMPLE:
        raise field_error(file, field + "interpolation", resample, f"one of {', '.join(RESAMPLE)}")
    mean = json_numbers(file, field + "mean", pc.get("mean", [0.5] * 3))
    std = json_numbers(file, field + "std", pc.get("std", [0.5] * 3))
    try:
        return Preprocessing(size=size, resample=resample, crop_pct=crop_pct, mean=mean, std=std)
    except (ConfigError, DataError) as err:
        raise CheckpointError(f"{file}: {err}; fix or replace the file") from None


# -- writing ----------------------------------------------------------------------------------
BARE_FILE = ("a bare .safetensors file cannot hold the GELU form, the pooling, the "
             "preprocessing or the labels (they live in timm's config.json): write a folder "
             "instead, e.g. `vit convert SRC my-model --format timm`")


def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    """The properties of `loaded` that a timm folder (`config.json` + `model.safetensors`)
    cannot say to timm's `VisionTransformer`."""
    cfg, problems = loaded.config, []
    if cfg.representation_size:
        problems.append("a pre-logits (representation) layer")
    if cfg.posemb != "learn":
        problems.append(f"{cfg.posemb} position embeddings (timm's ViT learns them)")
    if cfg.layer_norm_eps != 1e-6:
        problems.append(f"LayerNorm eps {cfg.layer_norm_eps:g} (timm's ViT uses 1e-6)")
    return problems


def write(loaded: LoadedCheckpoint, dst) -> list[str]:
    """A folder with `model.safetensors` and timm's `config.json` (`architecture`,
    `model_args`, `pretrained_cfg`, `label_names`), as timm's `push_to_hf_hub` writes it."""
    cfg, p = loaded.config, loaded.params
    refuse_text(cfg, "timm's ViT")
    if Path(dst).suffix == ".safetensors":
        raise CheckpointError(f"{dst}: {BARE_FILE}")
    problems = cannot_hold(loaded)
    if problems:
        raise CheckpointError(f"timm's ViT cannot hold {'; '.join(problems)}: use --format "
                              "orbax, which keeps everything"
                              + lossy_hint(loaded, "timm", cannot_hold))
    out = {}
    put_linear, put_norm = torch_writers(out)
    out["patch_embed.proj.weight"] = conv_of(p["patch_kernel"])
    out["patch_embed.proj.bias"] = p["patch_bias"]
    if cfg.class_token:
        out["cls_token"] = p["cls_token"]
    if cfg.num_registers:
        out["reg_token"] = p["reg_tokens"]
    pe = p["pos_embed"]
    if cfg.num_registers:  # registers get zero rows: x + 0 leaves them exact
        n_cls = int(cfg.class_token)
        zeros = np.zeros((1, cfg.num_registers, cfg.width), np.float32)
        pe = np.concatenate([pe[:, :n_cls], zeros, pe[:, n_cls:]], 1)
    out["pos_embed"] = pe
    for i in range(cfg.depth):
        b, name = p["blocks"][i], f"blocks.{i}"
        put_norm(f"{name}.norm1", b["norm1"])
        put_linear(f"{name}.attn.qkv", b["attn"]["qkv"])
        put_linear(f"{name}.attn.proj", b["attn"]["proj"])
        if cfg.qk_norm:
            put_norm(f"{name}.attn.q_norm", b["attn"]["q_norm"])
            put_norm(f"{name}.attn.k_norm", b["attn"]["k_norm"])
        put_norm(f"{name}.norm2", b["norm2"])
        put_linear(f"{name}.mlp.fc1", b["mlp"]["fc1"])
        put_linear(f"{name}.mlp.fc2", b["mlp"]["fc2"])
        if cfg.layer_scale is not None:
            out[f"{name}.ls1.gamma"] = b["ls1"]["gamma"]
            out[f"{name}.ls2.gamma"] = b["ls2"]["gamma"]
    put_norm("norm", p["norm"])
    if cfg.classifier == "map":
        m = p["map_head"]
        out["attn_pool.latent"] = m["probe"]
        for part in ("q", "kv", "proj"):
            put_linear(f"attn_pool.{part}", m[part])
        put_norm("attn_pool.norm", m["norm"])
        put_linear("attn_pool.mlp.fc1", m["mlp"]["fc1"])
        put_linear("attn_pool.mlp.fc2", m["mlp"]["fc2"])
    if cfg.num_classes:
        put_linear("head", p["head"])
    with staged(dst) as tmp:
        tmp.mkdir()
        write_safetensors(out, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(_timm_config_json(loaded), indent=2) + "\n")
    return []


def _timm_config_json(loaded: LoadedCheckpoint) -> dict:
    """timm's hub `config.json`: `model_args` rebuild the architecture in
    `timm.create_model(architecture, **model_args)`; `pretrained_cfg` holds the eval transform."""
    cfg, pre = loaded.config, loaded.preprocessing
    pool = {"token": "token", "gap": "avg", "map": "map"}[cfg.classifier]
    patch = cfg.patch_size[0] if cfg.patch_size[0] == cfg.patch_size[1] else list(cfg.patch_size)
    args = {"img_size": list(cfg.image_size), "patch_size": patch,
            "in_chans": cfg.in_channels, "embed_dim": cfg.width, "depth": cfg.depth,
            "num_heads": cfg.num_heads, "mlp_ratio": cfg.mlp_dim / cfg.width,
            "qkv_bias": cfg.qkv_bias, "qk_norm": cfg.qk_norm, "init_values": cfg.layer_scale,
            "class_token": cfg.class_token, "reg_tokens": cfg.num_registers,
            "no_embed_class": False, "global_pool": pool, "fc_norm": False,
            # our MAP head attends to every token; our 'gap' averages the patches only
            "pool_include_prefix": cfg.classifier == "map" and cfg.num_prefix_tokens > 0,
            "dynamic_img_size": cfg.dynamic_image_size}
    if cfg.gelu == "tanh":
        args["act_layer"] = "gelu_tanh"
    out = {"architecture": timm_name(cfg), "num_classes": cfg.num_classes,
           "num_features": cfg.width, "global_pool": pool, "model_args": args,
           "pretrained_cfg": {"input_size": [cfg.in_channels, *pre.size],
                              "fixed_input_size": not cfg.dynamic_image_size,
                              "interpolation": pre.resample, "mean": list(pre.mean),
                              "std": list(pre.std), "crop_pct": pre.crop_pct or 1.0,
                              "crop_mode": "squash" if pre.crop_pct is None else "center",
                              "num_classes": cfg.num_classes, "pool_size": None,
                              "first_conv": "patch_embed.proj",
                              "classifier": "head" if cfg.num_classes else None}}
    if loaded.labels:
        out["label_names"] = list(loaded.labels)
    return out
