"""The ViT architectures timm publishes and what each name means, resolved as timm does.

A timm `config.json` names an `architecture` and the `model_args` that differ from it; the name
carries the rest (heads, activation, pooling, `fc_norm`, `no_embed_class`, registers, layer
scale, DeiT's distillation token and head). `ARCHITECTURES` below is every architecture of
timm's `vision_transformer` and `deit` modules with the keyword arguments its entry point passes
to `VisionTransformer` (`distilled`: a `VisionTransformerDistilled`), as timm states them
(generated into timm_table.py by tests/timm_reference.py; tests/test_timm_roundtrip.py checks
every row against timm's own models). A name not in it is asked of timm's registry
when timm can be imported; otherwise it is refused, naming the model_args that would settle it.
"""

from __future__ import annotations

import re

from vit.errors import CheckpointError
from vit.models.posemb import METHOD_OF_SOURCE
from vit.models.timm_table import ARCHITECTURES, PRETRAINED, TIMM_VERSION

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
    # not VisionTransformer's: the deit module's `_create_deit(distilled=True)` builds a
    # VisionTransformerDistilled (a distillation token after the class token, pos_embed rows
    # [cls, dist, grid], `head` and `head_dist` averaged); never a model_arg
    "distilled": False,
}
# The name older `vit convert --format timm` folders carry (not timm's): their model_args and
# arrays state the whole model, and they are read as a file naming no architecture is.
CUSTOM = "vit_custom"
# For a name neither the table nor timm knows, the model_args that settle what it means.
SETTLING = ("num_heads", "global_pool", "act_layer", "no_embed_class", "fc_norm")


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
        import timm.models.deit as deit
        import timm.models.vision_transformer as vt
    except Exception:  # not installed, or its torchvision cannot load beside this torch
        return None
    if not timm.is_model(arch):
        return None

    class Captured(Exception):
        pass

    def capture(variant, pretrained=False, **kwargs):
        raise Captured(kwargs)

    def capture_deit(variant, pretrained=False, distilled=False, **kwargs):
        raise Captured({**kwargs, **({"distilled": True} if distilled else {})})

    originals = vt._create_vision_transformer, deit._create_deit
    vt._create_vision_transformer, deit._create_deit = capture, capture_deit
    try:
        timm.models._registry.model_entrypoint(arch)(pretrained=False)
    except Captured as done:
        return {k: _as_text(v) for k, v in done.args[0].items()}
    except Exception:  # another family's entry point (hybrid, relpos, eva): not ours
        return None
    finally:
        vt._create_vision_transformer, deit._create_deit = originals
    return None


def _as_text(value):
    import functools

    if isinstance(value, functools.partial):
        kw = ",".join(f"{k}={_as_text(v)}" for k, v in sorted(value.keywords.items()))
        return f"{_as_text(value.func)}({kw})"
    if isinstance(value, type):
        return value.__name__
    return list(value) if isinstance(value, tuple) else value


# timm's names for the layers a ViT option builds (`act_layer`, `norm_layer`, `mlp_layer`,
# `block_fn`), lower-cased without underscores, and ours.
ACTIVATIONS = {None: "gelu", "gelu": "gelu", "gelutanh": "gelu_tanh", "quickgelu": "quick_gelu",
               "silu": "silu", "swish": "silu"}
NORMS = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}
NORM_EPS = 1e-6  # timm's LayerNorm and RmsNorm default
BLOCKS = {"Block": "block", "ResPostBlock": "res_post", "ParallelThingsBlock": "parallel",
          "ParallelScalingBlock": "parallel_scaling",
          "DiffParallelScalingBlock": "parallel_scaling"}
# The blocks that build their attention from `attn_layer` (the parallel-scaling ones have
# their own, differential in DiffParallelScalingBlock).
ATTN_BLOCKS = ("Block", "ResPostBlock", "ParallelThingsBlock")
ATTENTIONS = {"Attention": "attention", "attn": "attention", "": "attention", None: "attention",
              "diff": "diff", "DiffAttention": "diff"}
POOLS = {"token": "token", "avg": "gap", "map": "map"}


