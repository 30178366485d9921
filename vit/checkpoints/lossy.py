"""Conversions a user can force (`vit convert --lossy`): the properties a format cannot hold but
can approximate, each changed to the nearest thing the format says, with a line naming the
change. What has no approximation (a register token, a 'gap' head in a Hugging Face folder,
...) is still refused by the writer.

Most changes move the outputs (a little for an epsilon or a GELU form, more for a different
crop); storing a sin-cos table or folding layer scale keeps them at the model's size. The
writers' default refusal names `--lossy` when it would help.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from vit.checkpoints.loaded import LoadedCheckpoint, describe
from vit.preprocess import INCEPTION


def _plain_resize(loaded: LoadedCheckpoint, why: str) -> tuple[LoadedCheckpoint, str] | None:
    pre = loaded.preprocessing
    new = dataclasses.replace(pre, crop_pct=None, shortest_edge=None, resize_to=None)
    if new == pre:
        return None
    return (dataclasses.replace(loaded, preprocessing=new),
            f"preprocessing '{pre.describe_geometry()}' becomes '{new.describe_geometry()}' "
            f"({why})")


def _eps(loaded: LoadedCheckpoint, eps: float, who: str) -> tuple[LoadedCheckpoint, str] | None:
    cfg = loaded.config
    if cfg.layer_norm_eps == eps:
        return None
    return (dataclasses.replace(loaded, config=cfg.replace(layer_norm_eps=eps)),
            f"LayerNorm eps {cfg.layer_norm_eps:g} becomes {eps:g} ({who})")


def _tanh_gelu(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    cfg = loaded.config
    if cfg.act_layer != "gelu":  # quick_gelu or SiLU are other functions, not approximations
        return None
    return (dataclasses.replace(loaded, config=cfg.replace(act_layer="gelu_tanh")),
            "exact GELU becomes its tanh approximation (npz files imply it)")


def _inception(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    implied = INCEPTION.with_size(loaded.config.image_size)
    if loaded.preprocessing == implied:
        return None
    return (dataclasses.replace(loaded, preprocessing=implied),
            f"preprocessing {describe(loaded.preprocessing)} becomes {describe(implied)} (npz "
            "files imply it)")


def _no_labels(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    from vit.checkpoints.labels import default_labels

    if loaded.labels is None or list(loaded.labels) == (
            default_labels(loaded.config.num_classes) or []):
        return None
    return (dataclasses.replace(loaded, labels=None),
            f"the {len(loaded.labels)} class names are dropped (an npz holds none)")


def _learned_sincos(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    """Fixed sin-cos position embeddings stored as learned ones: the same function at the
    model's size; at another size they are interpolated instead of recomputed."""
    from vit.models.posemb import sincos_2d

    cfg = loaded.config
    if cfg.posemb != "sincos2d":
        return None
    pe = np.asarray(sincos_2d(cfg.grid, cfg.width), np.float32)
    if cfg.class_token:
        pe = np.concatenate([np.zeros((1, 1, cfg.width), np.float32), pe], 1)
    params = {**loaded.params, "pos_embed": pe}
    return (dataclasses.replace(loaded, config=cfg.replace(posemb="learn"), params=params),
            "sin-cos position embeddings are stored as learned ones (the same at "
            f"{cfg.image_size[0]}x{cfg.image_size[1]}; interpolated, not recomputed, at other "
            "sizes)")


def _fold_layer_scale(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    """Layer scale multiplied into the layer before it (attention output, second MLP layer):
    the same function up to float32 rounding."""
    cfg = loaded.config
    if cfg.layer_scale is None:
        return None
    blocks = {}
    for i, old in loaded.params["blocks"].items():
        block = {k: v for k, v in old.items() if k not in ("ls1", "ls2")}
        for ls, part, name in (("ls1", "attn", "proj"), ("ls2", "mlp", "fc2")):
            gamma = np.asarray(old[ls]["gamma"], np.float32)
            layer = block[part][name]
            scaled = {"kernel": np.asarray(layer["kernel"], np.float32) * gamma[None, :]}
            if "bias" in layer:
                scaled["bias"] = np.asarray(layer["bias"], np.float32) * gamma
            block[part] = {**block[part], name: scaled}
        blocks[i] = block
    params = {**loaded.params, "blocks": blocks}
    return (dataclasses.replace(loaded, config=cfg.replace(layer_scale=None), params=params),
            "layer scale is folded into the attention output and second MLP layer of each "
            "block (the same function up to float32 rounding)")


Fix = Callable[[LoadedCheckpoint], "tuple[LoadedCheckpoint, str] | None"]
FIXES: dict[str, list[Fix]] = {
    "hf": [lambda c: _plain_resize(c, "ViTImageProcessor resizes without a crop"),
           _learned_sincos, _fold_layer_scale],
    "timm": [lambda c: (None if c.config.layer_norm_eps in (1e-6, 1e-5) else
                        _eps(c, 1e-6, "timm's ViT architectures use 1e-6 or 1e-5")),
             _learned_sincos],
    "npz": [_tanh_gelu, lambda c: _eps(c, 1e-6, "npz files imply 1e-6"), _inception,
            _no_labels, _fold_layer_scale],
}


def fit_to_format(loaded: LoadedCheckpoint, fmt: str,
                  cannot_hold: Callable[[LoadedCheckpoint], list[str]]
                  ) -> tuple[LoadedCheckpoint, list[str]]:
    """(`loaded` changed to what `fmt` can hold, a line per change); the input is not touched.
    A fix is made only where the writer's `cannot_hold` names something it changes (a format
    with several model types, such as Hugging Face's, may hold a crop or layer scale in one of
    them). Properties with no approximation stay for the writer to refuse."""
    changes = []
    for fix in FIXES.get(fmt, []):
        problems = cannot_hold(loaded)
        if not problems:
            break
        done = fix(loaded)
        if done is not None and cannot_hold(done[0]) != problems:
            loaded, change = done
            changes.append(change)
    return loaded, changes


def lossy_hint(loaded: LoadedCheckpoint, fmt: str,
               cannot_hold: Callable[[LoadedCheckpoint], list[str]]) -> str:
    """The end of a writer's refusal: how `--lossy` would help, when it would."""
    fitted, changes = fit_to_format(loaded, fmt, cannot_hold)
    if not changes:
        return ""
    left = cannot_hold(fitted)
    if left:
        return (f" (--lossy would approximate some of these, but not {'; '.join(left)})")
    return f"; or pass --lossy to convert anyway: {'; '.join(changes)}"
