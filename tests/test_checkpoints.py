"""Checkpoint readers and writers, checked against Hugging Face transformers' PyTorch ViT.

Every reference checkpoint is made here from a random transformers model whose every tensor is
perturbed (a swapped bias or a transposed kernel shows), saved with `save_pretrained`; the npz
and timm files are built from those same tensors by code in this file, not by our writers.
"""

import json
import shutil

import jax
import numpy as np
import pytest

import vit
from vit.checkpoints import (
    LoadedCheckpoint,
    flatten,
    load_checkpoint,
    orbax_io,
    resolve,
    save_checkpoint,
)
from vit.checkpoints.labels import default_labels, imagenet1k
from vit.errors import CheckpointError

pytestmark = pytest.mark.timeout(600)


def _peers():
    """torch and transformers, imported only by the tests that compare against them: the
    round trips, workdir and error tests need neither and must run without them."""
    return pytest.importorskip("torch"), pytest.importorskip("transformers")

# transformers' ViTConfig fields of the small ViT these tests convert.
HF_FIELDS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, image_size=32, patch_size=8)


def _probs(model, x):
    from flax import nnx

    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, x: jax.nn.softmax(nnx.merge(graphdef, s)(x), -1))
    return np.asarray(fn(state, x))


def hf_model(seed=0, num_labels=5, **overrides):
    torch, transformers = _peers()
    torch.manual_seed(seed)
    cfg = transformers.ViTConfig(**{**HF_FIELDS, **overrides}, num_labels=num_labels,
                                 id2label={i: f"class {i}" for i in range(num_labels)})
    model = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if ("layernorm" in name and name.endswith("weight")) else 0.0
            p.copy_(base + 0.3 * torch.randn_like(p))
    return model


def hf_probs(model, x_nhwc, **kw):
    torch, _ = _peers()
    with torch.no_grad():
        logits = model(torch.from_numpy(x_nhwc.transpose(0, 3, 1, 2)), **kw).logits
    return torch.softmax(logits, -1).numpy()


def images(n, size, seed=0):
    return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)


def tensors(model):
    """The tensors as `save_pretrained` writes them (in memory, transformers 5 renames)."""
    import tempfile

    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return load_file(f"{folder}/model.safetensors")


@pytest.fixture(scope="module")
def hf_exact(tmp_path_factory):
    """transformers' defaults: exact GELU, LayerNorm eps 1e-12."""
    folder = tmp_path_factory.mktemp("hf_exact")
    model = hf_model()
    model.save_pretrained(folder)
    _, transformers = _peers()
    return folder, transformers.ViTForImageClassification.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def hf_tanh():
    """Google's convention (tanh GELU, eps 1e-6): what the npz files imply."""
    return hf_model(seed=1, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)


# -- Hugging Face folders ---------------------------------------------------------------------
def test_hf_folder_matches_transformers_at_native_size(hf_exact):
    folder, ref = hf_exact
    loaded = load_checkpoint(folder)
    assert loaded.config.layer_norm_eps == 1e-12 and loaded.config.act_layer == "gelu"
    assert loaded.config.posemb_resize == "bicubic"
    assert loaded.labels == [f"class {i}" for i in range(5)]
    x = images(3, 32)
    np.testing.assert_allclose(_probs(loaded.build_model(), x), hf_probs(ref, x), atol=1e-4)


def test_hf_folder_matches_transformers_after_posemb_resize(hf_exact):
    # transformers 5.24 ViTEmbeddings.interpolate_pos_encoding: bicubic, align_corners=False.
    folder, ref = hf_exact
    loaded = load_checkpoint(folder, image_size=56)
    assert loaded.config.image_size == (56, 56) and loaded.preprocessing.size == (56, 56)
    x = images(2, 56, seed=1)
    ours = _probs(loaded.build_model(), x)
    np.testing.assert_allclose(ours, hf_probs(ref, x, interpolate_pos_encoding=True), atol=1e-4)


def test_hf_preprocessor_config_is_honoured(tmp_path, hf_exact):
    folder, _ = hf_exact
    dst = tmp_path / "hf"
    shutil.copytree(folder, dst)
    (dst / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"height": 32, "width": 32}, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}))
    pre = load_checkpoint(dst).preprocessing
    assert pre.resample == "bicubic" and pre.size == (32, 32)
    np.testing.assert_allclose(pre.mean, [0.485, 0.456, 0.406])


