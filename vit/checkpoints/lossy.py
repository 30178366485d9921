"""Conversions a user can force (`vit convert --lossy`): the properties a format cannot hold but
can approximate, each changed to the nearest thing the format says, with a line naming the
change. What has no approximation (a register token, a 'gap' head in a Hugging Face folder,
...) is still refused by the writer.

Every change here moves the outputs (a little for an epsilon or a GELU form, more for a
different crop); the writers' default refusal names `--lossy` when it would help.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vit.checkpoints.loaded import LoadedCheckpoint, describe
from vit.preprocess import INCEPTION


def _plain_resize(loaded: LoadedCheckpoint, why: str) -> tuple[LoadedCheckpoint, str] | None:
    pre = loaded.preprocessing
    if pre.crop_pct is None:
        return None
    new = dataclasses.replace(pre, crop_pct=None)
    size = f"{pre.size[0]}x{pre.size[1]}"
    return (dataclasses.replace(loaded, preprocessing=new),
            f"preprocessing crop_pct {pre.crop_pct:g} becomes a plain resize to {size} ({why})")


def _eps(loaded: LoadedCheckpoint, eps: float, who: str) -> tuple[LoadedCheckpoint, str] | None:
    cfg = loaded.config
    if cfg.layer_norm_eps == eps:
        return None
    return (dataclasses.replace(loaded, config=cfg.replace(layer_norm_eps=eps)),
            f"LayerNorm eps {cfg.layer_norm_eps:g} becomes {eps:g} ({who})")


def _tanh_gelu(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, str] | None:
    cfg = loaded.config
    if cfg.gelu == "tanh":
        return None
    return (dataclasses.replace(loaded, config=cfg.replace(gelu="tanh")),
            f"{cfg.gelu} GELU becomes the tanh approximation (npz files imply it)")


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


Fix = Callable[[LoadedCheckpoint], "tuple[LoadedCheckpoint, str] | None"]
FIXES: dict[str, list[Fix]] = {
    "hf": [lambda c: _plain_resize(c, "ViTImageProcessor resizes without a crop")],
    "timm": [lambda c: _eps(c, 1e-6, "timm's ViT uses 1e-6")],
    "npz": [_tanh_gelu, lambda c: _eps(c, 1e-6, "npz files imply 1e-6"), _inception,
            _no_labels],
}


def fit_to_format(loaded: LoadedCheckpoint, fmt: str) -> tuple[LoadedCheckpoint, list[str]]:
    """(`loaded` changed to what `fmt` can hold, a line per change); the input is not touched.
    Properties with no approximation stay for the writer to refuse."""
    changes = []
    for fix in FIXES.get(fmt, []):
        done = fix(loaded)
        if done is not None:
            loaded, change = done
            changes.append(change)
    return loaded, changes


def lossy_hint(loaded: LoadedCheckpoint, fmt: str,
               cannot_hold: Callable[[LoadedCheckpoint], list[str]]) -> str:
    """The end of a writer's refusal: how `--lossy` would help, when it would."""
    fitted, changes = fit_to_format(loaded, fmt)
    if not changes:
        return ""
    left = cannot_hold(fitted)
    if left:
        return (f" (--lossy would approximate some of these, but not {'; '.join(left)})")
    return f"; or pass --lossy to convert anyway: {'; '.join(changes)}"
