"""The ViT's model options (timm's block families: norms, MLPs, block functions, scale norms,
pre/final/fc norms; BEiT's relative position bias; DeiT's distillation token; DINOv2's
token_gap head), each against timm's own layer with the same weights where timm has one; the
standard ViT's parameter tree, written out from timm's names; and the options through
training (gradients, remat), explain mode, parameter counts and an orbax round trip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from timm_reference import import_timm

from vit.checkpoints.tree import flatten, nest
from vit.models import create_model
from vit.models.config import ViTConfig

pytestmark = pytest.mark.timeout(300)

timm = import_timm()
needs_timm = pytest.mark.skipif(timm is None, reason="timm is not installed "
                                "(scripts/setup_env.sh installs it)")
D, HEADS, HIDDEN, GRID = 32, 4, 48, (2, 3)
VIT_FIELDS = dict(width=D, depth=2, num_heads=HEADS, mlp_dim=HIDDEN, patch_size=8,
                  image_size=(16, 24), num_classes=5)


def config(**fields) -> ViTConfig:
    return ViTConfig(**{**VIT_FIELDS, **fields})


def params_of(module) -> dict:
    return {path: np.asarray(v) for path, v in
            flatten(nnx.to_pure_dict(nnx.state(module, nnx.Param))).items()}


def copy_from_torch(ours, theirs) -> None:
    """Every parameter of `ours` from the torch module `theirs`, by name: our path joined by
    dots is the torch key, but for `kernel` (torch's `weight`, transposed) and `scale`
    (`weight`). Every torch parameter must be used."""
    state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    new, used = {}, set()
    for path in params_of(ours):
        leaf = {"kernel": "weight", "scale": "weight"}.get(path[-1], path[-1])
        key = ".".join([*map(str, path[:-1]), leaf])
        used.add(key)
        new[path] = state[key].T if path[-1] == "kernel" else state[key]
    assert used == set(state), set(state) ^ used
    model_state = nnx.state(ours, nnx.Param)
    nnx.replace_by_pure_dict(model_state, nest({k: jnp.asarray(v) for k, v in new.items()}))
    nnx.update(ours, model_state)


def perturbed(module, seed=0):
    """The torch module with every parameter moved off its initial value."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module.eval()


def torch_call(module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def tokens(n=7, seed=3, width=D) -> np.ndarray:
    return np.random.RandomState(seed).randn(2, n, width).astype(np.float32)


# -- the standard ViT's parameter tree is timm's, unchanged --------------------------------------
# Written from timm's VisionTransformer (patch_embed.proj, cls_token, pos_embed, blocks.i.norm1,
# attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2, norm, head) in our names, not from our code.
STANDARD = ["patch_kernel", "patch_bias", "cls_token", "pos_embed", "norm/scale", "norm/bias",
            "head/kernel", "head/bias"] + [
    f"blocks/{i}/{name}" for i in range(2) for name in (
        "norm1/scale", "norm1/bias", "attn/qkv/kernel", "attn/qkv/bias", "attn/proj/kernel",
        "attn/proj/bias", "norm2/scale", "norm2/bias", "mlp/fc1/kernel", "mlp/fc1/bias",
        "mlp/fc2/kernel", "mlp/fc2/bias")]


def test_the_standard_vit_has_timms_parameters_and_no_others():
    names = {"/".join(map(str, p)) for p in params_of(create_model(config()))}
    assert names == set(STANDARD)


OPTION_NAMES = {  # option -> parameters it adds (+) or removes (-), in timm's names
    "patch_bias": (False, {"-patch_bias"}),
    "embed_norm": (True, {"+patch_norm/scale", "+patch_norm/bias"}),
    "pre_norm": (True, {"+norm_pre/scale", "+norm_pre/bias"}),
    "final_norm": (False, {"-norm/scale", "-norm/bias"}),
    "dist_token": (True, {"+dist_token", "+head_dist/kernel", "+head_dist/bias"}),
    "proj_bias": (False, {f"-blocks/{i}/{n}/bias" for i in range(2)
                          for n in ("attn/proj", "mlp/fc1", "mlp/fc2")}),
    "scale_attn_norm": (True, {f"+blocks/{i}/attn/norm/{p}" for i in range(2)
                               for p in ("scale", "bias")}),
    "scale_mlp_norm": (True, {f"+blocks/{i}/mlp/norm/{p}" for i in range(2)
                              for p in ("scale", "bias")}),
    "rel_pos_bias": ("shared", {"+rel_pos_bias/table"}),
}


@pytest.mark.parametrize("option", list(OPTION_NAMES))
def test_each_option_adds_or_removes_the_parameters_timm_names(option):
    value, change = OPTION_NAMES[option]
    names = {"/".join(map(str, p)) for p in params_of(create_model(config(**{option: value})))}
    assert names == (set(STANDARD) | {c[1:] for c in change if c[0] == "+"}) - {
        c[1:] for c in change if c[0] == "-"}


def test_block_families_and_mlps_are_named_as_timm_names_them():
    def block0(**fields):
        return {"/".join(map(str, p[2:])) for p in params_of(create_model(config(**fields)))
                if p[:2] == ("blocks", 0)}

    assert block0(mlp_layer="swiglu", norm_layer="rmsnorm") == {
        "norm1/scale", "attn/qkv/kernel", "attn/qkv/bias", "attn/proj/kernel", "attn/proj/bias",
        "norm2/scale", "mlp/fc1_g/kernel", "mlp/fc1_g/bias", "mlp/fc1_x/kernel",
        "mlp/fc1_x/bias", "mlp/fc2/kernel", "mlp/fc2/bias"}
    assert block0(block_fn="parallel", layer_scale=0.1, num_parallel=2) == {
        f"{group}/{j}/{name}" for j in range(2) for group, names in (
            ("attns", ("norm/scale", "norm/bias", "attn/qkv/kernel", "attn/qkv/bias",
                       "attn/proj/kernel", "attn/proj/bias", "ls/gamma")),
            ("ffns", ("norm/scale", "norm/bias", "mlp/fc1/kernel", "mlp/fc1/bias",
                      "mlp/fc2/kernel", "mlp/fc2/bias", "ls/gamma"))) for name in names}
    assert block0(rel_pos_bias="layer") >= {"attn/rel_pos_bias/table"}
    shapes = params_of(create_model(config(mlp_layer="glu")))
    assert shapes[("blocks", 0, "mlp", "fc2", "kernel")].shape == (HIDDEN // 2, D)


# -- against timm's own layers ----------------------------------------------------------------
@needs_timm
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rmsnorm_is_timms(eps):
    from timm.layers import RmsNorm

    from vit.models.norms import RMSNorm

    theirs, ours = perturbed(RmsNorm(D, eps=eps)), RMSNorm(D, eps)
    copy_from_torch(ours, theirs)
    x = tokens()
    np.testing.assert_allclose(ours(x), torch_call(theirs, x), atol=1e-5)


MLPS = {  # ours -> timm's class and keyword arguments
    "mlp": lambda L: (L.Mlp, {}),
    "swiglu": lambda L: (L.SwiGLU, {}),
    "glu": lambda L: (L.GluMlp, {"gate_last": False}),
}


@needs_timm
@pytest.mark.parametrize("kind", list(MLPS))
@pytest.mark.parametrize("norm,bias", [(False, True), (True, False)])
def test_mlps_are_timms(kind, norm, bias):
    import timm.layers as L
    import torch

    from vit.models.blocks import MLPS as OURS
    from vit.models.blocks import Keys

    cls, kwargs = MLPS[kind](L)
    act = {"mlp": "gelu", "swiglu": "silu", "glu": "quick_gelu"}[kind]
    cfg = config(act_layer=act, norm_layer="rmsnorm" if norm else "layernorm",
                 mlp_layer=kind)
    theirs = cls(D, HIDDEN, act_layer=L.get_act_layer(act), bias=bias,
                 norm_layer=L.RmsNorm if norm else None, **kwargs)
    ours = OURS[kind](D, HIDDEN, cfg, nnx.Rngs(0), bias=bias, norm=norm)
    copy_from_torch(ours, perturbed(theirs))
    x = tokens()
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None)), torch_call(theirs, x),
                               atol=1e-5)
    assert isinstance(theirs, torch.nn.Module)


