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

import vit.checkpoints.timm_architectures as timm_architectures
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
from vit.models.config import WIDTHS, ViTConfig
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


def _heads_guess(width: int, warnings: list[str], why: str) -> int:
    """Heads for a file that does not say them: the standard ViT of that width, else 64-wide."""
    for w, _, _, heads in WIDTHS.values():
        if w == width:
            warnings.append(f"number of heads not stated ({why}): {heads}, as in the standard "
                            f"ViT {width} wide, assumed")
            return heads
    warnings.append(f"number of heads not stated ({why}): {max(width // 64, 1)} (head_dim 64) "
                    "assumed")
    return max(width // 64, 1)


# Arrays of timm's ViT that this model has no place for, and the option that makes them.
_OPTION_OF_ARRAY = {"fc_norm.": "fc_norm", "norm_pre.": "pre_norm", "attn_pool.q_norm":
                    "attn_pool with qk-norm", "patch_embed.norm.": "embed_norm_layer"}


def _arguments(tc: dict, arrays: dict, file: Path, config_file: Path,
               warnings: list[str]) -> tuple[dict, str | None]:
    """(timm's VisionTransformer arguments for this file, its architecture name or None).

    A named architecture means what timm means by it (`timm_architectures`); a file without
    one (no config.json, or none named) is read from its arrays and `model_args`."""
    model_args = tc.get("model_args", {})
    arch = tc.get("architecture")
    if arch is not None and not isinstance(arch, str):
        raise field_error(config_file, "architecture", arch, "a timm architecture name")
    arch = arch.split(".")[0] if arch else None  # `name.tag`: the tag names weights only
    if arch == timm_architectures.CUSTOM:  # not timm's: its model_args and arrays say it all
        arch = None
    width = arrays["patch_embed.proj.weight"].shape[0]
    if arch:
        args = timm_architectures.arguments(arch, model_args, config_file)
        bad = timm_architectures.unsupported(args)
        if bad:
            raise CheckpointError(f"{config_file}: timm architecture {arch} has "
                                  f"{'; '.join(bad)}, which this ViT does not have; it cannot "
                                  "be read exactly")
        return args, arch
    depth = 0
    while f"blocks.{depth}.norm1.weight" in arrays:
        depth += 1
    class_token = "cls_token" in arrays
    args = {**timm_architectures.DEFAULTS, "embed_dim": width, "depth": depth,
            "patch_size": list(arrays["patch_embed.proj.weight"].shape[2:]),
            "class_token": class_token,
            "reg_tokens": arrays["reg_token"].shape[1] if "reg_token" in arrays else 0,
            "qkv_bias": "blocks.0.attn.qkv.bias" in arrays,
            "qk_norm": "blocks.0.attn.q_norm.weight" in arrays,
            "init_values": LAYER_SCALE_INIT if "blocks.0.ls1.gamma" in arrays else None,
            "global_pool": ("map" if "attn_pool.latent" in arrays
                            else "token" if class_token else "avg"),
            "num_heads": None}
    args.update(model_args)
    args["fc_norm"] = bool(model_args.get("fc_norm", "fc_norm.weight" in arrays))
    if "pool_include_prefix" not in model_args:  # unstated: pooled as this ViT pools
        args["pool_include_prefix"] = args["global_pool"] == "map"
    if args["num_heads"] is None:
        if "blocks.0.attn.q_norm.weight" in arrays:
            args["num_heads"] = width // arrays["blocks.0.attn.q_norm.weight"].shape[0]
        else:
            why = ("no config.json beside the weights" if not config_file.exists() else
                   f"{config_file.name} names no architecture and no model_args.num_heads")
            args["num_heads"] = _heads_guess(width, warnings, why)
    bad = [b for b in timm_architectures.unsupported(args) if not b.startswith("fc_norm")]
    if bad:
        raise CheckpointError(f"{config_file}: model_args {'; '.join(bad)} build a model this "
                              "ViT does not have; it cannot be read exactly")
    return args, None


def _unused_error(file: Path, unused: list[str]) -> CheckpointError:
    options = sorted({option for key in unused for prefix, option in _OPTION_OF_ARRAY.items()
                      if key.startswith(prefix)})
    what = f" (timm's {', '.join(options)}, which this ViT does not have)" if options else ""
    more = f" and {len(unused) - 6} more" if len(unused) > 6 else ""
    return CheckpointError(f"{file}: arrays this ViT has no place for{what}: "
                           f"{', '.join(unused[:6])}{more}; the file cannot be read exactly")


def read(path: Path) -> LoadedCheckpoint:
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    arrays = read_safetensors(file)
    tc, config_file = _timm_config(path), _config_file(path)
    get, warnings = NamedArrays(arrays), []
    linear, norm = torch_readers(get)
    if not get.has("patch_embed.proj.weight"):
        raise CheckpointError(f"{file}: unknown timm layout: expected keys missing: "
                              f"patch_embed.proj.weight, blocks.0.attn.qkv.weight")
    args, arch = _arguments(tc, arrays, file, config_file, warnings)
    proj = get("patch_embed.proj.weight")  # (D, C, ph, pw)
    width, patch = proj.shape[0], tuple(proj.shape[2:])
    if arch:
        stated = {"embed_dim": width, "patch_size": patch, "in_chans": proj.shape[1]}
        for key, found in stated.items():
            want = args[key]
            want = tuple(want) if isinstance(want, list) else want
            if key == "patch_size" and isinstance(want, int):
                want = (want, want)
            if want != found:
                raise CheckpointError(f"{file}: the weights have {key} {found}, timm's {arch} "
                                      f"{want}; model_args.{key} in {config_file.name} would "
                                      "settle it, or the architecture is the wrong one")
    params = {"patch_kernel": patch_kernel_of(proj), "patch_bias": get("patch_embed.proj.bias")}
    class_token = bool(args["class_token"])
    if class_token:
        params["cls_token"] = get("cls_token")
    registers = json_int(config_file, "model_args.reg_tokens", args["reg_tokens"], minimum=0)
    if registers:
        params["reg_tokens"] = get("reg_token")
    depth = json_int(config_file, "model_args.depth", args["depth"])
    params["blocks"], block_fields = _blocks(get, depth, args)
    params["norm"] = norm("norm")
    no_embed_class = bool(args["no_embed_class"]) if arch else None
    arch_size = timm_architectures.ARCHITECTURES.get(arch, {}).get("img_size")
    grid = _grid(tc, arrays, patch, int(class_token) + registers, str(file), config_file,
                 no_embed_class, arch_size)
    # timm's ViT always learns a position embedding (pos_embed='none' is refused above).
    pos_embed = get("pos_embed")
    if pos_embed.size:
        params.update(_split_posemb(pos_embed, grid, class_token, registers,
                                    params.get("reg_tokens")))
    classifier = _pooling(get, params, args, class_token, registers, file)
    num_classes = 0
    if get.has("head.weight"):
        params["head"] = linear("head")
        num_classes = params["head"]["kernel"].shape[1]
    get.check(str(file), "timm")
    if get.unused():
        raise _unused_error(file, get.unused())
    layer_scale = None
    if args["init_values"] is not None:
        layer_scale = json_number(config_file, "model_args.init_values",
                                  args["init_values"] or LAYER_SCALE_INIT)
    try:
        config = ViTConfig(
            width=width, num_heads=json_int(config_file, "model_args.num_heads",
                                            args["num_heads"]),
            patch_size=patch, image_size=(grid[0] * patch[0], grid[1] * patch[1]),
            in_channels=proj.shape[1], num_classes=num_classes, class_token=class_token,
            classifier=classifier, num_registers=registers,
            posemb="learn",
            layer_norm_eps=timm_architectures.layer_norm_eps(args),
            act_layer=timm_architectures.gelu(args),
            dynamic_image_size=bool(args.get("dynamic_img_size", False)),
            layer_scale=layer_scale, posemb_resize=METHOD_OF_SOURCE["timm"], **block_fields)
    except ConfigError as err:  # the weights and config.json disagree
        raise CheckpointError(f"{file}: does not fit {config_file}"
                              f"{f' ({arch})' if arch else ''}: {err}; fix config.json"
                              ) from None
    warning = zero_head_warning(params)
    labels = _label_names(tc, num_classes, file) or default_labels(num_classes)
    named = f"timm {arch}" if arch else "timm safetensors"
    return LoadedCheckpoint(
        config=config, params=params,
        preprocessing=_preprocessing(tc, config.image_size, config_file),
        labels=list(labels) if labels else None, source=f"{path} ({named})",
        warnings=warnings + ([warning] if warning else []), family="timm")


def _blocks(get: NamedArrays, depth: int, args: dict) -> tuple[dict, dict]:
    """(the blocks in our names, the ViTConfig fields they decide)."""
    linear, norm = torch_readers(get)
    qkv_bias, qk_norm = bool(args["qkv_bias"]), bool(args["qk_norm"])
    layer_scale = args["init_values"] is not None
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
    fc1 = blocks[0]["mlp"]["fc1"]["kernel"] if depth else np.zeros((0,))
    mlp_dim = fc1.shape[1] if fc1.ndim == 2 else 1
    return blocks, {"depth": depth, "mlp_dim": mlp_dim, "qkv_bias": qkv_bias, "qk_norm": qk_norm}


def _pooling(get: NamedArrays, params: dict, args: dict, class_token: bool, registers: int,
             file: Path) -> str:
    """The classifier (`token`, `gap` or `map`, whose attention-pool head joins `params`)."""
    linear, norm = torch_readers(get)
    classifier = {"token": "token", "avg": "gap", "map": "map"}[args["global_pool"]]
    if classifier == "map":
        probe = get("attn_pool.latent")
        if probe.ndim == 3 and probe.shape[1] != 1:
            raise CheckpointError(f"{file}: attn_pool with {probe.shape[1]} latents is not "
                                  "supported (only 1)")
        params["map_head"] = {"probe": probe, "q": linear("attn_pool.q"),
                              "kv": linear("attn_pool.kv"), "proj": linear("attn_pool.proj"),
                              "norm": norm("attn_pool.norm"),
                              "mlp": {"fc1": linear("attn_pool.mlp.fc1"),
                                      "fc2": linear("attn_pool.mlp.fc2")}}
    # timm pools the patch tokens only unless `pool_include_prefix`; our MAP head attends to
    # every token and our 'gap' averages the patches only.
    include_prefix = bool(args["pool_include_prefix"])
    if (classifier != "token" and int(class_token) + registers
            and include_prefix != (classifier == "map")):
        raise CheckpointError(f"{file}: pool_include_prefix={include_prefix} pools "
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


def _grid(tc: dict, arrays: dict, patch: tuple[int, int], prefix: int, where: str,
          config_file: Path, no_embed_class: bool | None, arch_size=None) -> tuple[int, int]:
    """The patch grid: from the model's image size (model_args, else the architecture's, else
    the config's input size), else from a square `pos_embed`. `no_embed_class` (None: not
    known) says whether `pos_embed` has rows for the `prefix` tokens."""
    embedded = (0, prefix) if no_embed_class is None else (0,) if no_embed_class else (prefix,)
    field, size = "model_args.img_size", tc.get("model_args", {}).get("img_size")
    if not size and arch_size:
        field, size = "the architecture's img_size", arch_size
    if not size:
        field, size = "pretrained_cfg.input_size", tc.get("pretrained_cfg", {}).get("input_size")
    rows = arrays["pos_embed"].shape[1] if "pos_embed" in arrays else None
    if size:
        size = json_size(config_file, field, size)
        grid = size[0] // patch[0], size[1] // patch[1]
        if rows is None or rows - grid[0] * grid[1] in embedded:
            return grid
    if rows is None:  # the missing pos_embed is named with the other missing arrays
        return 224 // patch[0], 224 // patch[1]
    for n in sorted({rows - e for e in embedded}):
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
    pe, n_cls = np.asarray(p["pos_embed"], np.float32), int(cfg.class_token)
    arch, args = architecture_of(cfg, class_row=bool(n_cls and pe[:, :1].any()))
    if timm_architectures.arguments(arch, args, "")["no_embed_class"]:
        # The architecture gives the prefix tokens no position: the class row joins the class
        # token (one float addition either way, so the outputs stay bit-identical).
        if n_cls:
            out["cls_token"] = (np.asarray(p["cls_token"], np.float32) + pe[:, :1])
        pe = pe[:, n_cls:]
    elif cfg.num_registers:  # registers get zero rows: x + 0 leaves them exact
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
        config = _timm_config_json(loaded, arch, args)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return []


def _as_timm(cfg: ViTConfig) -> dict:
    """Our config as the VisionTransformer arguments that decide its outputs."""
    patch = cfg.patch_size[0] if cfg.patch_size[0] == cfg.patch_size[1] else list(cfg.patch_size)
    pool = {"token": "token", "gap": "avg", "map": "map"}[cfg.classifier]
    return {"embed_dim": cfg.width, "depth": cfg.depth, "num_heads": cfg.num_heads,
            "patch_size": patch, "in_chans": cfg.in_channels, "mlp_dim": cfg.mlp_dim,
            "qkv_bias": cfg.qkv_bias, "qk_norm": cfg.qk_norm, "init_values": cfg.layer_scale,
            "class_token": cfg.class_token, "reg_tokens": cfg.num_registers,
            "global_pool": pool, "fc_norm": False,
            # our MAP head attends to every token; our 'gap' averages the patches only
            "pool_include_prefix": (cfg.classifier == "map" if pool != "token"
                                    and cfg.num_prefix_tokens else None),
            "act_layer": cfg.act_layer,
            "dynamic_img_size": cfg.dynamic_image_size}


def _canonical(args: dict, width: int | None = None) -> dict:
    """timm's arguments in `_as_timm`'s terms (None where timm ignores the argument); the MLP
    width as its `mlp_ratio` makes it at `width` (by default its own embed_dim)."""
    ratio = args["mlp_ratio"]
    prefix = int(bool(args["class_token"])) + args["reg_tokens"]
    patch = args["patch_size"]
    return {"embed_dim": args["embed_dim"], "depth": args["depth"],
            "num_heads": args["num_heads"],
            "patch_size": patch[0] if isinstance(patch, list) and patch[0] == patch[1] else patch,
            "in_chans": args["in_chans"], "mlp_dim": int((width or args["embed_dim"]) * ratio),
            "qkv_bias": bool(args["qkv_bias"]), "qk_norm": bool(args["qk_norm"]),
            "init_values": args["init_values"], "class_token": bool(args["class_token"]),
            "reg_tokens": args["reg_tokens"], "global_pool": args["global_pool"],
            "fc_norm": bool(args["fc_norm"]),
            "pool_include_prefix": (bool(args["pool_include_prefix"])
                                    if args["global_pool"] != "token" and prefix else None),
            "act_layer": timm_architectures.GELUS.get(args["act_layer"], args["act_layer"]),
            "dynamic_img_size": bool(args["dynamic_img_size"])}


def architecture_of(cfg: ViTConfig, class_row: bool = False) -> tuple[str, dict]:
    """(the timm architecture nearest to `cfg`, the model_args that make it `cfg`): the one
    needing the fewest model_args among those this ViT can be, so that
    `timm.create_model(architecture, **model_args)` builds this model. With `class_row` (the
    class token's position row is not zero), one that gives the class token a position row
    counts one argument more: the other layout keeps the outputs but not the arrays."""
    ours = _as_timm(cfg)
    preferred = timm_name(cfg)
    best = None
    for arch in timm_architectures.ARCHITECTURES:
        if arch.startswith("test_"):
            continue
        theirs = timm_architectures.arguments(arch, {}, arch)
        if (timm_architectures.unsupported(theirs)
                or timm_architectures.layer_norm_eps(theirs) != cfg.layer_norm_eps):
            continue
        differ = [k for k, v in _canonical(theirs, cfg.width).items() if ours[k] != v]
        folds = class_row and cfg.class_token and theirs["no_embed_class"]
        rank = (len(differ) + folds, arch != preferred, arch)
        if best is None or rank < best[0]:
            best = (rank, arch, differ)
    _, arch, differ = best
    args = {}
    for key in differ:
        if key == "mlp_dim":  # timm's Mlp is int(embed_dim * mlp_ratio) wide
            ratio = cfg.mlp_dim / cfg.width
            if int(cfg.width * ratio) != cfg.mlp_dim:
                ratio = (cfg.mlp_dim + 0.5) / cfg.width
            args["mlp_ratio"] = ratio
        elif key == "pool_include_prefix":
            args[key] = bool(ours[key])
        else:
            args[key] = ours[key]
    args["img_size"] = list(cfg.image_size)
    resolved = _canonical(timm_architectures.arguments(arch, args, arch))
    if resolved != ours:  # a key whose meaning depends on another, e.g. fc_norm on pooling
        args.update({k: (bool(v) if k == "pool_include_prefix" else v)
                     for k, v in ours.items() if resolved[k] != v and k != "mlp_dim"})
    return arch, args


def _timm_config_json(loaded: LoadedCheckpoint, arch: str, args: dict) -> dict:
    """timm's hub `config.json`: a timm architecture and the `model_args` that differ from
    it, so `timm.create_model(architecture, **model_args)` (and `local-dir:`/`hf-hub:`) builds
    this model; `pretrained_cfg` holds the eval transform."""
    cfg, pre = loaded.config, loaded.preprocessing
    pool = {"token": "token", "gap": "avg", "map": "map"}[cfg.classifier]
    out = {"architecture": arch, "num_classes": cfg.num_classes,
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
