"""The entry points: `load_checkpoint` reads any supported format and adapts it to the model
asked for; `save_checkpoint` writes one of `WRITE_FORMATS`."""

from __future__ import annotations

from typing import Any

import vit.checkpoints.hf as hf
import vit.checkpoints.npz as npz
import vit.checkpoints.orbax_io as orbax_io
import vit.checkpoints.resolve as resolve
import vit.checkpoints.timm as timm
from vit.checkpoints.files import check_destination
from vit.checkpoints.fit import adapt_params
from vit.checkpoints.loaded import LoadedCheckpoint, zero_head_warning
from vit.checkpoints.lossy import fit_to_format
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.posemb import METHOD_OF_SOURCE
from vit.preprocess import Preprocessing

WRITE_FORMATS = ("npz", "hf", "timm", "orbax", "onnx")
# How each written format resizes position embeddings when read back: its library's convention.
RESIZE_CONVENTION = {"npz": METHOD_OF_SOURCE["vit_jax"], "hf": METHOD_OF_SOURCE["hf"],
                     "timm": METHOD_OF_SOURCE["timm"]}
# Settings of how a model is run or trained, not of what it computes: only orbax stores them
# (timm also keeps dynamic_image_size); load_checkpoint(path, **settings) sets them again.
RUN_SETTINGS = ("dtype", "attention_impl", "remat", "dropout", "attention_dropout", "drop_path",
                "dynamic_image_size")


def load_checkpoint(path, *, image_size: int | tuple[int, int] | None = None,
                    named: str = "--checkpoint", **model_overrides: Any) -> LoadedCheckpoint:
    """Reads any supported checkpoint (file, folder, training workdir or cached hub id).

    `image_size` resizes the position embeddings as the source's library would (the
    checkpoint's `config.posemb_resize`; the patch size stays). Other keywords override config
    fields that do not change weight shapes (such as `attention_impl`, `dtype`, `dropout`,
    `dynamic_image_size`); a different `num_classes` replaces the head with a zero one for
    fine-tuning, and `representation_size=None` drops a pre-logits layer. `text=TextConfig(...)`
    loads a plain ViT into a text-conditioned model (the text weights are a fresh seeded init;
    the image weights are the file's) and `text=None` loads only the image model of a text
    checkpoint; either way a warning says what changed. The fitting is `fit.adapt_params`,
    which `vit train --init` goes through too. `named` is how the user gave `path` (the flag,
    such as `--init`), for the errors that name it.
    """
    loaded = resolve.read(path, named=named)
    src = cfg = loaded.config
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        cfg = cfg.replace(image_size=size)  # checks divisibility by the patch size
        loaded.preprocessing = loaded.preprocessing.with_size(size)
    cfg = cfg.replace(**model_overrides)
    if cfg.num_classes != src.num_classes:  # the file's class names and head warning go too
        loaded.labels = None
        loaded.warnings = [w for w in loaded.warnings if w != zero_head_warning(loaded.params)]
    loaded.params = adapt_params(loaded.params, src, cfg, notes=loaded.warnings,
                                 where=loaded.source)
    loaded.config = cfg
    return loaded


def save_checkpoint(src, dst, format: str, *, preprocessing: Preprocessing | None = None,
                    labels: list[str] | None = None, lossy: bool = False) -> list[str]:
    """Writes `src` (a `LoadedCheckpoint` or a model) to `dst` in `format`; returns warnings.

    Raises CheckpointError, naming what does not fit, when the format cannot hold the model.
    With `lossy`, what the format cannot hold but can approximate is changed first
    (`lossy.fit_to_format`), and each change is among the returned lines.
    """
    if format not in WRITE_FORMATS:
        raise CheckpointError(f"unknown format {format!r}; choose one of "
                              f"{', '.join(WRITE_FORMATS)}")
    check_destination(dst)
    if not isinstance(src, LoadedCheckpoint):
        src = LoadedCheckpoint.from_model(src, preprocessing, labels)
    changes = []
    if lossy:
        holds = {"npz": npz.cannot_hold, "hf": hf.cannot_hold, "timm": timm.cannot_hold}
        if format in holds:
            src, changes = fit_to_format(src, format, holds[format])
        changes = [f"--lossy: {change}" for change in changes]
    if format == "orbax":
        orbax_io.save_orbax(dst, src.params, src.config, src.preprocessing, src.labels)
        return []
    if format == "onnx":
        import vit.checkpoints.onnx_export as onnx_export  # jax2onnx loads only for this

        return changes + onnx_export.write(src, dst)
    writer = {"npz": npz.write, "hf": hf.write, "timm": timm.write}[format]
    return changes + writer(src, dst) + conversion_notes(src.config, format)


def conversion_notes(cfg, format: str) -> list[str]:
    """What a written file leaves to its reader's conventions (never the computed function)."""
    notes = []
    convention = RESIZE_CONVENTION[format]
    if cfg.posemb_resize != convention:
        notes.append(f"position embeddings of this file resize {convention} when it is loaded "
                     f"at another size (the {format} convention), not {cfg.posemb_resize}")
    kept = ("dynamic_image_size",) if format == "timm" else ()
    default = ViTConfig()
    dropped = [f"{name}={getattr(cfg, name)}" for name in RUN_SETTINGS
               if name not in kept and getattr(cfg, name) != getattr(default, name)]
    if dropped:
        notes.append(f"run settings not stored in a {format} file: {', '.join(dropped)}; pass "
                     "them again when loading it")
    return notes