# -- Google npz, built from the transformers tensors by an independent route ------------------
def vit_jax_arrays(sd, heads, prefix=""):
    """vit_jax names: MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3, class row in
    the position embedding; kernels (in, heads, head_dim)."""
    d = sd["vit.embeddings.cls_token"].shape[-1]
    hd = d // heads
    out = {"cls": sd["vit.embeddings.cls_token"],
           "embedding/kernel": np.transpose(sd["vit.embeddings.patch_embeddings.projection.weight"],
                                            (2, 3, 1, 0)),
           "embedding/bias": sd["vit.embeddings.patch_embeddings.projection.bias"],
           "Transformer/posembed_input/pos_embedding": sd["vit.embeddings.position_embeddings"],
           "Transformer/encoder_norm/scale": sd["vit.layernorm.weight"],
           "Transformer/encoder_norm/bias": sd["vit.layernorm.bias"],
           "head/kernel": sd["classifier.weight"].T, "head/bias": sd["classifier.bias"]}
    i = 0
    while f"vit.encoder.layer.{i}.layernorm_before.weight" in sd:
        h, b = f"vit.encoder.layer.{i}.", f"Transformer/encoderblock_{i}/"
        for ours, theirs in (("query", "query"), ("key", "key"), ("value", "value")):
            w = sd[f"{h}attention.attention.{theirs}.weight"]  # (out, in)
            out[f"{b}MultiHeadDotProductAttention_1/{ours}/kernel"] = w.T.reshape(d, heads, hd)
            out[f"{b}MultiHeadDotProductAttention_1/{ours}/bias"] = (
                sd[f"{h}attention.attention.{theirs}.bias"].reshape(heads, hd))
        w = sd[f"{h}attention.output.dense.weight"]
        out[f"{b}MultiHeadDotProductAttention_1/out/kernel"] = w.T.reshape(heads, hd, d)
        out[f"{b}MultiHeadDotProductAttention_1/out/bias"] = sd[f"{h}attention.output.dense.bias"]
        out[f"{b}LayerNorm_0/scale"] = sd[f"{h}layernorm_before.weight"]
        out[f"{b}LayerNorm_0/bias"] = sd[f"{h}layernorm_before.bias"]
        out[f"{b}LayerNorm_2/scale"] = sd[f"{h}layernorm_after.weight"]
        out[f"{b}LayerNorm_2/bias"] = sd[f"{h}layernorm_after.bias"]
        out[f"{b}MlpBlock_3/Dense_0/kernel"] = sd[f"{h}intermediate.dense.weight"].T
        out[f"{b}MlpBlock_3/Dense_0/bias"] = sd[f"{h}intermediate.dense.bias"]
        out[f"{b}MlpBlock_3/Dense_1/kernel"] = sd[f"{h}output.dense.weight"].T
        out[f"{b}MlpBlock_3/Dense_1/bias"] = sd[f"{h}output.dense.bias"]
        i += 1
    return {prefix + k: v for k, v in out.items()}


def big_vision_arrays(sd, heads, stacked):
    """big_vision names (Linen numbering from 0), `params/` prefix, a top-level pos_embedding
    without a class row (the class token gets its position folded in), optionally scanned."""
    flat = vit_jax_arrays(sd, heads)
    out = {}
    rename = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
              "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
    for k, v in flat.items():
        for a, b in rename.items():
            k = k.replace(a, b)
        out[k] = v
    pe = out.pop("Transformer/posembed_input/pos_embedding")
    out["pos_embedding"], out["cls"] = pe[:, 1:], out["cls"] + pe[:, :1]
    if stacked:
        layers = sorted({k.split("/")[1] for k in out if k.startswith("Transformer/encoderblock_")})
        first = "Transformer/encoderblock_0/"
        for rest in [k.split("/", 2)[2] for k in out if k.startswith(first)]:
            out[f"Transformer/encoderblock/{rest}"] = np.stack(
                [out.pop(f"Transformer/{layer}/{rest}") for layer in layers])
    return {"params/" + k: v for k, v in out.items()}


