"""Google's `.npz` checkpoints: vit_jax (google-research/vision_transformer) and big_vision.

Both are flat `np.savez` archives of a Flax tree, keys joined by "/". They differ in module
numbering (vit_jax's published files, named before linen: `LayerNorm_0,
MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3`; big_vision, and vit_jax's linen model
saved as `np.savez(path, **flatten_dict(params, sep="/"))`: `LayerNorm_0,
MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0`), in the
position embedding (vit_jax: `Transformer/posembed_input/pos_embedding` with the class row;
big_vision: top-level `pos_embedding`, patches only, the class token gets none), in the prefix
(`opt/target/`; `params/` or `params/img/`) and big_vision may stack the blocks on a leading axis
(`Transformer/encoderblock/...`, from `nn.scan`). Both were trained with Flax's default tanh GELU
and LayerNorm epsilon 1e-6, and feed inputs scaled to [-1, 1].
"""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from vit.checkpoints.files import staged
from vit.checkpoints.labels import default_labels
from vit.checkpoints.loaded import (
    LoadedCheckpoint,
    describe,
    refuse_text,
    zero_head_warning,
)
from vit.checkpoints.lossy import lossy_hint
from vit.checkpoints.named_arrays import NamedArrays
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.posemb import METHOD_OF_SOURCE
from vit.preprocess import INCEPTION

PREFIXES = ("opt/target/", "params/img/", "params/", "")
NAMES = {  # layout -> (attention, first norm, second norm, mlp) module names inside a block
    "vit_jax": ("MultiHeadDotProductAttention_1", "LayerNorm_0", "LayerNorm_2", "MlpBlock_3"),
    "big_vision": ("MultiHeadDotProductAttention_0", "LayerNorm_0", "LayerNorm_1", "MlpBlock_0"),
}
VIT_JAX_POSEMB = "Transformer/posembed_input/pos_embedding"


# What np.load, or reading a member, raises for a file that is not a whole .npz archive: empty
# (EOFError), cut short or not a zip (BadZipFile, ValueError), a damaged compressed member
# (zlib.error), a pickled array (ValueError with allow_pickle=False), unreadable (OSError).
_NOT_NPZ = (zipfile.BadZipFile, EOFError, zlib.error, OSError, ValueError)


class NotNpzError(Exception):
    """The file is not a readable .npz archive of arrays; the message says why."""


