"""The ViT configuration and the named variants.

Names follow timm's short form (`vit_b16`) and big_vision's strings (`"B/16"`); every architecture
of timm's `vision_transformer` module (`vit_base_patch16_224`, `vit_base_patch16_clip_224`, ...)
means what timm builds (`vit.models.timm_architectures`). Every field can be overridden by
keyword.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from vit.errors import ConfigError

# width, depth, mlp_dim, heads: the table in big_vision's vit.py (Ti..H, plus g/G).
WIDTHS = {
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
}
# The names users type most; any "<size>/<patch>" string works too.
VARIANTS = {
    "vit_ti16": "Ti/16",
    "vit_s16": "S/16",
    "vit_s32": "S/32",
    "vit_b8": "B/8",
    "vit_b16": "B/16",
    "vit_b32": "B/32",
    "vit_l16": "L/16",
    "vit_l32": "L/32",
    "vit_h14": "H/14",
}
# token: the class token; gap: the mean of the patch tokens; map: attention pooling;
# token_gap: the class token and the patch mean side by side (transformers' DINOv2 classifier).
CLASSIFIERS = ("token", "gap", "map", "token_gap")
POSEMBS = ("learn", "sincos2d")
# timm's `act_layer` names: exact GELU, its tanh approximation, CLIP's x * sigmoid(1.702 x), SiLU.
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
NORM_LAYERS = ("layernorm", "rmsnorm")
# mlp: fc1 -> act -> fc2; swiglu: act(fc1_g x) * fc1_x x -> fc2 (timm's SwiGLU); glu: one fc1
# whose output halves are (x1, x2), act(x1) * x2 -> fc2 (timm's GluMlp with gate_last=False).
MLP_LAYERS = ("mlp", "swiglu", "glu")
# block: pre-norm; res_post: post-norm (norm after each branch, Swin-v2 style, timm's
# ResPostBlock); parallel: `num_parallel` pre-norm attention and MLP branches summed (timm's
# ParallelThingsBlock); parallel_scaling: ViT-22B's block, one input projection for the
# attention and the MLP side by side (timm's ParallelScalingBlock, and with attn_layer='diff'
# its DiffParallelScalingBlock).
BLOCK_FNS = ("block", "res_post", "parallel", "parallel_scaling")
# attention: softmax attention; diff: differential attention, two softmax maps of half-width
# queries and keys subtracted (timm's DiffAttention).
ATTN_LAYERS = ("attention", "diff")
# Relative position bias (BEiT): none, one table per block, or one table shared by all blocks.
REL_POS_BIASES = ("none", "layer", "shared")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("auto", "pallas", "cudnn", "xla")
# the methods of vit.models.posemb.resize_posemb
POSEMB_RESIZES = ("linear", "bicubic", "bicubic_antialias")


TEXT_HEADS = ("pooled", "patches", "placed", "things")
TEXT_SOURCES = ("bytes", "embeddings")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """Text conditioning: a text path and gated cross-attention from image tokens to text.

    A cross-attention block follows encoder block `i` when `i >= xattn_start` and
    `(i - xattn_start) % xattn_every == 0`. `source="bytes"` encodes UTF-8 prompts with our
    own small Transformer (`width`, `depth`, `num_heads`, `mlp_dim`, `max_len` tokens);
    `source="embeddings"` takes `[batch, tokens, embed_dim]` vectors from a frozen text model
    run elsewhere. `similarity_dim > 0` adds a SigLIP-style image-text similarity head.
    """

    source: str = "bytes"
    max_len: int = 32  # text tokens, including the end token; longer prompts are truncated
    width: int = 128
    depth: int = 2
    num_heads: int = 4
    mlp_dim: int = 512
    embed_dim: int = 0  # width of user-supplied embeddings (source="embeddings")
    xattn_start: int = 0
    xattn_every: int = 1
    similarity_dim: int = 0
    # "pooled": the prompt head scores the mean of the patches; "patches": it scores every
    # patch against the prompt and takes a soft maximum, so colour and shape must meet on one
    # patch (composes unseen colour x shape pairs); "placed": "patches" with a learned vector
    # per patch position in the match, which a region word ("on the left") can select;
    # "things": "placed" once per thing the prompt names, all of which must be found ("a bag
    # and a shirt").
    head: str = "pooled"

    def __post_init__(self):
        for f in dataclasses.fields(self):  # a dict from --set or a file is not typed for us
            value, kind = getattr(self, f.name), type(f.default)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"text.{f.name}={value!r}: expected {kind.__name__}")
        _check_choice("text.source", self.source, TEXT_SOURCES)
        _check_choice("text.head", self.head, TEXT_HEADS)
        if self.source == "embeddings" and self.embed_dim <= 0:
            raise ConfigError("text.source='embeddings' needs text.embed_dim > 0 (the width of "
                              "the supplied embeddings)")
        for name in ("max_len", "width", "depth", "num_heads", "mlp_dim", "xattn_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"text.{name} must be positive, got {getattr(self, name)}")
        if self.xattn_start < 0 or self.similarity_dim < 0:
            raise ConfigError("text.xattn_start and text.similarity_dim must be >= 0")
        if self.width % self.num_heads:
            raise ConfigError(f"text.width {self.width} is not divisible by text.num_heads "
                              f"{self.num_heads}")

    def xattn_layers(self, depth: int) -> tuple[int, ...]:
        """The encoder blocks that a cross-attention block follows."""
        return tuple(i for i in range(self.xattn_start, depth)
                     if (i - self.xattn_start) % self.xattn_every == 0)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a ViT's architecture and numerics."""

    width: int = 768
    depth: int = 12
    mlp_dim: int = 3072
    num_heads: int = 12
    patch_size: tuple[int, int] = (16, 16)
    image_size: tuple[int, int] = (224, 224)
    in_channels: int = 3
    num_classes: int = 1000
    class_token: bool = True
    classifier: str = "token"  # token | gap | map | token_gap
    num_registers: int = 0
    representation_size: int | None = None  # Dense + tanh before the head (i21k checkpoints)
    posemb: str = "learn"  # learn | sincos2d
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth, linearly increasing to this rate
    qkv_bias: bool = True
    qk_norm: bool = False
    layer_scale: float | None = None  # initial value of LayerScale, None for none
    layer_norm_eps: float = 1e-6
    # exact GELU | gelu_tanh (vit_jax and big_vision checkpoints) | quick_gelu (OpenAI CLIP) | silu
    act_layer: str = "gelu"
    # The options below are timm's VisionTransformer arguments of the same names; each default
    # leaves the standard ViT's graph unchanged.
    norm_layer: str = "layernorm"  # layernorm | rmsnorm, both with layer_norm_eps
    mlp_layer: str = "mlp"  # mlp | swiglu | glu (mlp_dim: fc1's output width)
    block_fn: str = "block"  # block | res_post | parallel | parallel_scaling
    attn_layer: str = "attention"  # attention | diff (differential attention)
    num_parallel: int = 2  # branches of a 'parallel' block
    proj_bias: bool = True  # biases of attn.proj and the MLP's linears
    patch_bias: bool = True  # the patch embedding's bias (CLIP's has none)
    embed_norm: bool = False  # a norm on the patch embeddings, before positions (aimv2)
    pre_norm: bool = False  # a norm after the embedding, before the blocks (CLIP's ln_pre)
    final_norm: bool = True  # the norm after the blocks (off: RADIO, transformers' CLIP head)
    fc_norm: bool = False  # the final norm after the pooling instead of before it (MAE, BEiT)
    scale_attn_norm: bool = False  # a norm before attn.proj (NormFormer, BEiT3)
    scale_mlp_norm: bool = False  # a norm before mlp.fc2 (NormFormer, BEiT3)
    rel_pos_bias: str = "none"  # none | layer | shared: BEiT's relative position bias
    dist_token: bool = False  # DeiT's distillation token (after the class token)
    # With dist_token: a second head on the distillation token, averaged with the class head
    # (timm's and transformers' DeiT ...WithTeacher); off: the class head alone reads it.
    dist_head: bool = True
    # Whether 'gap' and 'map' pool the prefix tokens (class, registers) with the patches (timm's
    # `pool_include_prefix`); None: each head's own convention ('map' attends to every token,
    # 'gap' and 'token_gap' average the patches only).
    pool_include_prefix: bool | None = None
    # A convolutional stem (vit.models.stem): the output channels of 3x3 stride-2 convolutions
    # before the patch embedding, which then covers patch_size / 2**len(stem) of their map; a
    # token still covers patch_size pixels. () for the plain linear patch embedding.
    stem: tuple[int, ...] = ()
    # A per-patch readout (vit.models.vit: `patch_logits`): that many classes scored on each
    # final patch token, trained against what lies on the patch (`train.patch_loss`), so a
    # patch's features say what is on it rather than what the whole image holds. 0: none.
    patch_classes: int = 0
    dtype: str = "float32"  # compute dtype; parameters stay float32
    remat: bool = False  # rematerialise each block in the backward pass
    attention_impl: str = "auto"  # auto | pallas | cudnn | xla
    dynamic_image_size: bool = False  # resize position embeddings on the fly for other sizes
    # How position embeddings are resized for another grid: the convention of the checkpoint's
    # source ("linear" for vit_jax/big_vision npz, "bicubic" for Hugging Face and ours,
    # "bicubic_antialias" for timm).
    posemb_resize: str = "bicubic"
    text: TextConfig | None = None  # text conditioning (cross-attention); None: a plain ViT

    def __post_init__(self):
        for name in ("patch_size", "image_size"):
            value = getattr(self, name)
            pair = (value, value) if isinstance(value, int) else tuple(int(v) for v in value)
            object.__setattr__(self, name, pair)
        stem = (self.stem,) if isinstance(self.stem, int) else tuple(self.stem or ())
        object.__setattr__(self, "stem", stem)
        _check_numbers(self)
        _check_choice("classifier", self.classifier, CLASSIFIERS)
        _check_choice("posemb", self.posemb, POSEMBS)
        _check_choice("act_layer", self.act_layer, ACT_LAYERS)
        _check_choice("norm_layer", self.norm_layer, NORM_LAYERS)
        _check_choice("mlp_layer", self.mlp_layer, MLP_LAYERS)
        _check_choice("block_fn", self.block_fn, BLOCK_FNS)
        _check_choice("attn_layer", self.attn_layer, ATTN_LAYERS)
        _check_choice("rel_pos_bias", self.rel_pos_bias, REL_POS_BIASES)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
        _check_choice("posemb_resize", self.posemb_resize, POSEMB_RESIZES)
        if isinstance(self.text, dict):  # from a saved config or a recipe file
            fields = {f.name for f in dataclasses.fields(TextConfig)}
            unknown = sorted(set(self.text) - fields)
            if unknown:
                raise ConfigError(f"unknown text field(s) {', '.join(unknown)}; valid fields: "
                                  f"{', '.join(sorted(fields))}")
            object.__setattr__(self, "text", TextConfig(**self.text))
        if self.text is not None and not self.text.xattn_layers(self.depth):
            raise ConfigError(f"text.xattn_start={self.text.xattn_start} is past the last "
                              f"block (depth {self.depth}): no cross-attention would be built")
        if self.width % self.num_heads:
            raise ConfigError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        for i in range(2):
            if self.image_size[i] % self.patch_size[i]:
                raise ConfigError(
                    f"image_size {self.image_size} is not a multiple of patch_size "
                    f"{self.patch_size}; pick an image size divisible by the patch size"
                )
        if self.classifier in ("token", "token_gap") and not self.class_token:
            raise ConfigError(f"classifier={self.classifier!r} needs class_token=True; use "
                              "'gap' or 'map'")
        if self.fc_norm and not self.final_norm:
            raise ConfigError("fc_norm=True moves the final norm after the pooling; it needs "
                              "final_norm=True")
        if self.dist_token and self.classifier != "token":
            raise ConfigError("dist_token=True (DeiT) needs classifier='token'")
        if self.dist_token and self.dist_head and self.representation_size:
            raise ConfigError("dist_token with dist_head averages two heads on the tokens; a "
                              "representation_size layer before them is not a DeiT: set one "
                              "of them off")
        if self.mlp_layer == "glu" and self.mlp_dim % 2:
            raise ConfigError(f"mlp_layer='glu' splits fc1's {self.mlp_dim} outputs in two "
                              "halves: mlp_dim must be even")
        if self.attn_layer == "diff" and self.head_dim % 2:
            raise ConfigError(f"attn_layer='diff' splits each head's {self.head_dim} query "
                              "features in two halves: width // num_heads must be even")
        if self.block_fn == "parallel_scaling" and (
                self.mlp_layer != "mlp" or self.scale_attn_norm or self.scale_mlp_norm
                or self.rel_pos_bias != "none"):
            raise ConfigError("block_fn='parallel_scaling' fuses the MLP's input into the "
                              "attention's: it takes mlp_layer='mlp', no scale norms and no "
                              "rel_pos_bias")
        if self.attn_layer == "diff" and self.rel_pos_bias != "none":
            raise ConfigError("attn_layer='diff' with a rel_pos_bias is not a model any "
                              "checkpoint has")
        if self.block_fn == "parallel" and self.num_parallel < 1:
            raise ConfigError(f"num_parallel={self.num_parallel}: must be at least 1")
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in self.stem):
            raise ConfigError(f"stem={list(self.stem)}: the stem's output channels, whole "
                              "numbers of at least 1 (e.g. [32, 64])")
        if any(p % self.stem_stride for p in self.patch_size):
            raise ConfigError(
                f"stem={list(self.stem)} halves the image {len(self.stem)} time(s), so "
                f"patch_size {self.patch_size} must be a multiple of {self.stem_stride}; use "
                f"fewer stem convolutions or a larger patch")
        if self.pool_include_prefix not in (None, True, False):
            raise ConfigError(f"pool_include_prefix={self.pool_include_prefix!r}: must be true, "
                              "false or none")
        if self.fc_norm and (self.classifier == "token_gap" or self.dist_token):
            raise ConfigError("fc_norm=True normalises one pooled vector; classifier="
                              "'token_gap' and dist_token pool two: use fc_norm=False")
        if self.rel_pos_bias != "none" and (not self.class_token or self.num_prefix_tokens != 1):
            raise ConfigError("rel_pos_bias (BEiT's) indexes a class token and the patches: it "
                              "needs class_token=True, no registers and no dist_token")
        if self.rel_pos_bias != "none" and self.posemb == "sincos2d":
            raise ConfigError("rel_pos_bias with posemb='sincos2d' is not a model any "
                              "checkpoint has; use posemb='learn'")
        if self.posemb == "sincos2d" and self.width % 4:
            raise ConfigError(f"posemb='sincos2d' needs width divisible by 4, got {self.width}")

    @property
    def grid(self) -> tuple[int, int]:
        return (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])

    @property
    def stem_stride(self) -> int:
        """How many pixels of the image one position of the stem's map covers, per side."""
        return 2 ** len(self.stem)

    @property
    def patch_kernel_shape(self) -> tuple[int, int, int, int]:
        """`[ph, pw, c, width]` of the patch embedding: over the image, or over the stem's map."""
        s = self.stem_stride
        c = self.stem[-1] if self.stem else self.in_channels
        return (self.patch_size[0] // s, self.patch_size[1] // s, c, self.width)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.dist_token) + self.num_registers

    @property
    def num_posemb_prefix(self) -> int:
        """Rows of `pos_embed` before the grid's: the class and distillation tokens (registers
        carry no position)."""
        return int(self.class_token) + int(self.dist_token)

    @property
    def pools_prefix(self) -> bool:
        """Whether the 'gap'/'map' pooling reads the prefix tokens too (`pool_include_prefix`,
        or the head's own convention when that is None)."""
        if self.pool_include_prefix is None:
            return self.classifier == "map"
        return self.pool_include_prefix

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.grid[0] * self.grid[1]

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    def options_set(self) -> list[str]:
        """`name=value` for each block-family option (`BLOCK_OPTIONS`) off its default: what a
        format holding the standard ViT alone cannot say."""
        defaults = ViTConfig()
        return [f"{name}={getattr(self, name)!r}" for name in BLOCK_OPTIONS
                if getattr(self, name) != getattr(defaults, name)]

    def replace(self, **overrides: Any) -> ViTConfig:
        check_fields(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> ViTConfig:
        """A config saved on disk (a checkpoint's or workdir's metadata). Checkpoints written
        before `act_layer` replaced `gelu` say `gelu: exact | tanh`; they keep loading."""
        fields = dict(fields)
        if "gelu" in fields and "act_layer" not in fields:
            old = fields.pop("gelu")
            fields["act_layer"] = {"exact": "gelu", "tanh": "gelu_tanh"}.get(old, old)
        return cls(**{k: v for k, v in fields.items() if k in FIELDS})


FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig))
# The options of timm's block families and of BEiT's and DeiT's tokens; each default leaves the
# standard ViT.
BLOCK_OPTIONS = ("norm_layer", "mlp_layer", "block_fn", "attn_layer", "proj_bias",
                 "patch_bias", "embed_norm", "pre_norm", "final_norm", "fc_norm",
                 "scale_attn_norm", "scale_mlp_norm", "rel_pos_bias", "dist_token", "stem")