def test_vit_jax_npz_matches_transformers(tmp_path, hf_tanh):
    path = tmp_path / "ViT-tiny.npz"
    np.savez(path, **vit_jax_arrays(tensors(hf_tanh), heads=4, prefix="opt/target/"))
    loaded = load_checkpoint(path)
    assert loaded.config.act_layer == "gelu_tanh" and loaded.config.layer_norm_eps == 1e-6
    assert loaded.config.num_heads == 4 and loaded.config.image_size == (32, 32)
    assert loaded.preprocessing.mean == (0.5, 0.5, 0.5)  # inputs in [-1, 1]
    x = images(3, 32, seed=2)
    np.testing.assert_allclose(_probs(loaded.build_model(), x), hf_probs(hf_tanh, x), atol=1e-4)


@pytest.mark.parametrize("stacked", [False, True])
def test_big_vision_npz_matches_transformers(tmp_path, hf_tanh, stacked):
    path = tmp_path / "bv.npz"
    np.savez(path, **big_vision_arrays(tensors(hf_tanh), heads=4, stacked=stacked))
    loaded = load_checkpoint(path)
    assert loaded.family == "big_vision" and loaded.config.depth == 2
    assert loaded.config.posemb_resize == "linear"
    x = images(2, 32, seed=3)
    np.testing.assert_allclose(_probs(loaded.build_model(), x), hf_probs(hf_tanh, x), atol=1e-4)


def test_npz_convention_only_differs_by_gelu_and_eps(tmp_path, hf_exact):
    # The same tensors read as vit_jax get tanh GELU / eps 1e-6: close to, not equal to, HF's.
    folder, ref = hf_exact
    path = tmp_path / "v.npz"
    np.savez(path, **vit_jax_arrays(tensors(ref), heads=4))
    loaded = load_checkpoint(path)
    x = images(2, 32, seed=4)
    exact = vit.ViTConfig(**{**loaded.config.to_dict(), "act_layer": "gelu",
                             "layer_norm_eps": 1e-12})
    as_hf = LoadedCheckpoint(exact, loaded.params, loaded.preprocessing).build_model()
    np.testing.assert_allclose(_probs(as_hf, x), hf_probs(ref, x), atol=1e-4)
    assert not np.allclose(_probs(loaded.build_model(), x), hf_probs(ref, x), atol=1e-7)


@pytest.mark.slow
def test_npz_dynamic_image_size_resizes_like_scipy_zoom(tmp_path, hf_tanh):
    # vit_jax and big_vision resize with scipy.ndimage.zoom(order=1), corners aligned; an npz
    # model run at another size (dynamic_image_size) must do the same, not timm's bicubic.
    import scipy.ndimage

    path = tmp_path / "v.npz"
    np.savez(path, **vit_jax_arrays(tensors(hf_tanh), heads=4))
    loaded = load_checkpoint(path, dynamic_image_size=True)
    assert loaded.config.posemb_resize == "linear" and loaded.config.grid == (4, 4)
    x = images(2, 48, seed=10)  # a 6x6 grid
    ours = _probs(loaded.build_model(), x)

    pe = loaded.params["pos_embed"]  # [1, 1 + 16, d]: the class row, then the 4x4 grid
    d = pe.shape[-1]
    zoomed = scipy.ndimage.zoom(pe[0, 1:].reshape(4, 4, d), (6 / 4, 6 / 4, 1), order=1)
    assert zoomed.shape == (6, 6, d)
    ref_params = {**loaded.params,
                  "pos_embed": np.concatenate([pe[:, :1], zoomed.reshape(1, 36, d)], axis=1)}
    ref_config = loaded.config.replace(image_size=48, dynamic_image_size=False)
    ref = _probs(LoadedCheckpoint(ref_config, ref_params, loaded.preprocessing).build_model(), x)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    # Resizing at load time follows the same convention.
    static = load_checkpoint(path, image_size=48)
    np.testing.assert_allclose(_probs(static.build_model(), x), ref, atol=1e-5)
    # The two conventions differ visibly here, so the checks above can tell them apart.
    bicubic = loaded.config.replace(posemb_resize="bicubic")
    as_bicubic = _probs(LoadedCheckpoint(bicubic, loaded.params,
                                         loaded.preprocessing).build_model(), x)
    assert not np.allclose(as_bicubic, ours, atol=1e-5)
    # Our orbax checkpoints store the whole config: the npz convention survives a conversion.
    save_checkpoint(loaded, tmp_path / "orbax", "orbax")
    assert load_checkpoint(tmp_path / "orbax").config.posemb_resize == "linear"


