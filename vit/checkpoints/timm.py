"""timm's ViT weights: its state-dict layout in safetensors, and its model names.

Keys are our parameter paths in timm's module names (`timm_key`; vit/models/vit.py states the
tree): `patch_embed.proj` (OIHW), `patch_embed.norm`, `cls_token`, `reg_token`, `pos_embed`,
`norm_pre`, `blocks.{i}.norm1`, `attn.qkv` (fused, output rows laid out (3, heads, head_dim)
like ours), `attn.q_norm/k_norm`, `attn.norm`, `attn.proj`, `ls1.gamma`, `norm2`,
`mlp.fc1/fc2` (`mlp.fc1_g/fc1_x/fc2` for SwiGLU, `mlp.norm`), `ls2.gamma`, parallel blocks'
`attns.{j}.*`/`ffns.{j}.*`, `norm`, `fc_norm`, `attn_pool.*` (a MAP head), `head`; DeiT's
distilled architectures (timm's `VisionTransformerDistilled`) add `dist_token` and `head_dist`,
and their `pos_embed` rows are [cls, dist, grid], as ours. The hub's
timm repos carry a `config.json` with `architecture`, `model_args` and `pretrained_cfg`
(input size, interpolation, mean/std, crop_pct); the architecture decides the rest
(`timm_architectures`: norms, activation, MLP, block family, pooling).

`pos_embed` holds rows for the prefix tokens unless timm's `no_embed_class` is set; our model
gives registers no position, so register rows are folded into the register tokens (one float
addition either way, so the outputs stay bit-identical).
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import numpy as np

import vit.models.timm_architectures as timm_architectures
from vit.checkpoints.files import (
    field_error,
    json_int,
    json_number,
    json_size,
    read_json_object,
    staged,
)
from vit.checkpoints.fit import expected_shapes
from vit.checkpoints.labels import default_labels
from vit.checkpoints.loaded import LoadedCheckpoint, refuse_text, zero_head_warning
from vit.checkpoints.lossy import lossy_hint
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.safetensors_io import read_safetensors, write_safetensors
from vit.checkpoints.torch_tensors import conv_of, patch_kernel_of, transposed
from vit.checkpoints.tree import flatten, nest
from vit.errors import CheckpointError, ConfigError
from vit.models.config import WIDTHS, ViTConfig
from vit.models.posemb import METHOD_OF_SOURCE
from vit.models.timm_architectures import NORM_EPS
from vit.models.timm_table import DEIT
from vit.preprocess import Preprocessing

TIMM_SIZE_NAMES = {"Ti": "tiny", "S": "small", "M": "medium", "B": "base", "L": "large",
                   "H": "huge", "g": "giant", "G": "gigantic"}
LAYER_SCALE_INIT = 1e-5  # only the initial value: loaded weights replace it
HUB_ORG = "timm"


def is_timm_keys(keys) -> bool:
    return any(k.startswith(("patch_embed.proj.", "blocks.0.attn.qkv.")) for k in keys)


def is_timm_name(name: str) -> bool:
    """`vit_base_patch16_224`, `vit_base_patch16_224.augreg2_in21k_ft_in1k`, or any other
    architecture of timm's table (`deit_tiny_distilled_patch16_224`, `aimv2_large_patch14_224`),
    with or without a `.tag`."""
    if name.split(".")[0] in timm_architectures.ARCHITECTURES and "/" not in name:
        return True
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


def _inferred_arguments(arrays: dict, model_args: dict, width: int) -> dict:
    """timm's arguments for a file that names no architecture: what its arrays show, then
    its `model_args` (a key the arrays cannot show, such as the activation, from those
    alone). The activation defaults to timm's (exact GELU)."""
    parallel = "blocks.0.attns.0.norm.weight" in arrays
    block = "blocks.0.attns.0." if parallel else "blocks.0."
    attn, mlp = f"{block}attn.", f"{'blocks.0.ffns.0.' if parallel else block}mlp."
    depth = 0
    while any(k.startswith(f"blocks.{depth}.") for k in arrays):
        depth += 1
    class_token = "cls_token" in arrays
    rms = f"{block}norm{'' if parallel else '1'}.weight" in arrays and \
        f"{block}norm{'' if parallel else '1'}.bias" not in arrays
    norm = "rmsnorm" if rms else None
    args = {**timm_architectures.DEFAULTS, "embed_dim": width, "depth": depth,
            "patch_size": list(arrays["patch_embed.proj.weight"].shape[2:]),
            "class_token": class_token,
            "reg_tokens": arrays["reg_token"].shape[1] if "reg_token" in arrays else 0,
            "qkv_bias": f"{attn}qkv.bias" in arrays,
            "qk_norm": f"{attn}q_norm.weight" in arrays,
            "scale_attn_norm": f"{attn}norm.weight" in arrays,
            "scale_mlp_norm": f"{mlp}norm.weight" in arrays,
            "proj_bias": f"{attn}proj.bias" in arrays or not depth,
            "init_values": (LAYER_SCALE_INIT if f"{block}ls1.gamma" in arrays
                            or f"{block}ls.gamma" in arrays else None),
            "pre_norm": "norm_pre.weight" in arrays,
            "fc_norm": "fc_norm.weight" in arrays,  # no final norm only if model_args say so
            "embed_norm_layer": ((norm or "layernorm") if "patch_embed.norm.weight" in arrays
                                 else None),
            "norm_layer": norm,
            "block_fn": "ParallelThingsBlock" if parallel else "Block",
            "mlp_layer": "SwiGLU" if f"{mlp}fc1_g.weight" in arrays else "Mlp",
            "global_pool": ("map" if "attn_pool.latent" in arrays
                            else "token" if class_token else "avg"),
            "distilled": "dist_token" in arrays,
            "num_heads": None}
    fc1, fc2 = arrays.get(f"{mlp}fc1.weight"), arrays.get(f"{mlp}fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.ndim == fc2.ndim == 2 and \
            fc2.shape[1] * 2 == fc1.shape[0] != fc2.shape[1]:
        args["mlp_layer"] = "GatedMlp"  # halves of fc1 meet: which half gates, no array says
    args.update(model_args)
    if "pool_include_prefix" not in model_args:  # unstated: pooled as this ViT pools
        args["pool_include_prefix"] = args["global_pool"] == "map"
    return args


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
                                  f"{'; '.join(bad)}; no option of this ViT builds it, so it "
                                  "cannot be read exactly: run it in timm itself")
        return args, arch
    args = _inferred_arguments(arrays, model_args, width)
    if args["num_heads"] is None:
        q_norm = next((v for k, v in arrays.items() if k.endswith("attn.q_norm.weight")), None)
        if q_norm is not None:
            args["num_heads"] = width // q_norm.shape[0]
        else:
            why = ("no config.json beside the weights" if not config_file.exists() else
                   f"{config_file.name} names no architecture and no model_args.num_heads")
            args["num_heads"] = _heads_guess(width, warnings, why)
    bad = timm_architectures.unsupported(args)
    if bad:
        raise CheckpointError(f"{config_file}: model_args and arrays {'; '.join(bad)} build a "
                              "model this ViT does not have; it cannot be read exactly (name "
                              "the timm architecture in config.json if it is one)")
    return args, None