@needs_timm
@pytest.mark.parametrize("fields", [
    dict(scale_attn_norm=True, qk_norm=True, proj_bias=False),
    dict(scale_attn_norm=True, norm_layer="rmsnorm", qkv_bias=False),
])
def test_attention_with_scale_norm_is_timms(fields):
    import timm.layers as L

    from vit.models.blocks import Attention, Keys

    cfg = config(**fields, layer_norm_eps=1e-5)
    norm = L.get_norm_layer(cfg.norm_layer)
    theirs = L.Attention(D, HEADS, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm,
                         scale_norm=cfg.scale_attn_norm, proj_bias=cfg.proj_bias,
                         norm_layer=lambda n, **kw: norm(n, eps=1e-5))
    ours = Attention(cfg, nnx.Rngs(0))
    copy_from_torch(ours, perturbed(theirs))
    x = tokens()
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None)), torch_call(theirs, x),
                               atol=1e-5)


BLOCKS = {  # ours -> timm's block class
    "block": "Block", "res_post": "ResPostBlock", "parallel": "ParallelThingsBlock"}


@needs_timm
@pytest.mark.parametrize("block_fn", list(BLOCKS))
@pytest.mark.parametrize("fields", [
    dict(layer_scale=0.1),
    dict(mlp_layer="swiglu", act_layer="silu", norm_layer="rmsnorm", proj_bias=False,
         qkv_bias=False, qk_norm=True),
    dict(scale_attn_norm=True, scale_mlp_norm=True, layer_norm_eps=1e-5, act_layer="gelu_tanh"),
])
def test_blocks_are_timms(block_fn, fields):
    import timm.layers as L
    import timm.models.vision_transformer as vt

    from vit.models.block_fns import make_block
    from vit.models.blocks import Keys

    cfg = config(block_fn=block_fn, **fields)
    norm = L.get_norm_layer(cfg.norm_layer)
    mlp = {"mlp": L.Mlp, "swiglu": L.SwiGLU}[cfg.mlp_layer]
    theirs = getattr(vt, BLOCKS[block_fn])(
        D, HEADS, mlp_ratio=HIDDEN / D, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm,
        scale_attn_norm=cfg.scale_attn_norm, scale_mlp_norm=cfg.scale_mlp_norm,
        proj_bias=cfg.proj_bias, init_values=cfg.layer_scale,
        act_layer=L.get_act_layer(cfg.act_layer),
        norm_layer=lambda n, **kw: norm(n, eps=cfg.layer_norm_eps), mlp_layer=mlp)
    ours = make_block(cfg, 0.0, nnx.Rngs(0))
    copy_from_torch(ours, perturbed(theirs))
    x = tokens()
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None)), torch_call(theirs, x),
                               atol=1e-5)
    # the last block asked for the class token alone gives that token's output
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None), queries=1),
                               torch_call(theirs, x)[:, :1], atol=1e-5)


