"""timm's own models, saved by timm's own hub writer (`save_for_hf`: model.safetensors and a
config.json naming the architecture), read to timm's probabilities; what `vit convert --format
timm` writes opens in `timm.create_model("local-dir:...")` and gives them back; timm's npz reader
(`_load_weights`) opens what we write as npz; and every row of our timm architecture table is
what timm states. The models are tiny but real architectures (model_args shrink width and
depth; the name carries the rest, as a fine-tuner's config.json does)."""

import json

import numpy as np
import pytest
from timm_reference import entrypoint_args, import_timm, table_module

from vit.checkpoints import load_checkpoint, save_checkpoint
from vit.errors import CheckpointError

timm = import_timm()
pytestmark = [pytest.mark.skipif(timm is None, reason="timm is not installed "
                                 "(scripts/setup_env.sh installs it with the compare extra)"),
              pytest.mark.timeout(300)]

CASES = {  # architecture -> model_args the saved config.json carries
    "vit_base_patch16_224": dict(embed_dim=48, depth=2, img_size=32),
    # 16 heads by name (the width alone would say 12), average pooling without fc_norm
    "vit_base_patch16_gap_224": dict(embed_dim=64, depth=2, img_size=32),
    # tanh GELU by name only
    "vit_base_patch32_siglip_gap_256": dict(embed_dim=48, depth=2, img_size=64),
    # no_embed_class, 4 registers, layer scale
    "vit_small_patch14_reg4_dinov2": dict(embed_dim=48, depth=2, img_size=28),
    "vit_so150m_patch16_reg4_gap_256": dict(embed_dim=56, depth=2, img_size=32),
    # a MAP head, no class token
    "vit_base_patch16_siglip_224": dict(embed_dim=48, depth=2, img_size=32),
}


def timm_model(arch, args, seed=0):
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, num_classes=5, **args).eval()
    with torch.no_grad():  # every parameter non-trivial: zero-initialised ones included
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def timm_probs(model, images):
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(images.transpose(0, 3, 1, 2)))
    return torch.softmax(logits, -1).numpy()


def our_probs(loaded, images):
    import jax

    return np.asarray(jax.nn.softmax(loaded.build_model()(images), -1))


def _read_and_write_back(tmp_path, arch, args):
    from timm.models._hub import save_for_hf

    model = timm_model(arch, args)
    save_for_hf(model, str(tmp_path / "src"), model_args=args, safe_serialization=True)
    size = args["img_size"]
    images = np.random.RandomState(1).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    ref = timm_probs(model, images)
    assert np.ptp(ref, axis=-1).min() > 0.01
    loaded = load_checkpoint(tmp_path / "src")
    np.testing.assert_allclose(our_probs(loaded, images), ref, atol=1e-5)

    save_checkpoint(loaded, tmp_path / "out", "timm")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architecture"] in timm.list_models()
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    np.testing.assert_allclose(timm_probs(theirs, images), ref, atol=1e-5)
    return loaded, config


@pytest.mark.parametrize("arch", list(CASES))
def test_timm_saved_models_read_and_written_back_open_in_timm(tmp_path, arch):
    _read_and_write_back(tmp_path, arch, CASES[arch])


def test_fc_norm_is_read_and_written_back(tmp_path):
    # global_pool="avg" turns timm's fc_norm on: the final norm after the pooling
    args = dict(embed_dim=48, depth=2, img_size=32, global_pool="avg")
    loaded, config = _read_and_write_back(tmp_path, "vit_base_patch16_224", args)
    assert loaded.config.fc_norm and loaded.config.classifier == "gap"
    assert "fc_norm" in loaded.params and "norm" not in loaded.params


def test_an_unknown_architecture_is_refused_naming_what_would_settle_it(tmp_path):
    from timm.models._hub import save_for_hf

    args = dict(embed_dim=48, depth=2, img_size=32)
    save_for_hf(timm_model("vit_base_patch16_224", args), str(tmp_path / "src"),
                model_args=args, safe_serialization=True)
    config_file = tmp_path / "src" / "config.json"
    config = json.loads(config_file.read_text())
    config["architecture"] = "vit_nonesuch_patch16_224"
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="vit_nonesuch_patch16_224.*num_heads"):
        load_checkpoint(tmp_path / "src")