def load_npz(path) -> dict[str, np.ndarray]:
    """Every array in an .npz archive, read now (never unpickled). A missing file raises
    FileNotFoundError; any other way of not being such an archive, NotNpzError."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise NotNpzError("a single .npy array, not an .npz archive")
        with loaded:
            return {k: loaded[k] for k in loaded.files}
    except FileNotFoundError:
        raise
    except _NOT_NPZ as err:
        reason = str(err) or type(err).__name__
        if "pickled" in reason:  # numpy's text suggests allow_pickle=True: never, here
            reason = "not a zip archive; numpy would have to unpickle it, which vit never does"
        raise NotNpzError(reason) from None


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_npz(path)
    except (NotNpzError, FileNotFoundError) as err:
        raise CheckpointError(f"{path}: not a readable .npz archive ({err}); it is empty, cut "
                              "short or not an .npz file: download or copy it again") from None


def _find_prefix(arrays: dict[str, np.ndarray], where: str) -> str:
    for prefix in PREFIXES:
        if prefix + "embedding/kernel" in arrays:
            return prefix
    found = ", ".join(sorted(arrays)[:5])
    raise CheckpointError(f"{where}: unknown npz layout: expected 'embedding/kernel' (vit_jax) or "
                          f"'params/embedding/kernel' (big_vision) and found none; keys start "
                          f"with: {found}")


# What tells the namings apart, by what the file holds: the position embedding's place (vit_jax:
# `Transformer/posembed_input/pos_embedding`, class row included; big_vision: top-level
# `pos_embedding`, patch rows only, or none for sin-cos) and the module names inside a block
# (Flax before linen numbered modules across types: `LayerNorm_0, MultiHeadDotProductAttention_1,
# LayerNorm_2, MlpBlock_3`, as the published vit_jax and AugReg files have; linen numbers each
# type on its own: `LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0`, as
# vit_jax's models_vit.py saved today and big_vision have).
LAYOUTS = {  # layout -> (block names, family)
    "vit_jax": ("vit_jax", "vit_jax"),
    "vit_jax linen": ("big_vision", "vit_jax"),
    "big_vision": ("big_vision", "big_vision"),
}


def _layout(keys: NamedArrays, where: str) -> str:
    """The layout's name (a key of LAYOUTS), from the position embedding and the block names."""
    block = ("Transformer/encoderblock/" if any(
        k.startswith(keys.prefixes[0] + "Transformer/encoderblock/") for k in keys.arrays)
        else "Transformer/encoderblock_0/")
    names = [n for n, (attn, *_) in NAMES.items() if keys.has(f"{block}{attn}/query/kernel")]
    if len(names) != 1:
        found = sorted({k[len(keys.prefixes[0] + block):].split("/")[0] for k in keys.arrays
                        if k.startswith(keys.prefixes[0] + block)})
        raise CheckpointError(
            f"{where}: unknown npz layout: {keys.prefixes[0]}{block} holds "
            f"{', '.join(found[:6]) or 'nothing'}; expected the vit_jax names "
            f"({', '.join(NAMES['vit_jax'])}) or the linen ones ({', '.join(NAMES['big_vision'])})")
    if keys.has(VIT_JAX_POSEMB):
        if keys.has("pos_embedding"):
            raise CheckpointError(f"{where}: holds both {VIT_JAX_POSEMB} (vit_jax) and "
                                  "pos_embedding (big_vision); a file has one")
        return "vit_jax" if names[0] == "vit_jax" else "vit_jax linen"
    if names[0] == "vit_jax":  # vit_jax's files always learn a position embedding
        keys(VIT_JAX_POSEMB)  # named as missing
        return "vit_jax"
    return "big_vision"


# Arrays of the file outside the ViT's parameter tree that a classifier does not use, and why:
# they are skipped, and the reader says so once.
NOT_A_CLASSIFIER = (
    ("opt/", "optimiser state (momenta, step counts): training's, not the model's"),
    ("params/txt/", "the text tower of a two-tower (SigLIP, LiT) model"),
    ("params/t", "the contrastive loss's temperature"),
    ("params/b", "the contrastive loss's bias"),
)


def _skipped_why(keys: NamedArrays):
    """Why a key outside the ViT's own tree (`keys.prefixes[0]`) is not read, or None."""
    def why(key: str) -> str | None:
        return next((why for prefix, why in NOT_A_CLASSIFIER
                     if key.startswith(prefix) and not key.startswith(keys.prefixes[0])
                     and (prefix.endswith("/") or key == prefix)), None)
    return why


def _depth(keys: NamedArrays) -> tuple[int, bool]:
    """(number of blocks, whether they are stacked on a leading axis)."""
    stacked = keys.prefixes[0] + "Transformer/encoderblock/"
    if any(k.startswith(stacked) for k in keys.arrays):
        return keys("Transformer/encoderblock/LayerNorm_0/scale").shape[0], True
    depth = 0
    while keys.has(f"Transformer/encoderblock_{depth}/LayerNorm_0/scale"):
        depth += 1
    return depth, False


def _attention(get, root: str, d: int, bias: bool = True) -> dict[str, np.ndarray]:
    """Linen MultiHeadDotProductAttention ((D, heads, head_dim) kernels) -> (D, D) matrices."""
    out = {"out": get(f"{root}/out/kernel").reshape(-1, d), "outb": get(f"{root}/out/bias")}
    for name in ("query", "key", "value"):
        out[name[0]] = get(f"{root}/{name}/kernel").reshape(d, -1)
        if bias:
            out[name[0] + "b"] = get(f"{root}/{name}/bias").reshape(-1)
    return out


def _dense(get, root: str) -> dict[str, np.ndarray]:
    return {"kernel": get(f"{root}/kernel"), "bias": get(f"{root}/bias")}


def _norm(get, root: str) -> dict[str, np.ndarray]:
    return {"scale": get(f"{root}/scale"), "bias": get(f"{root}/bias")}