# -- our parameter names <-> timm's state-dict keys -------------------------------------------
# Our tree follows timm's module names (vit/models/vit.py), but for these top-level names and
# the leaves (`kernel`/`scale` are torch's `weight`).
_TOP = {"patch_kernel": "patch_embed.proj.weight", "patch_bias": "patch_embed.proj.bias",
        "patch_norm": "patch_embed.norm", "reg_tokens": "reg_token", "map_head": "attn_pool"}
_LEAF = {"kernel": "weight", "scale": "weight", "probe": "latent"}


def timm_key(path: tuple) -> str:
    """timm's state-dict key of one of our parameter paths (`("blocks", 0, "attn", "qkv",
    "kernel")` -> `blocks.0.attn.qkv.weight`)."""
    parts = [str(p) for p in path]
    if len(parts) == 1:
        return _TOP.get(parts[0], parts[0])
    return ".".join([_TOP.get(parts[0], parts[0]), *parts[1:-1], _LEAF.get(parts[-1],
                                                                            parts[-1])])


def _from_torch(path: tuple, value: np.ndarray) -> np.ndarray:
    if path == ("patch_kernel",):
        return patch_kernel_of(value)
    return transposed(value) if path[-1] == "kernel" and value.ndim == 2 else value


def _to_torch(path: tuple, value) -> np.ndarray:
    value = np.asarray(value)
    if path == ("patch_kernel",):
        return conv_of(value)
    return value.T if path[-1] == "kernel" else value