@needs_timm
@pytest.mark.parametrize("timm_block,fields", [
    ("ParallelScalingBlock", dict(qkv_bias=False, qk_norm=True, norm_layer="rmsnorm",
                                  layer_scale=0.1)),
    ("ParallelScalingBlock", dict(qkv_bias=True, proj_bias=False, act_layer="gelu_tanh")),
    ("DiffParallelScalingBlock", dict(qkv_bias=False, layer_scale=0.1, qk_norm=True)),
])
def test_parallel_scaling_blocks_are_timms(timm_block, fields):
    import timm.layers as L
    import timm.models.vision_transformer as vt

    from vit.models.block_fns import make_block
    from vit.models.blocks import Keys

    diff = timm_block.startswith("Diff")
    cfg = config(block_fn="parallel_scaling", attn_layer="diff" if diff else "attention",
                 **fields)
    norm = L.get_norm_layer(cfg.norm_layer)
    theirs = getattr(vt, timm_block)(
        D, HEADS, mlp_ratio=HIDDEN / D, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm,
        proj_bias=cfg.proj_bias, init_values=cfg.layer_scale, depth=3,
        act_layer=L.get_act_layer(cfg.act_layer),
        norm_layer=lambda n, **kw: norm(n, eps=cfg.layer_norm_eps))
    ours = make_block(cfg, 0.0, nnx.Rngs(0), 3)
    copy_from_torch(ours, perturbed(theirs))
    x = tokens()
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None)), torch_call(theirs, x),
                               atol=1e-5)
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None), queries=1),
                               torch_call(theirs, x)[:, :1], atol=1e-5)