def test_i21k_zero_head_is_flagged(tmp_path, hf_tanh):
    arrays = vit_jax_arrays(tensors(hf_tanh), heads=4)
    arrays["pre_logits/kernel"] = np.ones((32, 32), np.float32) * 0.01
    arrays["pre_logits/bias"] = np.zeros(32, np.float32)
    arrays["head/kernel"] = np.zeros((32, 21843), np.float32)
    arrays["head/bias"] = np.zeros(21843, np.float32)
    path = tmp_path / "imagenet21k_ViT.npz"
    np.savez(path, **arrays)
    loaded = load_checkpoint(path)
    assert loaded.config.representation_size == 32 and loaded.labels is None
    assert any("all zeros" in w and "fine-tune" in w for w in loaded.warnings)
    fresh = load_checkpoint(path, num_classes=10)  # fine-tuning start: head dropped, no warning
    assert fresh.params["head"]["kernel"].shape == (32, 10) and not any(
        "all zeros" in w for w in fresh.warnings)


# -- timm layout, built from the transformers tensors ----------------------------------------
def timm_tensors(sd):
    out = {"cls_token": sd["vit.embeddings.cls_token"],
           "pos_embed": sd["vit.embeddings.position_embeddings"],
           "patch_embed.proj.weight": sd["vit.embeddings.patch_embeddings.projection.weight"],
           "patch_embed.proj.bias": sd["vit.embeddings.patch_embeddings.projection.bias"],
           "norm.weight": sd["vit.layernorm.weight"], "norm.bias": sd["vit.layernorm.bias"],
           "head.weight": sd["classifier.weight"], "head.bias": sd["classifier.bias"]}
    for i in range(2):
        h, b = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        for suffix in ("weight", "bias"):
            out[f"{b}attn.qkv.{suffix}"] = np.concatenate(
                [sd[f"{h}attention.attention.{n}.{suffix}"] for n in ("query", "key", "value")])
            out[f"{b}attn.proj.{suffix}"] = sd[f"{h}attention.output.dense.{suffix}"]
            out[f"{b}norm1.{suffix}"] = sd[f"{h}layernorm_before.{suffix}"]
            out[f"{b}norm2.{suffix}"] = sd[f"{h}layernorm_after.{suffix}"]
            out[f"{b}mlp.fc1.{suffix}"] = sd[f"{h}intermediate.dense.{suffix}"]
            out[f"{b}mlp.fc2.{suffix}"] = sd[f"{h}output.dense.{suffix}"]
    return out