def _torch_shape(path: tuple, shape: tuple) -> tuple:
    if path == ("patch_kernel",):
        return (shape[3], shape[2], shape[0], shape[1])
    return shape[::-1] if path[-1] == "kernel" else shape


# Our paths whose arrays come from timm's position embedding and prefix tokens together.
_TOKENS = {("pos_embed",), ("cls_token",), ("reg_tokens",)}


def _unused_error(file: Path, config_file: Path, arch: str | None,
                  unused: list[str]) -> CheckpointError:
    more = f" and {len(unused) - 6} more" if len(unused) > 6 else ""
    built = f"timm's {arch} as {config_file.name} states it" if arch else "the arrays' model"
    return CheckpointError(f"{file}: arrays {built} has no place for: {', '.join(unused[:6])}"
                           f"{more}; the file cannot be read exactly (does config.json name "
                           "the architecture and model_args the weights were saved from?)")


def read(path: Path) -> LoadedCheckpoint:
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    arrays = read_safetensors(file)
    tc, config_file = _timm_config(path), _config_file(path)
    get, warnings = NamedArrays(arrays), []
    if not get.has("patch_embed.proj.weight"):
        raise CheckpointError(f"{file}: unknown timm layout: expected keys missing: "
                              f"patch_embed.proj.weight, blocks.0.attn.qkv.weight")
    args, arch = _arguments(tc, arrays, file, config_file, warnings)
    for key, least in (("depth", 1), ("num_heads", 1), ("reg_tokens", 0), ("embed_dim", 1)):
        json_int(config_file, f"model_args.{key}", args[key], minimum=least)
    json_number(config_file, "model_args.mlp_ratio", args["mlp_ratio"], positive=True)
    if args["init_values"]:
        json_number(config_file, "model_args.init_values", args["init_values"])
    fields, _ = timm_architectures.config_fields(args)
    proj = arrays["patch_embed.proj.weight"]  # (D, C, ph, pw)
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
    else:
        fields.update(width=width, patch_size=patch, in_channels=proj.shape[1])
        fc1 = next((v for k, v in arrays.items()
                    if re.fullmatch(r"blocks\.0\.(ffns\.0\.)?mlp\.fc1(_g)?\.weight", k)), None)
        if fc1 is not None and fc1.ndim == 2:
            fields["mlp_dim"] = fc1.shape[0]
    class_token, registers = fields["class_token"], fields["num_registers"]
    positioned = int(class_token) + int(fields["dist_token"])  # prefix rows of pos_embed
    if fields["pool_include_prefix"] == (fields["classifier"] == "map"):
        fields["pool_include_prefix"] = None  # the head's own convention (ViTConfig.pools_prefix)
    no_embed_class = bool(args["no_embed_class"]) if arch else None
    arch_size = timm_architectures.ARCHITECTURES.get(arch, {}).get("img_size")
    grid = _grid(tc, arrays, patch, positioned + registers, str(file), config_file,
                 no_embed_class, arch_size)
    head = arrays.get("head.weight")
    num_classes = head.shape[0] if head is not None and head.ndim == 2 else 0
    try:
        config = ViTConfig(**fields, image_size=(grid[0] * patch[0], grid[1] * patch[1]),
                           num_classes=num_classes, posemb="learn",
                           posemb_resize=METHOD_OF_SOURCE["timm"])
    except ConfigError as err:  # the weights and config.json disagree
        raise CheckpointError(f"{file}: does not fit {config_file}"
                              f"{f' ({arch})' if arch else ''}: {err}; fix config.json"
                              ) from None
    params = _read_params(get, config, grid, file, arch)
    warning = zero_head_warning(params)
    labels = _label_names(tc, num_classes, file) or default_labels(num_classes)
    named = f"timm {arch}" if arch else "timm safetensors"
    return LoadedCheckpoint(
        config=config, params=params,
        preprocessing=_preprocessing(tc, config.image_size, config_file),
        labels=list(labels) if labels else None, source=f"{path} ({named})",
        warnings=warnings + ([warning] if warning else []), family="timm")