def test_timms_npz_reader_opens_what_we_write(tmp_path):
    from timm.models.vision_transformer import _load_weights

    args = dict(embed_dim=48, depth=2, img_size=32)
    src = timm_model("vit_base_patch16_224", args, seed=3)
    from timm.models._hub import save_for_hf

    save_for_hf(src, str(tmp_path / "src"), model_args=args, safe_serialization=True)
    loaded = load_checkpoint(tmp_path / "src")
    from vit.models.config import ViTConfig

    # npz files imply tanh GELU
    loaded.config = ViTConfig(**{**loaded.config.to_dict(), "act_layer": "gelu_tanh"})
    loaded.preprocessing = loaded.preprocessing.__class__(size=(32, 32), resample="bilinear")
    save_checkpoint(loaded, tmp_path / "m.npz", "npz", lossy=True)
    theirs = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=5,
                               act_layer="gelu_tanh", **args).eval()
    _load_weights(theirs, str(tmp_path / "m.npz"))
    images = np.random.RandomState(2).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    ref = timm_probs(theirs, images)
    assert np.ptp(ref, axis=-1).min() > 0.01
    np.testing.assert_allclose(our_probs(load_checkpoint(tmp_path / "m.npz"), images), ref,
                               atol=1e-5)


def test_the_architecture_table_is_what_timm_states():
    import vit.models.timm_table as table

    if timm.__version__ != table.TIMM_VERSION:
        pytest.skip(f"the table states timm {table.TIMM_VERSION}, timm {timm.__version__} is "
                    "installed")
    with open(table.__file__) as f:
        assert f.read() == table_module(timm)
    # and its rows are what the entry points pass (spot-check beside the whole-text check)
    assert table.ARCHITECTURES["vit_base_patch16_gap_224"]["num_heads"] == entrypoint_args(
        timm, "vit_base_patch16_gap_224")["num_heads"] == 16


@pytest.mark.slow  # builds every architecture twice, on the meta device
def test_the_table_resolves_each_architecture_as_timm_builds_it():
    """Heads, activation, pooling, fc_norm, class token, registers, no_embed_class and layer
    scale of every table row, resolved by our code, against timm's model built on the meta
    device (no weights made)."""
    import torch

    import vit.models.timm_architectures as ta

    for arch in ta.ARCHITECTURES:
        # timm's distilled DeiT pools its two tokens only (it refuses another global_pool)
        extras = ({},) if ta.ARCHITECTURES[arch].get("distilled") else ({}, {"global_pool": "avg"})
        for extra in extras:
            args = ta.arguments(arch, extra, arch)
            with torch.device("meta"):
                m = timm.create_model(arch, pretrained=False, **extra)
            attn = getattr(m.blocks[0], "attn", None)  # parallel blocks have none
            got = {"heads": getattr(attn, "num_heads", args["num_heads"]),
                   "class_token": m.cls_token is not None, "no_embed_class": m.no_embed_class,
                   "global_pool": m.global_pool, "reg_tokens": m.num_reg_tokens,
                   "fc_norm": not isinstance(m.fc_norm, torch.nn.Identity),
                   "layer_scale": (args["init_values"] is not None if not hasattr(
                       m.blocks[0], "ls1") else not isinstance(m.blocks[0].ls1,
                                                               torch.nn.Identity))}
            want = {"heads": args["num_heads"], "class_token": bool(args["class_token"]),
                    "no_embed_class": bool(args["no_embed_class"]),
                    "global_pool": args["global_pool"], "reg_tokens": args["reg_tokens"],
                    "fc_norm": bool(args["fc_norm"]) and bool(args["final_norm"]),
                    "layer_scale": args["init_values"] is not None}
            assert got == want, (arch, extra)
            fields, bad = ta.config_fields(args)
            if not bad:  # our activation, norm and eps are the ones timm builds
                block = m.blocks[0]
                mlp = block.mlp if hasattr(block, "mlp") else (
                    block.ffns[0].mlp if hasattr(block, "ffns") else None)
                act = type(mlp.act if mlp is not None else block.mlp_act).__name__
                assert fields["act_layer"] == {"GELU": "gelu", "GELUTanh": "gelu_tanh",
                                               "QuickGELU": "quick_gelu",
                                               "SiLU": "silu"}[act], arch
                norm = (block.norm1 if hasattr(block, "norm1") else block.attns[0].norm
                        if hasattr(block, "attns") else block.in_norm)
                assert fields["norm_layer"] == {"LayerNorm": "layernorm",
                                                "RmsNorm": "rmsnorm"}[type(norm).__name__]
                assert norm.eps == fields["layer_norm_eps"], arch