def test_timm_safetensors_matches_transformers(tmp_path):
    from safetensors.numpy import save_file

    ref = hf_model(seed=2, layer_norm_eps=1e-6)  # timm: exact GELU, eps 1e-6
    folder = tmp_path / "timm"
    folder.mkdir()
    save_file(timm_tensors(tensors(ref)), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architecture": "vit_custom", "num_classes": 5, "model_args": {"num_heads": 4},
        "pretrained_cfg": {"input_size": [3, 32, 32], "interpolation": "bicubic",
                           "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9}}))
    loaded = load_checkpoint(folder)
    assert loaded.family == "timm" and loaded.preprocessing.crop_pct == 0.9
    assert loaded.config.posemb_resize == "bicubic_antialias"  # timm's resample_abs_pos_embed
    x = images(2, 32, seed=5)
    np.testing.assert_allclose(_probs(loaded.build_model(), x), hf_probs(ref, x), atol=1e-4)
    # At another size timm resizes as its resample_abs_pos_embed does: bicubic, antialiased
    # (not as transformers' interpolate_pos_encoding, which does not antialias).
    import torch

    resized = load_checkpoint(folder, image_size=48)
    grid = np.asarray(loaded.params["pos_embed"])[:, 1:].reshape(1, 4, 4, -1)
    want = torch.nn.functional.interpolate(
        torch.from_numpy(grid.transpose(0, 3, 1, 2)), size=(6, 6), mode="bicubic",
        align_corners=False, antialias=True).permute(0, 2, 3, 1).reshape(36, -1).numpy()
    np.testing.assert_allclose(np.asarray(resized.params["pos_embed"])[0, 1:], want, atol=1e-6)


def test_timm_names_are_aliases_and_resolve_from_the_hub_cache(tmp_path, monkeypatch, hf_exact):
    assert vit.variant_config("vit_tiny_patch16_224") == vit.variant_config(
        "Ti/16", posemb_resize="bicubic_antialias")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = vit.create_model("vit_tiny_patch16_224", width=32, depth=1, mlp_dim=64,
                             num_heads=4, image_size=32)
    repo = tmp_path / "models--timm--vit_tiny_patch16_224.test_tag"
    save_checkpoint(model, repo / "snapshots" / "abc123", "timm")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    for name in ("vit_tiny_patch16_224.test_tag", "vit_tiny_patch16_224"):
        loaded = load_checkpoint(name)
        assert loaded.family == "timm" and "abc123" in loaded.source
    hf_repo = tmp_path / "models--google--vit-tiny-test"
    shutil.copytree(hf_exact[0], hf_repo / "snapshots" / "r1")
    (hf_repo / "refs").mkdir()
    (hf_repo / "refs" / "main").write_text("r1")
    assert load_checkpoint("google/vit-tiny-test").family == "hf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing leaves the machine
    with pytest.raises(CheckpointError, match="hf download google/vit-absent"):
        load_checkpoint("google/vit-absent")


# -- round trips: every tensor bit-identical --------------------------------------------------
def assert_same(a: LoadedCheckpoint, b: LoadedCheckpoint, config=True):
    fa, fb = flatten(a.params), flatten(b.params)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert np.asarray(fb[k]).dtype == np.float32
        assert np.array_equal(np.asarray(fa[k]), np.asarray(fb[k])), k
    if config:
        assert a.config == b.config


def featured(labels=None, **kw) -> LoadedCheckpoint:
    """A tiny config with random weights in every tensor (no model is built)."""
    from vit.checkpoints import expected_shapes, nest

    base = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, image_size=32,
                num_classes=5)
    cfg = vit.variant_config("Ti/16", **{**base, **kw})
    rng = np.random.RandomState(7)
    params = nest({path: rng.randn(*shape).astype(np.float32)
                   for path, shape in expected_shapes(cfg).items()})
    return LoadedCheckpoint(cfg, params, vit.preprocess.INCEPTION.with_size(32), labels)


@pytest.mark.parametrize("fmt,dst,refusal", [
    ("npz", "a.npz", "cannot hold gelu activation"), ("hf", "hf", None),
    ("timm", "timm", "LayerNorm eps 1e-12"), ("orbax", "orbax", None)])
def test_round_trip_from_hf_is_bit_identical_or_refused(tmp_path, hf_exact, fmt, dst, refusal):
    # transformers' defaults (exact GELU, eps 1e-12): npz implies tanh and 1e-6, timm 1e-6.
    src = load_checkpoint(hf_exact[0])
    if refusal:
        refusal = refusal.replace("gelu", src.config.act_layer)
        with pytest.raises(CheckpointError, match=refusal):
            save_checkpoint(src, tmp_path / dst, fmt)
        assert not (tmp_path / dst).exists()
        return
    save_checkpoint(src, tmp_path / dst, fmt)
    back = load_checkpoint(tmp_path / dst)
    assert_same(src, back)
    assert back.preprocessing == src.preprocessing and back.labels == src.labels


@pytest.mark.parametrize("features", [
    dict(classifier="map", class_token=False, qk_norm=True),
    dict(num_registers=4, layer_scale=1e-5),
    dict(classifier="gap", qkv_bias=False),
])
@pytest.mark.parametrize("fmt", ["timm", "orbax"])
def test_round_trip_of_model_features(tmp_path, features, fmt):
    resize = "bicubic_antialias" if fmt == "timm" else "bicubic"  # the format's convention
    src = featured(labels=[f"c{i}" for i in range(5)], posemb_resize=resize, **features)
    save_checkpoint(src, tmp_path / "out", fmt)
    back = load_checkpoint(tmp_path / "out")
    assert_same(src, back)  # same config and tensors: the same function
    assert back.labels == src.labels and back.preprocessing == src.preprocessing


@pytest.mark.parametrize("features,words", [
    (dict(classifier="gap"), "'gap' head"), (dict(classifier="map"), "'map' head"),
    (dict(num_registers=2), "2 register tokens"), (dict(layer_scale=0.1), "layer scale"),
    (dict(qk_norm=True), "qk-norm"), (dict(patch_classes=4), "per-patch readout of 4")])
def test_hf_folder_refuses_what_it_cannot_hold(tmp_path, features, words):
    model = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=8,
                             image_size=32, num_classes=3, **features)
    # As a trained model's, the key bias is not zero (a fresh one's is, and transformers' BEiT,
    # whose attention has no key bias, would then hold layer scale).
    qkv = model.blocks[0].attn.qkv
    qkv.bias.value = qkv.bias.value + 0.5
    with pytest.raises(CheckpointError, match=words):
        save_checkpoint(model, tmp_path / "hf", "hf")