def _read_params(get: NamedArrays, config: ViTConfig, grid: tuple[int, int], file: Path,
                 arch: str | None) -> dict:
    """Every parameter a model of `config` has, from timm's key of it; refuses a file with
    keys missing, arrays of other shapes, or arrays left over, naming them."""
    shapes = expected_shapes(config)
    flat = {path: _from_torch(path, get(timm_key(path))) for path in shapes
            if path not in _TOKENS}
    if config.class_token:
        flat[("cls_token",)] = get("cls_token")
    reg_tokens = get("reg_token") if config.num_registers else None
    pos_embed = get("pos_embed")
    get.check(str(file), "timm")
    prefix = config.num_prefix_tokens
    if pos_embed.ndim != 3 or pos_embed.shape[1] - grid[0] * grid[1] not in (0, prefix):
        raise CheckpointError(f"{file}: pos_embed has shape {pos_embed.shape}, not the rows of "
                              f"{prefix} prefix tokens and a {grid[0]}x{grid[1]} grid")
    tokens = _split_posemb(pos_embed, grid, config.num_posemb_prefix, config.num_registers,
                           reg_tokens)
    flat.update({(name,): value for name, value in tokens.items()})
    if reg_tokens is not None and "reg_tokens" not in tokens:
        flat[("reg_tokens",)] = reg_tokens
    wrong = [f"{timm_key(p)} has shape {tuple(np.shape(flat[p]))}, the model "
             f"{_torch_shape(p, s)}" for p, s in shapes.items()
             if p not in _TOKENS and tuple(np.shape(flat[p])) != s]
    if wrong:
        more = f" and {len(wrong) - 4} more" if len(wrong) > 4 else ""
        raise CheckpointError(f"{file}: {'; '.join(wrong[:4])}{more}: the weights are not "
                              f"{'timm ' + arch if arch else 'the model their arrays state'}"
                              "; fix model_args in config.json")
    if get.unused():
        raise _unused_error(file, _config_file(file), arch, get.unused())
    return nest(flat)


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


def _split_posemb(pe: np.ndarray, grid: tuple[int, int], positioned: int, registers: int,
                  reg_tokens: np.ndarray | None) -> dict[str, np.ndarray]:
    """timm's pos_embed -> ours: [class (and distillation) rows, patches], `positioned` rows
    before the grid's; register rows folded into the tokens."""
    d = pe.shape[-1]
    embedded_prefix = pe.shape[1] - grid[0] * grid[1]
    out = {}
    if embedded_prefix == 0:  # no_embed_class: prefix tokens get no position
        rows = np.zeros((1, positioned, d), np.float32)
    else:
        rows = pe[:, :positioned]
        if registers:
            regs = pe[:, positioned:embedded_prefix]
            out["reg_tokens"] = (reg_tokens + regs).astype(np.float32)
    patches = pe[:, embedded_prefix:]
    out["pos_embed"] = np.concatenate([rows, patches], 1) if positioned else patches
    return out


def _preprocessing(tc: dict, image: tuple[int, int], file: Path) -> Preprocessing:
    """timm's eval transform of the file's `pretrained_cfg`; without one, timm's default for
    ViTs ([-1, 1], bicubic, crop 0.9)."""
    pc = tc.get("pretrained_cfg", {})
    if not pc:
        return Preprocessing(size=image, resample="bicubic", crop_pct=0.9)
    try:
        return Preprocessing.from_timm(pc, image)
    except ConfigError as err:
        raise CheckpointError(f"{file}: {err}; fix or replace the file") from None