def read(path: Path) -> LoadedCheckpoint:
    path = Path(path)
    arrays = read_arrays(path)
    keys = NamedArrays(arrays, (_find_prefix(arrays, str(path)),), dtype=np.float32)
    layout = _layout(keys, str(path))
    names, family = LAYOUTS[layout]
    patch_kernel = keys("embedding/kernel")
    ph, pw, channels, d = patch_kernel.shape
    params = {"patch_kernel": patch_kernel, "patch_bias": keys("embedding/bias")}
    class_token = keys.has("cls")
    if class_token:
        params["cls_token"] = keys("cls")
    params["blocks"], block_fields = _blocks(keys, names, d)
    params["norm"] = _norm(keys, "Transformer/encoder_norm")
    keys.check(str(path), f"{layout} npz")
    if not params["blocks"]:
        raise CheckpointError(f"{path}: no encoder blocks found (expected "
                              f"'{keys.prefixes[0]}Transformer/encoderblock_0/...')")
    posemb, grid, warnings = _posemb(keys, params, family, class_token, (ph, pw), path)
    classifier, representation, num_classes = _head_layers(keys, params, class_token, d)
    keys.check(str(path), f"{layout} npz")
    warnings += keys.account_for(str(path), _skipped_why(keys))
    if classifier == "map" and (params["map_head"]["mlp"]["fc1"]["kernel"].shape[1]
                                != block_fields["mlp_dim"]):
        raise CheckpointError(f"{path}: MAPHead MLP width differs from the blocks' "
                              "(not supported)")
    config = ViTConfig(
        width=d, patch_size=(ph, pw), image_size=(grid[0] * ph, grid[1] * pw),
        in_channels=channels, num_classes=num_classes, class_token=class_token,
        classifier=classifier, representation_size=representation, posemb=posemb,
        layer_norm_eps=1e-6, act_layer="gelu_tanh", posemb_resize=METHOD_OF_SOURCE[family],
        **block_fields)
    warning = zero_head_warning(params)
    return LoadedCheckpoint(
        config=config, params=params, preprocessing=INCEPTION.with_size(config.image_size),
        labels=default_labels(num_classes), source=f"{path} ({layout} npz)",
        warnings=warnings + ([warning] if warning else []), family=family)


def _blocks(keys: NamedArrays, names: str, d: int) -> tuple[dict, dict]:
    """(the encoder blocks in our names, the ViTConfig fields they decide), with the module
    names of NAMES[names]. Blocks stop at the first without attention; its expected key is
    recorded as missing."""
    attn_name, norm1, norm2, mlp_name = NAMES[names]
    depth, stacked = _depth(keys)
    blocks, heads, mlp_dim, qkv_bias = {}, None, None, True
    for i in range(depth):
        root = "Transformer/encoderblock" + ("" if stacked else f"_{i}")

        def get(key, root=root, i=i):
            value = keys(f"{root}/{key}")
            return value[i] if stacked and value.size else value

        if not keys.has(f"{root}/{attn_name}/query/kernel"):
            keys(f"{root}/{attn_name}/query/kernel")  # records the expected key
            break
        heads = heads or keys(f"{root}/{attn_name}/query/kernel").shape[-2]
        qkv_bias = keys.has(f"{root}/{attn_name}/query/bias")
        a = _attention(get, attn_name, d, qkv_bias)
        mlp = {"fc1": _dense(get, f"{mlp_name}/Dense_0"), "fc2": _dense(get, f"{mlp_name}/Dense_1")}
        mlp_dim = mlp["fc1"]["kernel"].shape[-1]
        attn = {"qkv": {"kernel": np.concatenate([a["q"], a["k"], a["v"]], axis=1)},
                "proj": {"kernel": a["out"], "bias": a["outb"]}}
        if qkv_bias:
            attn["qkv"]["bias"] = np.concatenate([a["qb"], a["kb"], a["vb"]])
        blocks[i] = {"norm1": _norm(get, norm1), "attn": attn, "norm2": _norm(get, norm2),
                     "mlp": mlp}
    return blocks, {"depth": depth, "num_heads": heads, "mlp_dim": mlp_dim,
                    "qkv_bias": qkv_bias}