def _layer(value) -> tuple[str | None, dict]:
    """timm's table text (`Name(k=v,...)`) or a model_args string -> (lower-case name without
    underscores, keyword arguments)."""
    if value is None:
        return None, {}
    found = re.fullmatch(r"(\w+)(?:\((.*)\))?", str(value).strip())
    if not found:
        return str(value), {}
    kwargs = {}
    for item in filter(None, (found.group(2) or "").split(",")):
        key, _, text = item.partition("=")
        kwargs[key.strip()] = text.strip()
    return found.group(1).replace("_", "").lower(), kwargs


def norm_of(value) -> tuple[str, float] | None:
    """(our norm_layer, eps) of timm's `norm_layer` (None: timm's LayerNorm), or None when it
    is a norm this ViT does not have."""
    name, kwargs = _layer(value)
    kind = NORMS.get(name or "layernorm")
    if kind is None or set(kwargs) - {"eps"}:
        return None
    try:
        return kind, float(kwargs.get("eps", NORM_EPS))
    except ValueError:
        return None


def activation_of(value) -> str | None:
    """Our act_layer for timm's `act_layer`, or None when this ViT has no such activation."""
    name, kwargs = _layer(value)
    return None if kwargs else ACTIVATIONS.get(name)


def mlp_of(value) -> str | None:
    """Our mlp_layer for timm's `mlp_layer`: its Mlp, SwiGLU and GluMlp with gate_last=False
    (whose act_layer the block's own replaces, as timm passes it); None for any other."""
    name, kwargs = _layer(value)
    if name == "mlp" and not kwargs:
        return "mlp"
    if name == "swiglu" and not set(kwargs) - {"act_layer"}:
        return "swiglu"
    if name == "glumlp" and kwargs.get("gate_last") == "False" and not set(kwargs) - {
            "act_layer", "gate_last"}:
        return "glu"
    return None


def config_fields(args: dict) -> tuple[dict, list[str]]:
    """(the ViTConfig fields timm's `VisionTransformer(**args)` has, the arguments that build
    what this ViT does not have, as `name=value` with the reason). The image size, classes
    and head come from the file; `args` are `arguments()`' (every key present)."""
    problems = []
    for key in ("dynamic_img_pad",):
        if args[key]:
            problems.append(f"{key}=True (images padded to whole patches)")
    block = args["block_fn"]
    if block not in BLOCKS:
        problems.append(f"block_fn={block} (a block family this ViT does not build)")
    attn = "diff" if block == "DiffParallelScalingBlock" else "attention"
    if block in ATTN_BLOCKS:
        attn = ATTENTIONS.get(args["attn_layer"])
        if attn is None:
            problems.append(f"attn_layer={args['attn_layer']} (an attention this ViT does not "
                            "build)")
    mlp = mlp_of(args["mlp_layer"]) if block in ATTN_BLOCKS else "mlp"
    if block not in ATTN_BLOCKS and (args["scale_attn_norm"] or args["scale_mlp_norm"]):
        problems.append(f"block_fn={block} with scale norms (timm refuses to build it)")
    if mlp is None:
        problems.append(f"mlp_layer={args['mlp_layer']} (an MLP this ViT does not build)")
    act = activation_of(args["act_layer"])
    if act is None:
        problems.append(f"act_layer={args['act_layer']} (an activation this ViT does not have)")
    norm = norm_of(args["norm_layer"])
    if norm is None:
        problems.append(f"norm_layer={args['norm_layer']} (a norm this ViT does not have)")
    embed_norm = args["embed_norm_layer"] is not None
    if embed_norm and norm_of(args["embed_norm_layer"]) != norm:
        problems.append(f"embed_norm_layer={args['embed_norm_layer']} beside norm_layer="
                        f"{args['norm_layer']} (this ViT's norms are all one kind)")
    if args["pos_embed"] != "learn":
        problems.append(f"pos_embed={args['pos_embed']!r} (no learned position embedding)")
    if args["global_pool"] not in POOLS:
        problems.append(f"global_pool={args['global_pool']!r} (a pooling this ViT does not "
                        "have: token, avg or map)")
    pool = POOLS.get(args["global_pool"], "token")
    class_token, registers = bool(args["class_token"]), int(args["reg_tokens"] or 0)
    distilled = bool(args["distilled"])
    if distilled:  # what timm's VisionTransformerDistilled refuses, or builds and never reads
        if args["global_pool"] != "token":
            problems.append(f"global_pool={args['global_pool']!r} (timm's distilled head reads "
                            "the class and distillation tokens)")
        if not class_token:
            problems.append("class_token=False (timm's distilled ViT needs its class token)")
        if registers:
            problems.append(f"reg_tokens={registers} (timm's distilled ViT never feeds its "
                            "registers in)")
        if args["no_embed_class"]:
            problems.append("no_embed_class=True (timm's distilled ViT then adds a pos_embed "
                            "of the wrong length)")
        if args["fc_norm"] and args["final_norm"]:
            problems.append("fc_norm=True (timm's distilled head skips fc_norm)")
    final_norm = bool(args["final_norm"])
    use_fc_norm = args["fc_norm"]
    if use_fc_norm is None:
        use_fc_norm = args["global_pool"] in ("avg", "avgmax", "max")
    patch = args["patch_size"]
    patch = tuple(patch) if isinstance(patch, list | tuple) else (patch, patch)
    init = args["init_values"]
    fields = {
        "width": args["embed_dim"], "depth": args["depth"], "num_heads": args["num_heads"],
        "mlp_dim": int(args["embed_dim"] * args["mlp_ratio"]), "patch_size": patch,
        "in_channels": args["in_chans"], "class_token": class_token,
        "num_registers": registers, "qkv_bias": bool(args["qkv_bias"]),
        "qk_norm": bool(args["qk_norm"]), "layer_scale": float(init) if init else None,
        "act_layer": act or "gelu", "norm_layer": (norm or ("layernorm", NORM_EPS))[0],
        "layer_norm_eps": (norm or ("layernorm", NORM_EPS))[1], "mlp_layer": mlp or "mlp",
        "block_fn": BLOCKS.get(block, "block"), "attn_layer": attn or "attention",
        "num_parallel": 2,
        "proj_bias": bool(args["proj_bias"]), "patch_bias": not args["pre_norm"],
        "embed_norm": embed_norm, "pre_norm": bool(args["pre_norm"]),
        "final_norm": final_norm, "fc_norm": bool(use_fc_norm) and final_norm,
        "scale_attn_norm": bool(args["scale_attn_norm"]),
        "scale_mlp_norm": bool(args["scale_mlp_norm"]), "classifier": pool,
        "pool_include_prefix": (bool(args["pool_include_prefix"])
                                if pool != "token" and int(class_token) + registers else None),
        "dynamic_image_size": bool(args["dynamic_img_size"]),
        # a distilled ViT has its second head always (dist_head: ViTConfig's default)
        "dist_token": distilled, "dist_head": True,
    }
    return fields, problems