# -- writing ----------------------------------------------------------------------------------
BARE_FILE = ("a bare .safetensors file cannot hold the GELU form, the pooling, the "
             "preprocessing or the labels (they live in timm's config.json): write a folder "
             "instead, e.g. `vit convert SRC my-model --format timm`")


def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    """The properties of `loaded` that a timm folder (`config.json` + `model.safetensors`)
    cannot say to timm's `VisionTransformer`."""
    cfg, problems = loaded.config, []
    if cfg.stem:
        problems.append(f"a convolutional stem {list(cfg.stem)} (timm's hybrids are other "
                        "modules)")
    if cfg.patch_classes:
        problems.append(f"a per-patch readout of {cfg.patch_classes} classes")
    if cfg.representation_size:
        problems.append("a pre-logits (representation) layer")
    if cfg.posemb != "learn":
        problems.append(f"{cfg.posemb} position embeddings (timm's ViT learns them)")
    if cfg.rel_pos_bias != "none":
        problems.append("a relative position bias (BEiT's; timm's beit module, not its ViT)")
    if cfg.classifier == "token_gap":
        problems.append("the class token and patch mean side by side (token_gap pooling)")
    if cfg.block_fn == "parallel" and cfg.num_parallel != 2:
        problems.append(f"{cfg.num_parallel} parallel branches (timm's ParallelThingsBlock "
                        "has 2 in its ViT)")
    eps = _norm_eps().get(cfg.norm_layer, ())
    if cfg.layer_norm_eps not in eps:
        name = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[cfg.norm_layer]
        problems.append(f"{name} eps {cfg.layer_norm_eps:g} (timm's ViT architectures have "
                        f"{' or '.join(f'{e:g}' for e in sorted(eps))})")
    if cfg.pre_norm and cfg.patch_bias and np.any(loaded.params.get("patch_bias", 0)):
        problems.append("a patch-embedding bias beside pre_norm (timm's pre_norm has none)")
    if not problems:
        reason = _search(cfg, False)[2]
        if reason:
            problems.append(reason)
    return problems


@functools.cache
def _norm_eps() -> dict[str, tuple[float, ...]]:
    """{our norm_layer: the eps timm can build it with}: 1e-6 by model_args (timm's default),
    others where an architecture's name carries them."""
    found = {"layernorm": {NORM_EPS}, "rmsnorm": {NORM_EPS}}
    for args in timm_architectures.ARCHITECTURES.values():
        norm = timm_architectures.norm_of(args.get("norm_layer"))
        if norm is not None:
            found[norm[0]].add(norm[1])
    return {kind: tuple(sorted(eps)) for kind, eps in found.items()}


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
    pe, n_cls = np.asarray(p["pos_embed"], np.float32), int(cfg.class_token)
    arch, args = architecture_of(cfg, class_row=bool(n_cls and pe[:, :1].any()))
    out = {timm_key(path): _to_torch(path, value) for path, value in flatten(p).items()
           if path not in _TOKENS and path != ("patch_bias",)}
    if not cfg.pre_norm:  # timm's patch embedding has a bias exactly when there is no pre_norm
        out["patch_embed.proj.bias"] = (np.asarray(p["patch_bias"]) if cfg.patch_bias
                                        else np.zeros((cfg.width,), np.float32))
    if cfg.class_token:
        out["cls_token"] = p["cls_token"]
    if cfg.num_registers:
        out["reg_token"] = p["reg_tokens"]
    if timm_architectures.arguments(arch, args, "")["no_embed_class"]:
        # The architecture gives the prefix tokens no position: the class row joins the class
        # token (one float addition either way, so the outputs stay bit-identical).
        if n_cls:
            out["cls_token"] = (np.asarray(p["cls_token"], np.float32) + pe[:, :1])
        pe = pe[:, n_cls:]
    elif cfg.num_registers:  # registers get zero rows: x + 0 leaves them exact
        zeros = np.zeros((1, cfg.num_registers, cfg.width), np.float32)
        rows = cfg.num_posemb_prefix
        pe = np.concatenate([pe[:, :rows], zeros, pe[:, rows:]], 1)
    out["pos_embed"] = pe
    with staged(dst) as tmp:
        tmp.mkdir()
        write_safetensors(out, tmp / "model.safetensors")
        config = _timm_config_json(loaded, arch, args)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return []