@needs_timm
@pytest.mark.parametrize("fields", [dict(), dict(qk_norm=True, scale_attn_norm=True)])
def test_differential_attention_is_timms(fields):
    import timm.layers as L

    from vit.models.blocks import Attention, Keys

    cfg = config(attn_layer="diff", **fields)
    theirs = L.DiffAttention(D, HEADS, qkv_bias=True, qk_norm=cfg.qk_norm,
                             scale_norm=cfg.scale_attn_norm, depth=2,
                             norm_layer=lambda n, **kw: L.LayerNorm(n, eps=1e-6))
    ours = Attention(cfg, nnx.Rngs(0), depth=2)
    copy_from_torch(ours, perturbed(theirs))
    x = tokens()
    np.testing.assert_allclose(ours(jnp.asarray(x), Keys(None)), torch_call(theirs, x),
                               atol=1e-5)
    with pytest.raises(ValueError, match="attn_layer='diff'"):
        ours(jnp.asarray(x), Keys(None), lambda probs: probs)


# -- BEiT's relative position bias (transformers' BeitRelativePositionBias) --------------------
def test_relative_position_index_is_beits():
    pytest.importorskip("torch")
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    from vit.models.relpos import relative_position_index

    for grid in ((2, 3), (4, 4)):
        theirs = BeitRelativePositionBias.generate_relative_position_index(grid).numpy()
        np.testing.assert_array_equal(relative_position_index(grid), theirs)


def _numpy_attention(x, qkv_w, qkv_b, proj_w, proj_b, bias, heads):
    b, n, d = x.shape
    qkv = (x @ qkv_w + qkv_b).reshape(b, n, 3, heads, d // heads).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads) + bias
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, n, d) @ proj_w + proj_b


@pytest.mark.parametrize("kind", ["layer", "shared"])
def test_relative_position_bias_is_added_to_the_logits(kind):
    from vit.models.blocks import Keys

    cfg = config(rel_pos_bias=kind)
    model = create_model(cfg, rngs=nnx.Rngs(1))
    table = model.rel_pos_bias if kind == "shared" else model.blocks[0].attn.rel_pos_bias
    table.table.value = jax.random.normal(jax.random.key(2), table.table.shape)
    from vit.models.relpos import relative_position_index

    index = relative_position_index(GRID)
    bias = np.asarray(table.table[...])[index].transpose(2, 0, 1)
    x = tokens(n=1 + GRID[0] * GRID[1])
    attn = model.blocks[0].attn
    p = {k: np.asarray(v[...]) for k, v in (("qkv_w", attn.qkv.kernel), ("qkv_b", attn.qkv.bias),
                                             ("proj_w", attn.proj.kernel),
                                             ("proj_b", attn.proj.bias))}
    want = _numpy_attention(x.astype(np.float64), **p, bias=bias, heads=HEADS)
    shared = model.shared_rel_pos_bias()
    got = attn(jnp.asarray(x), Keys(None), bias=shared)
    np.testing.assert_allclose(got, want, atol=1e-4)
    # and explain mode sees the same probabilities the forward pass used
    seen = []
    hooked = attn(jnp.asarray(x), Keys(None), lambda probs: seen.append(probs) or probs,
                  bias=shared)
    np.testing.assert_allclose(hooked, got, atol=1e-5)
    with pytest.raises(ValueError, match="image_size"):
        model(jnp.zeros((1, 24, 24, 3)))