def _posemb(keys: NamedArrays, params: dict, family: str, class_token: bool,
            patch: tuple[int, int], path: Path) -> tuple[str, tuple[int, int], list[str]]:
    """(posemb kind, patch grid, warnings); a learned position embedding joins `params`, with
    a zero class row where big_vision gives the class token no position."""
    layout = family
    posemb_key = VIT_JAX_POSEMB if layout == "vit_jax" else "pos_embedding"
    if not keys.has(posemb_key):
        return "sincos2d", (224 // patch[0], 224 // patch[1]), [
            "no position embedding in the file (sin-cos): image size 224 assumed; pass "
            "image_size to change it"]
    pe = keys(posemb_key)
    n_class_rows = int(class_token) if layout == "vit_jax" else 0
    grid = _square_grid(pe.shape[1] - n_class_rows, str(path))
    if class_token and not n_class_rows:
        pe = np.concatenate([np.zeros((1, 1, pe.shape[-1]), np.float32), pe], axis=1)
    params["pos_embed"] = pe
    return "learn", grid, []


def _head_layers(keys: NamedArrays, params: dict, class_token: bool,
                 d: int) -> tuple[str, int | None, int]:
    """(classifier, representation size, number of classes); the MAP head, pre-logits layer
    and classification head the file has join `params`."""
    classifier = "token" if class_token else "gap"
    if keys.has("MAPHead_0/probe"):
        classifier = "map"
        params["map_head"] = _map_head(keys, d)
    representation = None
    if keys.has("pre_logits/kernel"):
        params["pre_logits"] = _dense(keys, "pre_logits")
        representation = params["pre_logits"]["kernel"].shape[1]
    num_classes = 0
    if keys.has("head/kernel"):
        params["head"] = _dense(keys, "head")
        num_classes = params["head"]["kernel"].shape[1]
    return classifier, representation, num_classes


def _map_head(keys: NamedArrays, d: int) -> dict:
    a = _attention(keys, "MAPHead_0/MultiHeadDotProductAttention_0", d)
    return {
        "probe": keys("MAPHead_0/probe"),
        "q": {"kernel": a["q"], "bias": a["qb"]},
        "kv": {"kernel": np.concatenate([a["k"], a["v"]], axis=1),
               "bias": np.concatenate([a["kb"], a["vb"]])},
        "proj": {"kernel": a["out"], "bias": a["outb"]},
        "norm": _norm(keys, "MAPHead_0/LayerNorm_0"),
        "mlp": {"fc1": _dense(keys, "MAPHead_0/MlpBlock_0/Dense_0"),
                "fc2": _dense(keys, "MAPHead_0/MlpBlock_0/Dense_1")},
    }


def _square_grid(n: int, where: str) -> tuple[int, int]:
    side = math.isqrt(n)
    if side * side != n:
        raise CheckpointError(f"{where}: position embedding has {n} patch rows, not a square "
                              "grid; cannot infer the image size")
    return side, side