# The config fields timm's arguments decide (timm_architectures.config_fields), compared
# when looking for the architecture that builds a config; `patch_bias` follows `pre_norm` there
# and the writer makes it so.
_COMPARED = ("width", "depth", "num_heads", "mlp_dim", "patch_size", "in_channels",
             "class_token", "num_registers", "qkv_bias", "qk_norm", "layer_scale", "act_layer",
             "norm_layer", "layer_norm_eps", "mlp_layer", "block_fn", "attn_layer",
             "num_parallel",
             "proj_bias", "embed_norm", "pre_norm", "final_norm", "fc_norm", "scale_attn_norm",
             "scale_mlp_norm", "classifier", "pool_include_prefix", "dynamic_image_size",
             "dist_token", "dist_head")
_POOL_NAMES = {ours: theirs for theirs, ours in timm_architectures.POOLS.items()}
# What no model_args value can set (timm takes classes for these, or eps inside a partial).
_FIXED = {"mlp_layer": "the MLP", "block_fn": "the block", "num_parallel": "the parallel "
          "branches", "norm_layer": "the norm", "layer_norm_eps": "the norm's eps",
          "dist_token": "the distillation token (a deit architecture's)",
          "dist_head": "the distillation head (a deit architecture's)"}


def _ours(cfg: ViTConfig) -> dict:
    """`cfg`'s values of the compared fields, as `config_fields` states them."""
    out = {k: getattr(cfg, k) for k in _COMPARED}
    prefix = cfg.num_prefix_tokens
    out["pool_include_prefix"] = (cfg.pools_prefix if cfg.classifier != "token" and prefix
                                  else None)
    out["layer_scale"] = float(cfg.layer_scale) if cfg.layer_scale else None
    out["fc_norm"] = cfg.fc_norm and cfg.final_norm
    out["dist_head"] = cfg.dist_head or not cfg.dist_token  # timm's distilled ViT has it always
    return out


def _model_args(field: str, cfg: ViTConfig) -> dict | None:
    """The model_args (timm's arguments and their JSON values) that make `field` what `cfg`
    has; None when none can (`_FIXED`)."""
    if field in ("norm_layer", "layer_norm_eps"):  # timm's default eps, by name; the patch
        if cfg.layer_norm_eps != NORM_EPS:  # embedding's norm is ours too
            return None
        return {"norm_layer": cfg.norm_layer, **({"embed_norm_layer": cfg.norm_layer}
                                                  if cfg.embed_norm else {})}
    found = _model_arg(field, cfg)
    return None if found is None else dict([found])


def _model_arg(field: str, cfg: ViTConfig) -> tuple[str, object] | None:
    if field == "embed_norm":
        if not cfg.embed_norm:
            return "embed_norm_layer", None
        return ("embed_norm_layer", cfg.norm_layer) if cfg.layer_norm_eps == NORM_EPS else None
    if field in _FIXED:
        return None
    if field == "mlp_dim":  # timm's MLP is int(embed_dim * mlp_ratio) wide
        ratio = cfg.mlp_dim / cfg.width
        if int(cfg.width * ratio) != cfg.mlp_dim:
            ratio = (cfg.mlp_dim + 0.5) / cfg.width
        return "mlp_ratio", ratio
    if field == "patch_size":
        ph, pw = cfg.patch_size
        return "patch_size", ph if ph == pw else [ph, pw]
    if field == "classifier":
        return "global_pool", _POOL_NAMES[cfg.classifier]
    if field == "pool_include_prefix":
        return "pool_include_prefix", bool(cfg.pools_prefix)
    if field == "attn_layer":  # a name timm's Block resolves (ATTN_LAYERS)
        return "attn_layer", "diff" if cfg.attn_layer == "diff" else "attn"
    names = {"width": "embed_dim", "in_channels": "in_chans", "num_registers": "reg_tokens",
             "layer_scale": "init_values", "dynamic_image_size": "dynamic_img_size"}
    value = _ours(cfg)[field]
    return names.get(field, field), value