def unsupported(args: dict) -> list[str]:
    """The arguments (`name=value (why)`) that build a model this ViT does not have."""
    return config_fields(args)[1]


def timm_fields(name: str) -> dict | None:
    """The ViTConfig fields of the model timm builds for architecture `name`
    (`vit_base_patch16_clip_224`, a `.tag` allowed: it names weights only), at timm's image
    size with its classes (as `timm.create_model(name)`); None when timm's table has no such
    architecture. What `vit.create_model` and `vit info` build for a timm name."""
    arch = name.split(".")[0]
    if arch not in ARCHITECTURES:
        return None
    args = arguments(arch, {}, arch)
    fields, problems = config_fields(args)
    if problems:  # none of timm's own names today; a later table may add one
        raise CheckpointError(f"timm architecture {arch}: {'; '.join(problems)}")
    # timm's builder sets img_size and num_classes from the default pretrained_cfg unless the
    # entry point passes them (`setdefault`)
    size = ARCHITECTURES[arch].get("img_size", PRETRAINED[arch]["img_size"])
    size = tuple(size) if isinstance(size, list | tuple) else (size, size)
    # timm's stride-p patch convolution ignores the pixels past the last whole patch (384 px at
    # patch 14: a 27x27 grid on 378 px); this ViT states the size its grid covers
    fields["image_size"] = tuple(s // p * p for s, p in zip(size, fields["patch_size"],
                                                             strict=True))
    fields["num_classes"] = ARCHITECTURES[arch].get("num_classes",
                                                    PRETRAINED[arch]["num_classes"])
    fields["posemb_resize"] = METHOD_OF_SOURCE["timm"]
    if fields["pool_include_prefix"] == (fields["classifier"] == "map"):
        fields["pool_include_prefix"] = None  # the head's own convention
    return fields