# Sizes that must be at least 1 (0 would divide by zero or build an empty layer deep inside).
_POSITIVE = ("width", "depth", "mlp_dim", "num_heads", "in_channels")
_RATES = ("dropout", "attention_dropout", "drop_path")


def _check_numbers(cfg: ViTConfig) -> None:
    """One-line ConfigErrors for sizes and rates no model can have, before anything divides."""
    for name in _POSITIVE:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name}={getattr(cfg, name)}: must be at least 1")
    for name in ("patch_size", "image_size"):
        if len(getattr(cfg, name)) != 2 or min(getattr(cfg, name)) < 1:
            raise ConfigError(f"{name}={getattr(cfg, name)}: must be one or two sizes of at "
                              "least 1 pixel")
    if any(i < p for i, p in zip(cfg.image_size, cfg.patch_size, strict=True)):
        raise ConfigError(f"image_size {cfg.image_size} is smaller than patch_size "
                          f"{cfg.patch_size}; the image must hold at least one patch")
    for name in ("num_classes", "num_registers", "patch_classes"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}={getattr(cfg, name)}: must be 0 or more")
    if cfg.representation_size is not None and cfg.representation_size < 1:
        raise ConfigError(f"representation_size={cfg.representation_size}: must be at least 1, "
                          "or none for no representation layer")
    for name in _RATES:
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"{name}={getattr(cfg, name)}: must lie in [0, 1)")
    if not cfg.layer_norm_eps > 0:
        raise ConfigError(f"layer_norm_eps={cfg.layer_norm_eps}: must be above 0")