@functools.lru_cache(maxsize=64)
def _search(cfg: ViTConfig, class_row: bool) -> tuple[str | None, dict, str | None]:
    """(the timm architecture nearest to `cfg`, the model_args that make it `cfg`, None), or
    (None, {}, why none can) when no architecture of the table builds `cfg`."""
    ours, preferred = _ours(cfg), timm_name(cfg)
    if cfg.dist_token:  # DeiT's name for it: deit_base_distilled_patch16_224
        preferred = preferred.replace("vit_", "deit_", 1).replace("_patch", "_distilled_patch", 1)
    best, closest = None, None
    for arch in timm_architectures.ARCHITECTURES:
        # the deit module's names only for DeiT's distillation token: the same ViTs otherwise
        # go by the vision_transformer module's names
        if arch.startswith("test_") or (arch in DEIT and not cfg.dist_token):
            continue
        args, fixed = {}, []
        for _ in range(4):  # a field set may move another (mlp_ratio is per embed_dim)
            fields, bad = timm_architectures.config_fields(
                timm_architectures.arguments(arch, args, arch))
            differ = [k for k in _COMPARED if fields[k] != ours[k]]
            fixed = [k for k in differ if _model_args(k, cfg) is None]
            if bad or fixed or not differ:
                break
            for k in differ:
                args.update(_model_args(k, cfg))
        if bad or differ:
            if not bad and (closest is None or len(fixed) < len(closest[1])):
                closest = (arch, fixed, fields)
            continue
        folds = class_row and cfg.class_token and timm_architectures.arguments(
            arch, args, arch)["no_embed_class"]
        rank = (len(args) + folds, arch != preferred, arch)
        if best is None or rank < best[0]:
            best = (rank, arch, args)
    if best is None:
        arch, fixed, fields = closest
        what = "; ".join(f"{_FIXED.get(k, k)} ({k}={ours[k]!r}, timm's nearest, {arch}, has "
                         f"{fields[k]!r})" for k in fixed)
        return None, {}, (f"what no timm {timm_architectures.TIMM_VERSION} ViT architecture "
                          f"builds, nor its model_args can set: {what}")
    _, arch, args = best
    return arch, {**args, "img_size": list(cfg.image_size)}, None


def architecture_of(cfg: ViTConfig, class_row: bool = False) -> tuple[str, dict]:
    """(the timm architecture nearest to `cfg`, the model_args that make it `cfg`): the one
    needing the fewest model_args among those this ViT can be, so that
    `timm.create_model(architecture, **model_args)` builds this model. With `class_row` (the
    class token's position row is not zero), one that gives the class token a position row
    counts one argument more: the other layout keeps the outputs but not the arrays.
    CheckpointError when no architecture builds it (`cannot_hold` says why first)."""
    arch, args, why = _search(cfg, class_row)
    if arch is None:
        raise CheckpointError(f"timm's ViT cannot hold {why}: use --format orbax")
    return arch, dict(args)


def _timm_config_json(loaded: LoadedCheckpoint, arch: str, args: dict) -> dict:
    """timm's hub `config.json`: a timm architecture and the `model_args` that differ from
    it, so `timm.create_model(architecture, **model_args)` (and `local-dir:`/`hf-hub:`) builds
    this model; `pretrained_cfg` holds the eval transform."""
    cfg, pre = loaded.config, loaded.preprocessing
    try:
        transform = pre.to_timm_pretrained_cfg()
    except ConfigError as err:
        raise CheckpointError(f"timm's config.json cannot hold the {err}") from None
    out = {"architecture": arch, "num_classes": cfg.num_classes,
           "num_features": cfg.width, "global_pool": _POOL_NAMES[cfg.classifier],
           "model_args": args,
           "pretrained_cfg": {**transform, "fixed_input_size": not cfg.dynamic_image_size,
                              "num_classes": cfg.num_classes, "pool_size": None,
                              "first_conv": "patch_embed.proj",
                              "classifier": (None if not cfg.num_classes else
                                             ["head", "head_dist"] if cfg.dist_token
                                             else "head")}}
    if loaded.labels:
        out["label_names"] = list(loaded.labels)
    return out
