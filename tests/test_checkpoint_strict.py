"""Every reader uses every array of a file or refuses it, naming the rest; and each npz naming
reads to a ViT forward written here from the paper (Dosovitskiy et al. 2021, eqs. 1-4: patch
embedding, class token, learned position embedding, pre-norm blocks of multi-head attention and
an MLP with GELU, final norm, head), in numpy, from the file's own arrays: not our modules.

The namings: vit_jax's published files (named before Flax linen: `MultiHeadDotProductAttention_1`,
`LayerNorm_2`, `MlpBlock_3`), vit_jax's linen model saved with `flatten_dict(params, sep="/")`
(`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`, position embedding at
`Transformer/posembed_input/pos_embedding`), big_vision (top-level `pos_embedding` without a
class row; blocks one by one or stacked on a leading axis), under the `opt/target/` and `params/`
prefixes.
"""

import numpy as np
import pytest

from vit.checkpoints import load_checkpoint
from vit.errors import CheckpointError

D, HEADS, MLP, DEPTH, PATCH, SIZE, CLASSES = 32, 4, 64, 2, 8, 32, 5
GRID = SIZE // PATCH
PRE_LINEN = ("MultiHeadDotProductAttention_1", "LayerNorm_0", "LayerNorm_2", "MlpBlock_3")
LINEN = ("MultiHeadDotProductAttention_0", "LayerNorm_0", "LayerNorm_1", "MlpBlock_0")


def random_params(seed=0):
    """A ViT's parameters as Flax holds them (per-head attention kernels), by our own names
    for the parts: {part: array}."""
    rng = np.random.RandomState(seed)
    r = lambda *shape, s=0.2: (s * rng.randn(*shape)).astype(np.float32)  # noqa: E731
    hd = D // HEADS
    p = {"embedding/kernel": r(PATCH, PATCH, 3, D), "embedding/bias": r(D), "cls": r(1, 1, D),
         "pos": r(1, GRID * GRID + 1, D), "norm/scale": 1 + r(D), "norm/bias": r(D),
         "head/kernel": r(D, CLASSES, s=0.5), "head/bias": r(CLASSES)}
    for i in range(DEPTH):
        for name in ("query", "key", "value"):
            p[f"{i}/{name}/kernel"], p[f"{i}/{name}/bias"] = r(D, HEADS, hd), r(HEADS, hd)
        p[f"{i}/out/kernel"], p[f"{i}/out/bias"] = r(HEADS, hd, D), r(D)
        for n in ("ln1", "ln2"):
            p[f"{i}/{n}/scale"], p[f"{i}/{n}/bias"] = 1 + r(D), r(D)
        p[f"{i}/fc1/kernel"], p[f"{i}/fc1/bias"] = r(D, MLP), r(MLP)
        p[f"{i}/fc2/kernel"], p[f"{i}/fc2/bias"] = r(MLP, D), r(D)
    return p