# -- writing (vit_jax layout) -----------------------------------------------------------------
def cannot_hold(loaded: LoadedCheckpoint) -> list[str]:
    """The properties of `loaded` that a vit_jax-layout npz cannot say: each would read back
    differently (the reader infers the head from the keys and implies tanh GELU, LayerNorm eps
    1e-6, inputs scaled to [-1, 1] at the model's size, and no class names but ImageNet's)."""
    cfg, problems = loaded.config, []
    if cfg.classifier in ("map", "token_gap"):
        problems.append(f"a '{cfg.classifier}' head")
    problems += [f"{option} (npz files hold the standard ViT)" for option in cfg.options_set()]
    if cfg.classifier == "gap" and cfg.class_token:
        problems.append("a 'gap' head with a class token (it would read back as 'token')")
    if cfg.num_registers:
        problems.append(f"{cfg.num_registers} register tokens")
    if cfg.layer_scale is not None:
        problems.append("layer scale")
    if cfg.qk_norm:
        problems.append("qk-norm")
    if cfg.act_layer != "gelu_tanh":
        problems.append(f"{cfg.act_layer} activation (npz files imply gelu_tanh)")
    if cfg.layer_norm_eps != 1e-6:
        problems.append(f"LayerNorm eps {cfg.layer_norm_eps:g} (npz files imply 1e-6)")
    sincos_size = (224 // cfg.patch_size[0] * cfg.patch_size[0],
                   224 // cfg.patch_size[1] * cfg.patch_size[1])
    if cfg.posemb == "sincos2d" and cfg.image_size != sincos_size:
        problems.append(f"sin-cos position embeddings at image size {cfg.image_size} (an npz "
                        f"without a position embedding reads back at {sincos_size})")
    if cfg.posemb == "learn" and cfg.grid[0] != cfg.grid[1]:
        problems.append(f"a non-square patch grid {cfg.grid}")
    implied = INCEPTION.with_size(cfg.image_size)
    if loaded.preprocessing != implied:
        problems.append(f"preprocessing {describe(loaded.preprocessing)} (npz files imply "
                        f"{describe(implied)})")
    if loaded.labels is not None and list(loaded.labels) != (default_labels(cfg.num_classes)
                                                             or []):
        problems.append("class names (an npz holds none; only 1000-class heads read back with "
                        "the ImageNet names)")
    return problems


def write(loaded: LoadedCheckpoint, dst) -> list[str]:
    """Writes the vit_jax layout (`Transformer/encoderblock_{i}/...`, class row included)."""
    cfg, p = loaded.config, loaded.params
    refuse_text(cfg, "a vit_jax npz")
    problems = cannot_hold(loaded)
    if problems:
        raise CheckpointError(f"a vit_jax npz cannot hold {'; '.join(problems)}: use --format "
                              "timm or orbax (orbax keeps everything)"
                              + lossy_hint(loaded, "npz", cannot_hold))
    d, h, hd = cfg.width, cfg.num_heads, cfg.head_dim
    out = {"embedding/kernel": p["patch_kernel"], "embedding/bias": p["patch_bias"]}
    if cfg.class_token:
        out["cls"] = p["cls_token"]
    if "pos_embed" in p:
        out[VIT_JAX_POSEMB] = p["pos_embed"]
    for i in range(cfg.depth):
        b, root = p["blocks"][i], f"Transformer/encoderblock_{i}"
        attn = f"{root}/{NAMES['vit_jax'][0]}"
        kernels = np.split(np.asarray(b["attn"]["qkv"]["kernel"]), 3, axis=1)
        for name, kernel in zip(("query", "key", "value"), kernels, strict=True):
            out[f"{attn}/{name}/kernel"] = kernel.reshape(d, h, hd)
        if cfg.qkv_bias:
            biases = np.split(np.asarray(b["attn"]["qkv"]["bias"]), 3)
            for name, bias in zip(("query", "key", "value"), biases, strict=True):
                out[f"{attn}/{name}/bias"] = bias.reshape(h, hd)
        out[f"{attn}/out/kernel"] = np.asarray(b["attn"]["proj"]["kernel"]).reshape(h, hd, d)
        out[f"{attn}/out/bias"] = b["attn"]["proj"]["bias"]
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            out[f"{root}/{theirs}/scale"] = b[ours]["scale"]
            out[f"{root}/{theirs}/bias"] = b[ours]["bias"]
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{root}/MlpBlock_3/{theirs}/kernel"] = b["mlp"][ours]["kernel"]
            out[f"{root}/MlpBlock_3/{theirs}/bias"] = b["mlp"][ours]["bias"]
    out["Transformer/encoder_norm/scale"] = p["norm"]["scale"]
    out["Transformer/encoder_norm/bias"] = p["norm"]["bias"]
    for name in ("pre_logits", "head"):
        if name in p:
            out[f"{name}/kernel"], out[f"{name}/bias"] = p[name]["kernel"], p[name]["bias"]
    with staged(dst) as tmp, open(tmp, "wb") as f:  # a file object: numpy adds no ".npz"
        np.savez(f, **{k: np.asarray(v, np.float32) for k, v in out.items()})
    return []