OURS = {  # our models with block options -> timm opens what we write, to the same probabilities
    "rmsnorm_swiglu_token": dict(norm_layer="rmsnorm", mlp_layer="swiglu", act_layer="silu",
                                 proj_bias=False, embed_norm=True),
    "parallel_qk_norm_map": dict(block_fn="parallel", qk_norm=True, act_layer="gelu_tanh",
                                 classifier="map", num_registers=2, pool_include_prefix=False),
    "res_post_fc_norm": dict(block_fn="res_post", classifier="gap", fc_norm=True,
                             class_token=False),
    "glu_pre_norm": dict(mlp_layer="glu", act_layer="silu", layer_scale=0.1, pre_norm=True,
                         patch_bias=False, final_norm=False),
    "diff_parallel_scaling": dict(block_fn="parallel_scaling", attn_layer="diff",
                                  qkv_bias=False, scale_attn_norm=False),
}


@pytest.mark.parametrize("name", list(OURS))
def test_our_models_with_options_open_in_timm(tmp_path, name):
    import jax
    from flax import nnx

    import vit
    from vit.checkpoints import LoadedCheckpoint

    model = vit.create_model("Ti/16", width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8,
                             image_size=16, num_classes=5, rngs=nnx.Rngs(0), **OURS[name])
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape)
                                                for x, k in zip(leaves, keys, strict=True)]))
    images = np.random.RandomState(2).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    ours = np.asarray(jax.nn.softmax(model(images), -1))
    assert np.ptp(ours, axis=-1).min() > 1e-3
    save_checkpoint(LoadedCheckpoint.from_model(model), tmp_path / "out", "timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    np.testing.assert_allclose(timm_probs(theirs, images), ours, atol=1e-5)
    np.testing.assert_allclose(our_probs(load_checkpoint(tmp_path / "out"), images), ours,
                               atol=1e-6)


def test_what_no_timm_architecture_builds_is_refused_naming_it(tmp_path):
    import vit

    model = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=8,
                             image_size=16, num_classes=5, mlp_layer="swiglu",
                             block_fn="res_post")
    with pytest.raises(CheckpointError, match="the MLP.*mlp_layer='swiglu'|the block"):
        save_checkpoint(model, tmp_path / "out", "timm")
    eps = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=8,
                           image_size=16, num_classes=5, norm_layer="rmsnorm",
                           layer_norm_eps=1e-3)
    with pytest.raises(CheckpointError, match="RMSNorm eps 0.001"):
        save_checkpoint(eps, tmp_path / "out", "timm")


def _timm_built_like_ours(arch):
    """(parameters, patch grid, classes) of timm's `create_model(arch)` on the meta device
    against ours from `vit.variant_config(arch)`, which `vit.create_model` and `vit info` use."""
    import torch

    from vit.models.info import count_params

    with torch.device("meta"):
        theirs = timm.create_model(arch, pretrained=False)
    cfg = __import__("vit").variant_config(arch)
    # timm's no_embed_class gives the class token no position row, ours has one (the reader
    # folds timm's class token into it); without it timm gives registers position rows, ours
    # none (folded into the register tokens)
    folded = (cfg.width if theirs.no_embed_class and theirs.cls_token is not None else
              -cfg.width * cfg.num_registers if not theirs.no_embed_class else 0)
    timm_side = (sum(p.numel() for p in theirs.parameters()) + folded,
                 tuple(theirs.patch_embed.grid_size), theirs.num_classes)
    return timm_side, (count_params(cfg), cfg.grid, cfg.num_classes)


@pytest.mark.parametrize("arch", ["vit_base_patch16_224", "vit_base_patch16_clip_224",
                                  "aimv2_large_patch14_224", "vit_so400m_patch14_siglip_384",
                                  "vit_small_patch14_reg4_dinov2", "vit_base_patch16_rpn_224"])
def test_a_timm_name_builds_what_timm_builds(arch):
    theirs, ours = _timm_built_like_ours(arch)
    assert theirs == ours and ours[0] > 1_000_000


@pytest.mark.slow  # every architecture at full size, abstractly on both sides
@pytest.mark.timeout(1800)
def test_every_timm_name_builds_what_timm_builds():
    import vit.models.timm_table as table

    wrong = {}
    for arch in table.ARCHITECTURES:
        theirs, ours = _timm_built_like_ours(arch)
        if theirs != ours:
            wrong[arch] = (theirs, ours)
    assert not wrong, wrong
