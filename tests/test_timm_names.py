"""timm's names, written out here from timm's source, not from our code: the MAP head
(`attn_pool`), qk-norm, registers and layer scale, read and written; and big_vision MAP-head npz
files under the `params/img/` prefix.

The names and shapes below are stated from huggingface/pytorch-image-models
(`timm/models/vision_transformer.py`: `VisionTransformer.__init__`, `Block`;
`timm/layers/attention.py`: `Attention`; `timm/layers/attention_pool.py`:
`AttentionPoolLatent`; `LayerScale.gamma`) and the forward pass by `timm_forward`, a plain-numpy
transcription of those modules' `forward`. big_vision's MAP-head names come from timm's
`_load_weights`, the reference npz reader. timm itself is not installed (it needs torchvision);
this statement stands in for it and needs nothing but numpy.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from timm_reference import import_timm

import vit.models.timm_architectures as timm_architectures
from vit.checkpoints import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.timeout(300)

D, HEADS, MLP, DEPTH, PATCH, SIZE, CLASSES = 32, 4, 64, 2, 8, 32, 5
GRID = SIZE // PATCH


def timm_shapes(class_token=True, reg_tokens=0, qkv_bias=True, qk_norm=False,
                init_values=None, global_pool="token", no_embed_class=False):
    """{state-dict name: shape} of timm's `VisionTransformer(img_size=32, patch_size=8,
    embed_dim=32, depth=2, num_heads=4, mlp_ratio=2, num_classes=5, ...)`."""
    prefix = int(class_token) + reg_tokens
    hd = D // HEADS
    out = {"patch_embed.proj.weight": (D, 3, PATCH, PATCH), "patch_embed.proj.bias": (D,),
           "pos_embed": (1, GRID * GRID + (0 if no_embed_class else prefix), D)}
    if class_token:
        out["cls_token"] = (1, 1, D)
    if reg_tokens:
        out["reg_token"] = (1, reg_tokens, D)
    for i in range(DEPTH):
        b = f"blocks.{i}."
        out.update({b + "norm1.weight": (D,), b + "norm1.bias": (D,),
                    b + "attn.qkv.weight": (3 * D, D), b + "attn.proj.weight": (D, D),
                    b + "attn.proj.bias": (D,), b + "norm2.weight": (D,), b + "norm2.bias": (D,),
                    b + "mlp.fc1.weight": (MLP, D), b + "mlp.fc1.bias": (MLP,),
                    b + "mlp.fc2.weight": (D, MLP), b + "mlp.fc2.bias": (D,)})
        if qkv_bias:
            out[b + "attn.qkv.bias"] = (3 * D,)
        if qk_norm:  # LayerNorm over head_dim
            for n in ("q_norm", "k_norm"):
                out[f"{b}attn.{n}.weight"], out[f"{b}attn.{n}.bias"] = (hd,), (hd,)
        if init_values:
            out[b + "ls1.gamma"], out[b + "ls2.gamma"] = (D,), (D,)
    out["norm.weight"], out["norm.bias"] = (D,), (D,)
    if global_pool == "map":  # AttentionPoolLatent: qkv_bias=True always, latent_len=1
        out.update({"attn_pool.latent": (1, 1, D),
                    "attn_pool.q.weight": (D, D), "attn_pool.q.bias": (D,),
                    "attn_pool.kv.weight": (2 * D, D), "attn_pool.kv.bias": (2 * D,),
                    "attn_pool.proj.weight": (D, D), "attn_pool.proj.bias": (D,),
                    "attn_pool.norm.weight": (D,), "attn_pool.norm.bias": (D,),
                    "attn_pool.mlp.fc1.weight": (MLP, D), "attn_pool.mlp.fc1.bias": (MLP,),
                    "attn_pool.mlp.fc2.weight": (D, MLP), "attn_pool.mlp.fc2.bias": (D,)})
    out["head.weight"], out["head.bias"] = (CLASSES, D), (CLASSES,)
    return out


def random_state(shapes, seed=0):
    rng = np.random.RandomState(seed)
    out = {}
    for name, shape in shapes.items():
        base = 1.0 if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")) else 0.0
        scale = 0.5 if name.endswith("gamma") else 0.2
        out[name] = (base + scale * rng.randn(*shape)).astype(np.float32)
    return out


# -- timm's forward, transcribed in numpy (float64) -------------------------------------------
def _ln(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x, tanh):
    if tanh:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    from scipy.special import erf

    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _linear(sd, name, x):
    y = x @ sd[f"{name}.weight"].T
    return y + sd[f"{name}.bias"] if f"{name}.bias" in sd else y


def _attend(q, k, v):  # [B, H, Nq, hd], [B, H, N, hd] -> [B, Nq, H * hd]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1)


def timm_forward(sd, args, images):
    """timm `VisionTransformer.forward` on NHWC images, from the state dict alone."""
    sd = {k: v.astype(np.float64) for k, v in sd.items()}
    tanh = args.get("act_layer") == "gelu_tanh"
    b = images.shape[0]
    patches = images.reshape(b, GRID, PATCH, GRID, PATCH, 3).astype(np.float64)
    x = np.einsum("bhpwqc,dcpq->bhwd", patches, sd["patch_embed.proj.weight"])
    x = x.reshape(b, GRID * GRID, D) + sd["patch_embed.proj.bias"]
    prefix = [np.broadcast_to(sd[n], (b, *sd[n].shape[1:])) for n in ("cls_token", "reg_token")
              if n in sd]
    if args.get("no_embed_class"):
        x = np.concatenate([*prefix, x + sd["pos_embed"]], 1)
    else:
        x = np.concatenate([*prefix, x], 1) + sd["pos_embed"]
    n_prefix = sum(p.shape[1] for p in prefix)
    for i in range(DEPTH):
        p = f"blocks.{i}."
        h = _ln(x, sd[p + "norm1.weight"], sd[p + "norm1.bias"])
        qkv = _linear(sd, p + "attn.qkv", h).reshape(b, -1, 3, HEADS, D // HEADS)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)
        if p + "attn.q_norm.weight" in sd:
            q = _ln(q, sd[p + "attn.q_norm.weight"], sd[p + "attn.q_norm.bias"])
            k = _ln(k, sd[p + "attn.k_norm.weight"], sd[p + "attn.k_norm.bias"])
        h = _linear(sd, p + "attn.proj", _attend(q, k, v))
        x = x + (h * sd[p + "ls1.gamma"] if p + "ls1.gamma" in sd else h)
        h = _ln(x, sd[p + "norm2.weight"], sd[p + "norm2.bias"])
        h = _linear(sd, p + "mlp.fc2", _gelu(_linear(sd, p + "mlp.fc1", h), tanh))
        x = x + (h * sd[p + "ls2.gamma"] if p + "ls2.gamma" in sd else h)
    x = _ln(x, sd["norm.weight"], sd["norm.bias"])
    pool = args.get("global_pool", "token")
    if pool == "token":
        x = x[:, 0]
    elif pool == "avg":
        x = x[:, n_prefix:].mean(1)
    else:  # map: AttentionPoolLatent over the patches, or every token with pool_include_prefix
        tokens = x if args.get("pool_include_prefix") else x[:, n_prefix:]
        hd = D // HEADS
        q = _linear(sd, "attn_pool.q", np.broadcast_to(sd["attn_pool.latent"], (b, 1, D)))
        q = q.reshape(b, 1, HEADS, hd).transpose(0, 2, 1, 3)
        kv = _linear(sd, "attn_pool.kv", tokens).reshape(b, -1, 2, HEADS, hd)
        k, v = kv.transpose(2, 0, 3, 1, 4)
        x = _linear(sd, "attn_pool.proj", _attend(q, k, v))
        h = _ln(x, sd["attn_pool.norm.weight"], sd["attn_pool.norm.bias"])
        x = (x + _linear(sd, "attn_pool.mlp.fc2",
                         _gelu(_linear(sd, "attn_pool.mlp.fc1", h), tanh)))[:, 0]
    return _linear(sd, "head", x)


def write_timm_folder(folder, sd, args):
    """A folder as timm's `push_to_hf_hub` writes it (config.json by hand, here)."""
    folder.mkdir()
    save_file(sd, str(folder / "model.safetensors"))
    model_args = {"img_size": SIZE, "patch_size": PATCH, "embed_dim": D, "depth": DEPTH,
                  "num_heads": HEADS, "mlp_ratio": MLP / D, "num_classes": CLASSES, **args}
    (folder / "config.json").write_text(json.dumps({
        "architecture": "vit_custom", "num_classes": CLASSES, "num_features": D,
        "global_pool": args.get("global_pool", "token"), "model_args": model_args,
        "label_names": [f"n{i}" for i in range(CLASSES)],
        "pretrained_cfg": {"input_size": [3, SIZE, SIZE], "interpolation": "bicubic",
                           "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                           "crop_pct": 0.875, "crop_mode": "center"}}))


def logits(loaded, images):
    import jax

    model = loaded.build_model()
    return np.asarray(jax.jit(lambda x: model(x))(images))


VARIANTS = {  # timm model_args -> what our config must read
    "map_qk_norm": (dict(class_token=False, global_pool="map", qk_norm=True,
                         act_layer="gelu_tanh"),
                    dict(classifier="map", class_token=False, qk_norm=True, act_layer="gelu_tanh")),
    "map_with_prefix": (dict(global_pool="map", reg_tokens=2, pool_include_prefix=True),
                        dict(classifier="map", class_token=True, num_registers=2)),
    # recent timm's MAP head reads the patches alone unless pool_include_prefix
    "map_patches_only": (dict(global_pool="map", pool_include_prefix=False),
                         dict(classifier="map", class_token=True, pool_include_prefix=False)),
    "registers_layer_scale": (dict(reg_tokens=4, init_values=0.1),
                              dict(classifier="token", num_registers=4, layer_scale=0.1)),
    "gap_no_qkv_bias": (dict(global_pool="avg", fc_norm=False, qkv_bias=False),
                        dict(classifier="gap", qkv_bias=False)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_timm_names_read_and_write(tmp_path, variant):
    args, expect = VARIANTS[variant]
    shape_args = {k: v for k, v in args.items()
                  if k in ("class_token", "reg_tokens", "qkv_bias", "qk_norm", "init_values",
                           "global_pool")}
    sd = random_state(timm_shapes(**shape_args))
    write_timm_folder(tmp_path / "src", sd, args)
    loaded = load_checkpoint(tmp_path / "src")
    for field, value in expect.items():
        assert getattr(loaded.config, field) == value, field
    assert loaded.labels == [f"n{i}" for i in range(CLASSES)]
    assert loaded.preprocessing.crop_pct == 0.875 and loaded.preprocessing.resample == "bicubic"

    images = np.random.RandomState(1).randn(2, SIZE, SIZE, 3).astype(np.float32)
    ref = timm_forward(sd, args, images)
    assert np.abs(ref).max() > 0.1 and np.ptp(ref, axis=-1).min() > 0.01  # a non-trivial head
    np.testing.assert_allclose(logits(loaded, images), ref, atol=2e-4, rtol=1e-4)

    # Our writer speaks the same names, shapes and values back; the position rows of the
    # prefix tokens follow the architecture it names (folded into the tokens where that
    # architecture gives them no position: x + 0 and (t + p) + 0 are exact).
    save_checkpoint(loaded, tmp_path / "out", "timm")
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    resolved = timm_architectures.arguments(config["architecture"], config["model_args"], "")
    for key, value in args.items():
        assert resolved[key] == value, key
    prefix_keys = {"reg_token", "pos_embed", "cls_token"}
    assert written.keys() == sd.keys()
    for name in sd.keys() - prefix_keys:
        np.testing.assert_array_equal(written[name], sd[name], err_msg=name)
    np.testing.assert_allclose(timm_forward(written, resolved, images), ref, atol=1e-5)


# -- big_vision MAP-head npz, `params/img/` prefix ---------------------------------------------
def big_vision_from_timm(sd):
    """big_vision names (SigLIP image towers: `params/img/`, Linen numbering from 0, a top-level
    pos_embedding, a MAP head), mapped from timm's names as timm's `_load_weights` does, in
    reverse: kernels are `(in, heads, head_dim)` for q/k/v and `(heads, head_dim, out)` for out."""
    hd = D // HEADS
    p = "params/img/"
    out = {p + "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
           p + "embedding/bias": sd["patch_embed.proj.bias"],
           p + "pos_embedding": sd["pos_embed"],
           p + "Transformer/encoder_norm/scale": sd["norm.weight"],
           p + "Transformer/encoder_norm/bias": sd["norm.bias"],
           p + "head/kernel": sd["head.weight"].T, p + "head/bias": sd["head.bias"]}

    def mha(root, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b):
        for name, w, bias in (("query", q_w, q_b), ("key", k_w, k_b), ("value", v_w, v_b)):
            out[f"{root}/{name}/kernel"] = w.T.reshape(D, HEADS, hd)
            out[f"{root}/{name}/bias"] = bias.reshape(HEADS, hd)
        out[f"{root}/out/kernel"] = o_w.T.reshape(HEADS, hd, D)
        out[f"{root}/out/bias"] = o_b

    for i in range(DEPTH):
        t, b = f"blocks.{i}.", f"{p}Transformer/encoderblock_{i}/"
        w, bias = np.split(sd[t + "attn.qkv.weight"], 3), np.split(sd[t + "attn.qkv.bias"], 3)
        mha(b + "MultiHeadDotProductAttention_0", w[0], bias[0], w[1], bias[1], w[2], bias[2],
            sd[t + "attn.proj.weight"], sd[t + "attn.proj.bias"])
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_1")):
            out[f"{b}{theirs}/scale"], out[f"{b}{theirs}/bias"] = (sd[f"{t}{ours}.weight"],
                                                                   sd[f"{t}{ours}.bias"])
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{b}MlpBlock_0/{theirs}/kernel"] = sd[f"{t}mlp.{ours}.weight"].T
            out[f"{b}MlpBlock_0/{theirs}/bias"] = sd[f"{t}mlp.{ours}.bias"]
    m = p + "MAPHead_0/"
    out[m + "probe"] = sd["attn_pool.latent"]
    kv_w, kv_b = np.split(sd["attn_pool.kv.weight"], 2), np.split(sd["attn_pool.kv.bias"], 2)
    mha(m + "MultiHeadDotProductAttention_0", sd["attn_pool.q.weight"], sd["attn_pool.q.bias"],
        kv_w[0], kv_b[0], kv_w[1], kv_b[1], sd["attn_pool.proj.weight"],
        sd["attn_pool.proj.bias"])
    out[m + "LayerNorm_0/scale"] = sd["attn_pool.norm.weight"]
    out[m + "LayerNorm_0/bias"] = sd["attn_pool.norm.bias"]
    for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
        out[f"{m}MlpBlock_0/{theirs}/kernel"] = sd[f"attn_pool.mlp.{ours}.weight"].T
        out[f"{m}MlpBlock_0/{theirs}/bias"] = sd[f"attn_pool.mlp.{ours}.bias"]
    return out


def test_big_vision_map_head_npz_under_params_img(tmp_path):
    # big_vision trains with tanh GELU: the reference runs timm's forward with gelu_tanh.
    args = dict(class_token=False, global_pool="map", act_layer="gelu_tanh")
    sd = random_state(timm_shapes(class_token=False, global_pool="map"), seed=3)
    arrays = big_vision_from_timm(sd)
    arrays["params/txt/Embed_0/embedding"] = np.zeros((7, D), np.float32)  # a SigLIP text tower
    np.savez(tmp_path / "siglip.npz", **arrays)
    loaded = load_checkpoint(tmp_path / "siglip.npz")
    cfg = loaded.config
    assert loaded.family == "big_vision" and cfg.classifier == "map" and not cfg.class_token
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.act_layer) == (D, DEPTH, HEADS,
                                                                            MLP, "gelu_tanh")
    images = np.random.RandomState(4).randn(2, SIZE, SIZE, 3).astype(np.float32)
    ref = timm_forward(sd, args, images)
    assert np.ptp(ref, axis=-1).min() > 0.01
    np.testing.assert_allclose(logits(loaded, images), ref, atol=2e-4, rtol=1e-4)
    # The same head through our timm writer keeps timm's names for it.
    save_checkpoint(loaded, tmp_path / "timm", "timm")
    written = load_file(str(tmp_path / "timm" / "model.safetensors"))
    for name in (n for n in sd if n.startswith("attn_pool.")):
        np.testing.assert_allclose(written[name], sd[name], rtol=1e-6, err_msg=name)


# -- against timm itself (the `compare` extra installs it; tests/timm_reference.py imports it) --
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_against_timm_itself(tmp_path, variant):
    """timm builds our config.json's `model_args`, loads our safetensors strictly, and computes
    our logits; its state dict has exactly the names and shapes stated above."""
    timm = import_timm()  # first: without timm, no torch import either
    if timm is None:
        pytest.skip("timm is not installed (pip install -e '.[compare]')")
    import torch
    from timm.models.vision_transformer import VisionTransformer

    args, _ = VARIANTS[variant]
    shape_args = {k: v for k, v in args.items()
                  if k in ("class_token", "reg_tokens", "qkv_bias", "qk_norm", "init_values",
                           "global_pool")}
    base = dict(img_size=SIZE, patch_size=PATCH, embed_dim=D, depth=DEPTH, num_heads=HEADS,
                mlp_ratio=MLP / D, num_classes=CLASSES)
    ref_model = VisionTransformer(**base, **args).eval()
    assert {k: tuple(v.shape) for k, v in ref_model.state_dict().items()} == timm_shapes(
        **shape_args)
    sd = random_state(timm_shapes(**shape_args), seed=5)
    ref_model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    images = np.random.RandomState(6).randn(2, SIZE, SIZE, 3).astype(np.float32)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    np.testing.assert_allclose(timm_forward(sd, args, images), ref, atol=1e-4, rtol=1e-4)

    write_timm_folder(tmp_path / "src", sd, args)
    loaded = load_checkpoint(tmp_path / "src")
    np.testing.assert_allclose(logits(loaded, images), ref, atol=2e-4, rtol=1e-4)
    save_checkpoint(loaded, tmp_path / "out", "timm")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architecture"] in timm.list_models()
    # timm's own hub loader: the named architecture, the model_args, the weights, strictly.
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    with torch.no_grad():
        again = theirs(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    np.testing.assert_allclose(again, ref, atol=1e-5, rtol=1e-5)