# -- DeiT's distillation token and DINOv2's token_gap head --------------------------------------
def test_dist_token_order_positions_and_two_heads():
    cfg = config(dist_token=True, num_registers=2)
    model = create_model(cfg, rngs=nnx.Rngs(0))
    assert model.pos_embed.shape == (1, 2 + GRID[0] * GRID[1], D)  # [cls, dist, grid]
    for name in ("head", "head_dist"):
        layer = getattr(model, name)
        layer.kernel.value = jax.random.normal(jax.random.key(len(name)), layer.kernel.shape)
    images = jax.random.normal(jax.random.key(5), (2, 16, 24, 3))
    x = model.embed(images)
    np.testing.assert_allclose(x[:, 1], jnp.broadcast_to(
        model.dist_token[...][0] + model.pos_embed[...][0, 1], (2, D)), atol=1e-6)
    np.testing.assert_allclose(x[:, 2:4], jnp.broadcast_to(model.reg_tokens[...], (2, 2, D)))
    tokens_ = model.features(images)
    want = (model.head(tokens_[:, 0]) + model.head_dist(tokens_[:, 1])) / 2
    np.testing.assert_allclose(model(images), want, atol=1e-5)
    backbone = create_model(cfg.replace(num_classes=0), rngs=nnx.Rngs(0))
    feats = backbone.features(images)
    np.testing.assert_allclose(backbone(images), (feats[:, 0] + feats[:, 1]) / 2, atol=1e-5)


def test_token_gap_concatenates_the_class_token_and_the_patch_mean():
    model = create_model(config(classifier="token_gap", num_registers=1), rngs=nnx.Rngs(0))
    model.head.kernel.value = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
    assert model.head.kernel.shape == (2 * D, 5)
    images = jax.random.normal(jax.random.key(5), (2, 16, 24, 3))
    t = model.features(images)
    pooled = jnp.concatenate([t[:, 0], t[:, 2:].mean(1)], -1)  # registers are not patches
    np.testing.assert_allclose(model(images), model.head(pooled), atol=1e-5)


# -- the convolutional stem ---------------------------------------------------------------------
@pytest.mark.parametrize("norm_layer", ["layernorm", "rmsnorm"])
def test_the_stem_is_torchs_convolutions_then_the_patch_convolution(norm_layer):
    """`stem=(8, 16)`: two of PyTorch's Conv2d(3x3, stride 2, padding 1, no bias), each followed
    by the norm over channels and exact GELU, then the patch embedding as a Conv2d of kernel and
    stride patch_size / 4 with bias; written with torch from the paper's description."""
    import torch

    cfg = config(stem=(8, 16), norm_layer=norm_layer, class_token=False, classifier="gap",
                 posemb="sincos2d")
    model = create_model(cfg, rngs=nnx.Rngs(0))
    p = params_of(model)
    assert {k for k in p if k[0] == "stem"} == {
        ("stem", i, *name) for i in range(2) for name in (
            ("kernel",), ("norm", "scale"), *([("norm", "bias")] * (norm_layer == "layernorm")))}
    assert p[("stem", 0, "kernel")].shape == (3, 3, 3, 8)
    assert p[("patch_kernel",)].shape == (2, 2, 16, D)  # 8 pixels: 2 positions of the map
    rng = np.random.RandomState(0)
    for path in p:  # norms off their initial values, so a missing one shows
        if path[0] == "stem" and path[-1] in ("scale", "bias"):
            leaf = model.stem[path[1]].norm
            getattr(leaf, path[-1]).value = jnp.asarray(1 + 0.3 * rng.randn(*p[path].shape),
                                                        jnp.float32)
    p = params_of(model)
    images = rng.randn(2, 16, 24, 3).astype(np.float32)
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    with torch.no_grad():
        for i in range(2):
            conv = torch.nn.functional.conv2d(
                x, torch.tensor(p[("stem", i, "kernel")]).permute(3, 2, 0, 1), stride=2,
                padding=1)
            c = conv.permute(0, 2, 3, 1)
            scale = torch.tensor(p[("stem", i, "norm", "scale")])
            if norm_layer == "layernorm":
                c = torch.nn.functional.layer_norm(c, (c.shape[-1],), scale,
                                                   torch.tensor(p[("stem", i, "norm", "bias")]),
                                                   cfg.layer_norm_eps)
            else:
                c = torch.nn.functional.rms_norm(c, (c.shape[-1],), scale, cfg.layer_norm_eps)
            x = torch.nn.functional.gelu(c).permute(0, 3, 1, 2)
        assert x.shape[2:] == (4, 6)
        tokens = torch.nn.functional.conv2d(
            x, torch.tensor(p[("patch_kernel",)]).permute(3, 2, 0, 1),
            torch.tensor(p[("patch_bias",)]), stride=2)
        want = tokens.flatten(2).transpose(1, 2).numpy()
    from vit.models.posemb import sincos_2d

    got = np.asarray(model.embed(jnp.asarray(images))) - np.asarray(sincos_2d(GRID, D))
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.abs(want).max() > 0.1


