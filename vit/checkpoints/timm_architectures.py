"""The ViT architectures timm publishes and what each name means, resolved as timm does.

A timm `config.json` names an `architecture` and the `model_args` that differ from it; the name
carries the rest (heads, activation, pooling, `fc_norm`, `no_embed_class`, registers, layer
scale). `ARCHITECTURES` below is every architecture of timm's `vision_transformer` module with
the keyword arguments its entry point passes to `VisionTransformer`, as timm states them
(generated into timm_table.py by tests/timm_reference.py; tests/test_timm_roundtrip.py checks
every row against timm's own models). A name not in it is asked of timm's registry
when timm can be imported; otherwise it is refused, naming the model_args that would settle it.
"""

from __future__ import annotations

import re

from vit.checkpoints.timm_table import ARCHITECTURES, TIMM_VERSION
from vit.errors import CheckpointError

# `VisionTransformer.__init__`'s defaults (timm/models/vision_transformer.py) for the arguments
# that change what a file's arrays mean.
DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "global_pool": "token", "embed_dim": 768,
    "depth": 12, "num_heads": 12, "mlp_ratio": 4.0, "qkv_bias": True, "qk_norm": False,
    "scale_attn_norm": False, "scale_mlp_norm": False, "proj_bias": True, "init_values": None,
    "class_token": True, "pos_embed": "learn", "no_embed_class": False, "reg_tokens": 0,
    "pre_norm": False, "final_norm": True, "fc_norm": None, "pool_include_prefix": False,
    "dynamic_img_size": False, "dynamic_img_pad": False, "embed_norm_layer": None,
    "norm_layer": None, "act_layer": None, "block_fn": "Block", "mlp_layer": "Mlp",
    "attn_layer": "Attention",
}
# The name older `vit convert --format timm` folders carry (not timm's): their model_args and
# arrays state the whole model, and they are read as a file naming no architecture is.
CUSTOM = "vit_custom"
# For a name neither the table nor timm knows, the model_args that settle what it means.
SETTLING = ("num_heads", "global_pool", "act_layer", "no_embed_class", "fc_norm")
GELUS = {None: "gelu", "gelu": "gelu", "GELU": "gelu", "gelu_tanh": "gelu_tanh",
         "GELUTanh": "gelu_tanh"}


def arguments(arch: str, model_args: dict, where) -> dict:
    """Every VisionTransformer argument that matters here, for `arch` built with `model_args`
    (`fc_norm` decided as timm decides it). Raises CheckpointError for a name neither the
    table nor an importable timm knows, unless `model_args` settles it."""
    base = ARCHITECTURES.get(arch)
    if base is None:
        base = _from_timm_registry(arch)
    if base is None:
        if not all(k in model_args for k in SETTLING):
            missing = [k for k in SETTLING if k not in model_args]
            raise CheckpointError(
                f"{where}: timm architecture {arch!r} is unknown (not one of timm "
                f"{TIMM_VERSION}'s ViT architectures, nor a VisionTransformer in an importable "
                f"timm); add model_args {', '.join(missing)} to config.json, or name a known "
                "architecture")
        base = {}
    args = {**DEFAULTS, **base, **model_args}
    if args["fc_norm"] is None:
        args["fc_norm"] = args["global_pool"] in ("avg", "avgmax", "max")
    return args


def _from_timm_registry(arch: str) -> dict | None:
    """The arguments timm's own entry point passes for `arch`, if timm imports and knows it
    as a VisionTransformer; None otherwise."""
    try:
        import timm
        import timm.models.vision_transformer as vt
    except Exception:  # not installed, or its torchvision cannot load beside this torch
        return None
    if not timm.is_model(arch):
        return None

    class Captured(Exception):
        pass

    def capture(variant, pretrained=False, **kwargs):
        raise Captured(kwargs)

    original, vt._create_vision_transformer = vt._create_vision_transformer, capture
    try:
        timm.models._registry.model_entrypoint(arch)(pretrained=False)
    except Captured as done:
        return {k: _as_text(v) for k, v in done.args[0].items()}
    except Exception:  # another family's entry point (hybrid, relpos, eva): not ours
        return None
    finally:
        vt._create_vision_transformer = original
    return None


def _as_text(value):
    import functools

    if isinstance(value, functools.partial):
        kw = ",".join(f"{k}={_as_text(v)}" for k, v in sorted(value.keywords.items()))
        return f"{_as_text(value.func)}({kw})"
    if isinstance(value, type):
        return value.__name__
    return list(value) if isinstance(value, tuple) else value


def unsupported(args: dict) -> list[str]:
    """The arguments (`name=value`) that build a model this ViT does not have."""
    out = []
    for key in ("pre_norm", "scale_attn_norm", "scale_mlp_norm", "dynamic_img_pad"):
        if args[key]:
            out.append(f"{key}=True")
    for key in ("final_norm", "proj_bias"):
        if not args[key]:
            out.append(f"{key}=False")
    if args["fc_norm"]:
        out.append("fc_norm (a LayerNorm after the pooling, as MAE and BEiT fine-tunes have)")
    for key in ("block_fn", "mlp_layer", "attn_layer"):
        if args[key] not in (DEFAULTS[key], None):
            out.append(f"{key}={args[key]}")
    if args["embed_norm_layer"] is not None:
        out.append(f"embed_norm_layer={args['embed_norm_layer']}")
    if args["pos_embed"] != "learn":
        out.append(f"pos_embed={args['pos_embed']!r}")
    if args["global_pool"] not in ("token", "avg", "map"):
        out.append(f"global_pool={args['global_pool']!r}")
    if args["act_layer"] not in GELUS:
        out.append(f"act_layer={args['act_layer']}")
    if layer_norm_eps(args) is None:
        out.append(f"norm_layer={args['norm_layer']}")
    return out


def gelu(args: dict) -> str:
    return GELUS[args["act_layer"]]


def layer_norm_eps(args: dict) -> float | None:
    """The LayerNorm epsilon of `norm_layer` (timm's LayerNorm: 1e-6); None if not a LayerNorm."""
    norm = args["norm_layer"]
    if norm in (None, "layernorm"):
        return 1e-6
    found = re.fullmatch(r"LayerNorm\(eps=([0-9.e+-]+)\)", str(norm))
    return float(found.group(1)) if found else None