def _check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{field}={value!r} is not valid; choose one of {', '.join(choices)}")


def check_fields(overrides: dict[str, Any]) -> None:
    for key in overrides:
        if key not in FIELDS:
            near = difflib.get_close_matches(key, FIELDS, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise ConfigError(
                f"unknown model field {key!r}{hint}; valid fields: {', '.join(FIELDS)}"
            )


def _parse_spec(name: str) -> dict[str, Any] | None:
    """Decodes "B/16" or "vit_b16" into config fields (timm's long names are timm's table's)."""
    m = re.fullmatch(r"(Ti|S|M|B|L|H|g|G)/(\d+)", VARIANTS.get(name.lower(), name))
    if not m:
        return None
    width, depth, mlp_dim, heads = WIDTHS[m.group(1)]
    return dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads,
                patch_size=(int(m.group(2)),) * 2)


def variant_config(name: str, **overrides: Any) -> ViTConfig:
    """The ViTConfig of a variant name ("B/16", "vit_b16") or of any architecture of timm's
    `vision_transformer` module ("vit_base_patch16_clip_224", "aimv2_large_patch14_224",
    optionally with a `.tag`), built as timm builds it; keyword overrides applied (and
    checked). Not a recipe's `get_config()`, which returns a training ConfigDict."""
    from vit.models import timm_architectures  # a large table: loaded when a name is asked

    fields = timm_architectures.timm_fields(name)
    if fields is None:
        fields = _parse_spec(name)
    if fields is None:
        choices = list(VARIANTS) + ["<size>/<patch> such as 'B/16'",
                                    "a timm architecture such as vit_base_patch16_224"]
        names = [*VARIANTS, *timm_architectures.ARCHITECTURES]
        near = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"unknown model {name!r}{hint}; choose one of {', '.join(choices)}")
    check_fields(overrides)
    return ViTConfig(**{**fields, **overrides})