def test_stem_size_rules_and_counts():
    from vit.errors import ConfigError
    from vit.models.info import count_macs

    with pytest.raises(ConfigError, match=r"patch_size \(8, 8\) must be a multiple of 16"):
        config(stem=(4, 8, 16, 32))
    with pytest.raises(ConfigError, match="stem=\\[0\\]"):
        config(stem=[0])
    assert config(stem=[4, 8]).stem == (4, 8) and config(stem=4).stem == (4,)
    # MACs: each convolution at its output's size (8x12 then 4x6 of 16x24), 9 taps; the patch
    # embedding reads 2x2 positions of 16 channels instead of 8x8 pixels of 3.
    extra = 8 * 12 * 9 * 3 * 8 + 4 * 6 * 9 * 8 * 16 + 6 * D * (2 * 2 * 16 - 8 * 8 * 3)
    assert count_macs(config(stem=(8, 16))) - count_macs(config()) == extra


@pytest.mark.parametrize("fmt", ["npz", "hf", "timm"])
def test_formats_without_a_stem_refuse_it_by_name(tmp_path, fmt):
    from vit.checkpoints import LoadedCheckpoint, save_checkpoint
    from vit.errors import CheckpointError

    model = create_model(config(stem=(8, 16)), rngs=nnx.Rngs(0))
    with pytest.raises(CheckpointError, match="stem") as err:
        save_checkpoint(LoadedCheckpoint.from_model(model), tmp_path / "out", fmt)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


# -- training, remat, explain, counts, orbax ----------------------------------------------------
EVERYTHING = [  # every option in four models (then BEiT's per-layer table, differential
    # attention in both its block families)
    dict(norm_layer="rmsnorm", mlp_layer="swiglu", act_layer="silu", proj_bias=False,
         patch_bias=False, embed_norm=True, class_token=False, classifier="gap"),
    dict(block_fn="parallel", layer_scale=0.1, pre_norm=True, fc_norm=True, qk_norm=True,
         classifier="map", num_registers=1, pool_include_prefix=False, stem=(8, 16)),
    dict(block_fn="res_post", mlp_layer="glu", scale_attn_norm=True, scale_mlp_norm=True,
         final_norm=False, act_layer="quick_gelu", rel_pos_bias="shared",
         classifier="token_gap"),
    dict(dist_token=True, num_registers=2, layer_scale=0.1, block_fn="parallel_scaling",
         qkv_bias=False),
    dict(rel_pos_bias="layer", layer_scale=0.1),
    dict(attn_layer="diff", block_fn="parallel_scaling", qk_norm=True),
    dict(attn_layer="diff", block_fn="parallel"),
]


@pytest.mark.slow  # four models compiled twice each, forward and backward
@pytest.mark.parametrize("fields", EVERYTHING[:4])
def test_options_train_with_and_without_remat(fields):
    cfg = config(**fields, dropout=0.1, drop_path=0.1)
    images = jax.random.normal(jax.random.key(0), (2, 16, 24, 3))

    def loss(model):  # the head starts at zero: the pooled features reach every block
        key = jax.random.key(1)
        return jnp.sum(model.pool(model.features(images, train=True, rng=key), train=True,
                                  rng=key) ** 2)

    grads = {}
    for remat in (False, True):
        model = create_model(cfg.replace(remat=remat), rngs=nnx.Rngs(0))
        grads[remat] = params_of(nnx.jit(nnx.grad(loss))(model))
    assert all(np.isfinite(g).all() for g in grads[False].values())
    assert any(np.abs(g).sum() > 0 for p, g in grads[False].items() if p[0] == "blocks")
    # the same up to float rounding, against the largest gradient (some are near-cancellations)
    scale = max(np.abs(g).max() for g in grads[False].values())
    for path, g in grads[False].items():
        np.testing.assert_allclose(grads[True][path] / scale, g / scale, atol=1e-5,
                                   err_msg=str(path))