# -- orbax workdirs ---------------------------------------------------------------------------
def test_workdir_uses_best_then_latest_and_skips_unfinished(tmp_path):
    import orbax.checkpoint as ocp

    from vit.checkpoints import orbax_format

    src = featured()
    model_config = src.config.to_dict()
    del model_config["posemb_resize"]  # as older checkpoints were written: the default applies
    meta = orbax_format.make_meta(model_config, src.preprocessing.to_dict(), None, 0)
    ckpt = tmp_path / "run" / "checkpoints"
    manager = ocp.CheckpointManager(ckpt, item_names=(orbax_format.PARAMS, orbax_format.META))
    for step in (100, 200):
        manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(src.params),
            meta=ocp.args.JsonSave({**meta, "step": step})))
    manager.wait_until_finished()
    (ckpt / "300.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save
    step_dir, which = orbax_io.find_workdir_checkpoint(tmp_path / "run")
    assert step_dir.name == "200" and which == "latest checkpoint, step 200"
    (ckpt / orbax_format.BEST_FILE).write_text(json.dumps({"step": 100, "accuracy": 0.5}))
    loaded = load_checkpoint(tmp_path / "run")
    assert loaded.source == f"workdir {tmp_path / 'run'}: best checkpoint, step 100"
    assert_same(src, loaded)
    x = images(2, 32, seed=9)  # and the weights reach a working model
    assert np.isfinite(_probs(loaded.build_model(), x)).all()


# -- errors: one line naming the problem ------------------------------------------------------
def test_unknown_layouts_name_the_expected_keys(tmp_path):
    np.savez(tmp_path / "odd.npz", foo=np.zeros(3, np.float32))
    with pytest.raises(CheckpointError, match="expected 'embedding/kernel'"):
        load_checkpoint(tmp_path / "odd.npz")
    arrays = vit_jax_arrays(tensors(hf_model()), heads=4)
    del arrays["Transformer/encoderblock_1/LayerNorm_2/scale"]
    np.savez(tmp_path / "broken.npz", **arrays)
    with pytest.raises(CheckpointError, match="encoderblock_1/LayerNorm_2/scale"):
        load_checkpoint(tmp_path / "broken.npz")
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "absent")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pickled"):
        load_checkpoint(tmp_path / "w.bin")


def test_shape_mismatch_is_a_checkpoint_error(hf_exact):
    with pytest.raises(CheckpointError, match="do not fit.*patch_kernel"):
        load_checkpoint(hf_exact[0], patch_size=4)


def test_format_detection(tmp_path, hf_exact):
    assert resolve.detect(hf_exact[0])[0] == "hf"
    assert resolve.detect(hf_exact[0] / "model.safetensors")[0] == "hf"


def test_bundled_imagenet_labels():
    names = imagenet1k()
    assert len(names) == 1000 and len(set(names)) == 1000
    assert names[0].startswith("tench") and names[1].startswith("goldfish")
    assert names[999].startswith("toilet tissue")
    assert default_labels(1000) == list(names) and default_labels(10) is None