def paper_forward(p, images, class_row=True):
    """Class probabilities of a ViT (the paper's eqs. 1-4, tanh GELU and LayerNorm eps 1e-6 as
    Flax has them), float64. `class_row=False`: big_vision's class token gets no position."""
    p = {k: v.astype(np.float64) for k, v in p.items()}

    def ln(x, s, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * s + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    b = images.shape[0]
    x = images.astype(np.float64).reshape(b, GRID, PATCH, GRID, PATCH, 3)
    x = np.einsum("bhpwqc,pqcd->bhwd", x, p["embedding/kernel"]).reshape(b, -1, D)
    x = x + p["embedding/bias"]
    pos = p["pos"]
    if class_row:
        x = np.concatenate([np.broadcast_to(p["cls"], (b, 1, D)), x], 1) + pos
    else:
        x = np.concatenate([np.broadcast_to(p["cls"], (b, 1, D)), x + pos[:, 1:]], 1)
    for i in range(DEPTH):
        h = ln(x, p[f"{i}/ln1/scale"], p[f"{i}/ln1/bias"])
        q, k, v = (np.einsum("bnd,dhk->bhnk", h, p[f"{i}/{n}/kernel"])
                   + p[f"{i}/{n}/bias"][None, :, None] for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // HEADS)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("bhnk,hkd->bnd", a @ v, p[f"{i}/out/kernel"]) + p[f"{i}/out/bias"]
        h = ln(x, p[f"{i}/ln2/scale"], p[f"{i}/ln2/bias"])
        h = gelu(h @ p[f"{i}/fc1/kernel"] + p[f"{i}/fc1/bias"])
        x = x + h @ p[f"{i}/fc2/kernel"] + p[f"{i}/fc2/bias"]
    y = ln(x[:, 0], p["norm/scale"], p["norm/bias"]) @ p["head/kernel"] + p["head/bias"]
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def npz_arrays(p, naming, prefix="", stacked=False):
    """The file's arrays, as that naming writes them."""
    big_vision = naming == "big_vision"
    attn, ln1, ln2, mlp = PRE_LINEN if naming == "vit_jax" else LINEN
    out = {"embedding/kernel": p["embedding/kernel"], "embedding/bias": p["embedding/bias"],
           "cls": p["cls"], "Transformer/encoder_norm/scale": p["norm/scale"],
           "Transformer/encoder_norm/bias": p["norm/bias"], "head/kernel": p["head/kernel"],
           "head/bias": p["head/bias"]}
    if big_vision:
        out["pos_embedding"] = p["pos"][:, 1:]
    else:
        out["Transformer/posembed_input/pos_embedding"] = p["pos"]
    blocks = []
    for i in range(DEPTH):
        blk = {f"{attn}/{n}/{w}": p[f"{i}/{n}/{w}"] for n in ("query", "key", "value", "out")
               for w in ("kernel", "bias")}
        for ours, theirs in (("ln1", ln1), ("ln2", ln2)):
            blk.update({f"{theirs}/{w}": p[f"{i}/{ours}/{w}"] for w in ("scale", "bias")})
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            blk.update({f"{mlp}/{theirs}/{w}": p[f"{i}/{ours}/{w}"] for w in ("kernel", "bias")})
        blocks.append(blk)
    if stacked:
        out.update({f"Transformer/encoderblock/{k}": np.stack([b[k] for b in blocks])
                    for k in blocks[0]})
    else:
        out.update({f"Transformer/encoderblock_{i}/{k}": v for i, b in enumerate(blocks)
                    for k, v in b.items()})
    return {prefix + k: v for k, v in out.items()}


def probs(loaded, images):
    import jax

    model = loaded.build_model()
    return np.asarray(jax.nn.softmax(model(images), axis=-1))


NAMINGS = {  # case -> (naming, prefix, stacked, extra arrays the file may carry, family)
    "vit_jax": ("vit_jax", "", False, {}, "vit_jax"),
    "vit_jax_opt_target": ("vit_jax", "opt/target/", False,
                           {"opt/state/step": np.zeros((), np.float32)}, "vit_jax"),
    "vit_jax_linen": ("vit_jax_linen", "", False, {}, "vit_jax"),
    "vit_jax_linen_params": ("vit_jax_linen", "params/", False, {}, "vit_jax"),
    "big_vision": ("big_vision", "params/", False, {}, "big_vision"),
    "big_vision_stacked": ("big_vision", "params/", True, {}, "big_vision"),
    "big_vision_img_siglip": ("big_vision", "params/img/", False,
                              {"params/txt/Embed_0/embedding": np.zeros((7, 4), np.float32),
                               "params/t": np.zeros((1,), np.float32)}, "big_vision"),
}


@pytest.mark.parametrize("case", list(NAMINGS))
def test_each_npz_naming_reads_to_the_papers_forward(tmp_path, case):
    naming, prefix, stacked, extra, family = NAMINGS[case]
    p = random_params(seed=1)
    path = tmp_path / "m.npz"
    np.savez(path, **npz_arrays(p, naming, prefix, stacked), **extra)
    loaded = load_checkpoint(path)
    assert loaded.family == family and loaded.config.posemb == "learn"
    layout = {"vit_jax_linen": "vit_jax linen"}.get(naming, naming)
    assert f"({layout} npz)" in loaded.source
    assert any("not read" in w for w in loaded.warnings) == bool(extra)
    images = np.random.RandomState(2).uniform(-1, 1, (3, SIZE, SIZE, 3)).astype(np.float32)
    ref = paper_forward(p, images, class_row=naming != "big_vision")
    assert np.ptp(ref, axis=-1).min() > 0.05  # the classes differ: a comparison that can fail
    np.testing.assert_allclose(probs(loaded, images), ref, atol=1e-5)


# -- one extra, one missing, one renamed array: each refused, naming it -----------------------
def _npz_file(tmp_path, change):
    arrays = npz_arrays(random_params(), "vit_jax")
    change(arrays)
    np.savez(tmp_path / "m.npz", **arrays)
    return tmp_path / "m.npz"


def _hf_folder(tmp_path, change):
    import json

    from safetensors.numpy import load_file, save_file

    from vit.checkpoints import save_checkpoint
    from vit.models.config import ViTConfig

    src = load_checkpoint(_npz_file(tmp_path, lambda a: None))
    src.config = ViTConfig(**{**src.config.to_dict(), "act_layer": "gelu"})
    save_checkpoint(src, tmp_path / "hf", "hf")
    arrays = load_file(str(tmp_path / "hf" / "model.safetensors"))
    change(arrays)
    save_file(arrays, str(tmp_path / "hf" / "model.safetensors"))
    json.loads((tmp_path / "hf" / "config.json").read_text())
    return tmp_path / "hf"


def _timm_folder(tmp_path, change):
    from safetensors.numpy import load_file, save_file

    from vit.checkpoints import save_checkpoint

    save_checkpoint(load_checkpoint(_npz_file(tmp_path, lambda a: None)), tmp_path / "t", "timm")
    arrays = load_file(str(tmp_path / "t" / "model.safetensors"))
    change(arrays)
    save_file(arrays, str(tmp_path / "t" / "model.safetensors"))
    return tmp_path / "t"


def _orbax_dir(tmp_path, change):
    from vit.checkpoints.orbax_io import save_orbax
    from vit.checkpoints.tree import flatten, nest, path_name

    src = load_checkpoint(_npz_file(tmp_path, lambda a: None))
    flat = {path_name(k): v for k, v in flatten(src.params).items()}
    change(flat)
    params = nest({tuple(int(p) if p.isdigit() else p for p in k.split("/")): v
                   for k, v in flat.items()})
    save_orbax(tmp_path / "o", params, src.config, src.preprocessing)
    return tmp_path / "o"


def _rename(old, new):
    def change(arrays):
        arrays[new] = arrays.pop(old)
    return change


def _drop(key):
    return lambda arrays: arrays.pop(key)


def _add(key):
    def change(arrays):
        arrays[key] = np.zeros((3,), np.float32)
    return change


READERS = {  # reader -> (file maker, an array of its files, the name it might be mistyped as)
    "npz": (_npz_file, "Transformer/encoderblock_1/LayerNorm_2/scale",
            "Transformer/encoderblock_1/LayerNorm_1/scale"),
    "hf": (_hf_folder, "vit.encoder.layer.1.layernorm_after.weight",
           "vit.encoder.layer.1.layernorm_post.weight"),
    "timm": (_timm_folder, "blocks.1.norm2.weight", "blocks.1.norm3.weight"),
    "orbax": (_orbax_dir, "blocks/1/norm2/scale", "blocks/1/norm3/scale"),
}


@pytest.mark.parametrize("change", ["extra", "missing", "renamed"])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_an_array_it_does_not_read_or_lacks(tmp_path, reader, change):
    make, key, other = READERS[reader]
    edit = {"extra": _add("extra/array" if reader != "hf" else "vit.extra.weight"),
            "missing": _drop(key), "renamed": _rename(key, other)}[change]
    named = {"extra": "extra" if reader != "hf" else "vit.extra.weight", "missing": key,
             "renamed": other if change == "renamed" and reader != "hf" else key}[change]
    path = make(tmp_path, edit)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path).build_model()
    message = str(err.value)
    assert "\n" not in message
    if reader == "orbax":
        named = named.replace("extra/array", "extra")
    assert named.split("/")[0] in message if reader == "orbax" else named in message, message


def test_a_vit_jax_file_without_its_position_embedding_is_refused_not_given_sincos(
        tmp_path):
    arrays = npz_arrays(random_params(), "vit_jax")
    del arrays["Transformer/posembed_input/pos_embedding"]
    np.savez(tmp_path / "m.npz", **arrays)
    with pytest.raises(CheckpointError, match="posembed_input/pos_embedding"):
        load_checkpoint(tmp_path / "m.npz")


def test_what_we_write_as_npz_opens_as_vit_jax_loads_it(tmp_path):
    """vit_jax's `checkpoint.load`: the archive's keys split on "/" into a tree, then flax's
    `convert_pre_linen`; the result must be its linen model's tree (the names the linen file
    above has), holding the same arrays."""
    from flax.traverse_util import flatten_dict, unflatten_dict

    try:
        from flax.training.checkpoints import convert_pre_linen
    except ImportError:
        pytest.skip("this flax has no convert_pre_linen")
    from vit.checkpoints import save_checkpoint

    p = random_params(seed=4)
    np.savez(tmp_path / "src.npz", **npz_arrays(p, "vit_jax"))
    save_checkpoint(load_checkpoint(tmp_path / "src.npz"), tmp_path / "ours.npz", "npz")
    with np.load(tmp_path / "ours.npz", allow_pickle=False) as f:
        tree = unflatten_dict({tuple(k.split("/")): f[k] for k in f.files})
    linen = {"/".join(k): v for k, v in flatten_dict(dict(convert_pre_linen(tree))).items()}
    want = npz_arrays(p, "vit_jax_linen")
    assert linen.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(linen[key], value, err_msg=key)


def test_predicts_first_line_names_the_layout_read(tmp_path, capsys):
    from PIL import Image

    from vit.cli import main

    np.savez(tmp_path / "m.npz", **npz_arrays(random_params(), "vit_jax_linen", "params/"))
    Image.new("RGB", (SIZE, SIZE), (30, 120, 200)).save(tmp_path / "a.png")
    assert main(["predict", str(tmp_path / "a.png"), "--checkpoint", str(tmp_path / "m.npz"),
                 "--no-cache"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"vit predict: {tmp_path / 'm.npz'} (vit_jax linen npz)", first


def test_heads_a_timm_file_does_not_state_are_assumed_and_the_warning_says_why(tmp_path):
    import json

    from vit.checkpoints import save_checkpoint

    np.savez(tmp_path / "m.npz", **npz_arrays(random_params(), "vit_jax"))
    save_checkpoint(load_checkpoint(tmp_path / "m.npz"), tmp_path / "t", "timm")
    config_file = tmp_path / "t" / "config.json"
    config_file.write_text(json.dumps({"model_args": {"img_size": SIZE}}))
    said = " ".join(load_checkpoint(tmp_path / "t").warnings)
    assert "config.json names no architecture and no model_args.num_heads" in said, said
    config_file.unlink()
    said = " ".join(load_checkpoint(tmp_path / "t" / "model.safetensors").warnings)
    assert "no config.json beside the weights" in said, said