@pytest.mark.parametrize("fields", EVERYTHING)
def test_parameter_counts_count_the_options(fields):
    from vit.models.info import count_macs, count_params

    cfg = config(**fields)
    assert count_params(cfg) == sum(v.size for v in params_of(create_model(cfg)).values())
    assert count_macs(cfg) > 0


def test_macs_count_each_mlp_and_branch():
    from vit.models.info import count_macs

    base = count_macs(config())
    n, d, h = 1 + GRID[0] * GRID[1], D, HIDDEN
    attention, mlp = n * d * 3 * d + 2 * n * n * d + n * d * d, 2 * n * d * h
    assert count_macs(config(mlp_layer="swiglu")) - base == 2 * n * d * h  # fc1_x, 2 blocks
    assert count_macs(config(mlp_layer="glu")) - base == -2 * n * d * h // 2
    assert count_macs(config(block_fn="parallel", num_parallel=2)) - base == 2 * (
        attention + mlp)
    assert count_macs(config(dist_token=True)) > base  # a token more, a head more
    assert count_macs(config(classifier="token_gap")) - base == d * 5


def test_explain_mode_refuses_parallel_attentions_by_name():
    from vit.models.blocks import Keys

    model = create_model(config(block_fn="parallel", num_parallel=2))
    with pytest.raises(ValueError, match="num_parallel=2"):
        model.blocks[0](jnp.zeros((1, 7, D)), Keys(None), lambda p: p)
    single = create_model(config(block_fn="parallel", num_parallel=1))
    seen = []
    single.blocks[0](jnp.zeros((1, 7, D)), Keys(None), lambda p: seen.append(p) or p)
    assert seen[0].shape == (1, HEADS, 7, 7)


@pytest.mark.parametrize("fields", EVERYTHING[:4])
def test_options_survive_an_orbax_round_trip(tmp_path, fields):
    from vit.checkpoints import LoadedCheckpoint, load_checkpoint, save_checkpoint

    model = create_model(config(**fields), rngs=nnx.Rngs(3))
    for name, value in params_of(model).items():  # a head and tables that are not zero
        if name[-1] in ("kernel", "table") and not value.any():
            leaf = model
            for key in name[:-1]:
                leaf = leaf[key] if isinstance(key, int) else getattr(leaf, key)
            getattr(leaf, name[-1]).value = jnp.full(value.shape, 0.01)
    images = jax.random.normal(jax.random.key(5), (2, 16, 24, 3))
    want = model(images)
    save_checkpoint(LoadedCheckpoint.from_model(model), tmp_path / "ckpt", "orbax")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.config == model.config
    np.testing.assert_allclose(loaded.build_model()(images), want, atol=1e-6)


@pytest.mark.parametrize("fields", [
    dict(pre_norm=True, fc_norm=True, classifier="map", num_registers=1,
         pool_include_prefix=False, norm_layer="rmsnorm"),
    dict(rel_pos_bias="shared", final_norm=False, block_fn="res_post"),
    dict(dist_token=True, block_fn="parallel_scaling", qk_norm=True),
])
def test_explain_maps_read_the_options_forward(fields):
    from vit.explanations.maps import explain_core

    model = create_model(config(**fields), rngs=nnx.Rngs(0))
    model.head.kernel.value = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
    images = jax.random.normal(jax.random.key(5), (2, 16, 24, 3))
    for method in ("rollout", "relevancy"):
        out = explain_core(model, images, jnp.array([-1, -1]), method=method,
                           head_fusion="mean", discard_ratio=0.0)
        np.testing.assert_allclose(out.logits, model(images), atol=1e-5)
        assert out.maps.shape == (2, *GRID) and np.isfinite(out.maps).all()
