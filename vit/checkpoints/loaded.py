"""`LoadedCheckpoint`, what every reader returns, and small helpers readers and writers share."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from vit.checkpoints.fit import abstract_model, check_fits, fit_text, load_params
from vit.checkpoints.tree import as_jax, flatten, nest
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.vit import VisionTransformer
from vit.preprocess import RESCALE, Preprocessing


@dataclasses.dataclass
class LoadedCheckpoint:
    """A checkpoint read into our terms.

    `family` names the convention it came from ("vit_jax", "big_vision", "hf", "timm", "vit");
    the readers set `config.posemb_resize` to that convention's position-embedding resize.
    """

    config: ViTConfig
    params: dict[str, Any]
    preprocessing: Preprocessing
    labels: list[str] | None = None
    source: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)
    family: str = "vit"

    def build_model(self, rngs=None):
        """A `VisionTransformer` with these weights.

        Without `rngs` no random initialisation runs at all (it would be thrown away): the
        model is traced abstractly and the weights are put in its place. Text-conditioning
        weights that the config and the params disagree on are first fitted (`adapt_text`).
        """
        if rngs is not None:
            model = VisionTransformer(self.config, rngs=rngs)
            # The model's own init supplies missing text weights: no second init.
            self.adapt_text(fresh=nnx.to_pure_dict(nnx.state(model, nnx.Param)))
            load_params(model, self.params, where=self.source)
            return model
        self.adapt_text()
        check_fits(self.params, self.config, self.source)
        graphdef, shapes, rest = abstract_model(self.config)
        if jax.tree.leaves(rest):  # non-parameter state would need a real init
            return self.build_model(nnx.Rngs(0))
        params = jax.tree.map(lambda leaf: leaf, shapes)  # a copy: the cached one stays abstract
        nnx.replace_by_pure_dict(params, as_jax(self.params))
        return nnx.merge(graphdef, params, rest)

    def adapt_text(self, fresh: dict | None = None) -> None:
        """Fits the params to the config's text conditioning (see `fit_text`); what was
        initialised or dropped is added to `warnings`."""
        self.params, notes = fit_text(self.params, self.config, fresh=fresh)
        self.warnings.extend(notes)

    @classmethod
    def from_model(cls, model, preprocessing: Preprocessing | None = None,
                   labels: list[str] | None = None, source: str = "model") -> LoadedCheckpoint:
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
        pre = preprocessing or Preprocessing(size=model.config.image_size)
        return cls(model.config, params, pre, labels, source)


def refuse_text(config: ViTConfig, what: str) -> None:
    """The one-line refusal of a writer whose format has no place for text conditioning."""
    if config.text is not None:
        raise CheckpointError(f"{what} cannot hold text conditioning (text_path, xattn, "
                              "prompt_head): use --format orbax, the format that keeps a "
                              "text-conditioned model (weights and text config)")


def describe(pre: Preprocessing) -> str:
    """`bicubic resize to 224x224, crop 0.9, mean (0.5, ...), std (...)`, for refusals."""
    crop = f", crop_pct {pre.crop_pct:g}" if pre.crop_pct is not None else ", no crop"
    if pre.crop_pct is not None and pre.crop_mode != "center":
        crop += f" ({pre.crop_mode})"
    elif pre.shortest_edge is not None or pre.resize_to is not None:
        crop = f", {pre.describe_geometry()}"
    mean = ", ".join(f"{m:.4g}" for m in pre.mean)
    std = ", ".join(f"{s:.4g}" for s in pre.std)
    scale = "" if pre.rescale_factor == RESCALE else f", rescale {pre.rescale_factor:g}"
    return (f"({pre.resample} resize to {pre.size[0]}x{pre.size[1]}{crop}, mean ({mean}), "
            f"std ({std}){scale})")


def zero_head_warning(params: dict) -> str | None:
    """The warning for an all-zero classification head (imagenet21k files), else None."""
    head = params.get("head")
    if head and not np.any(head["kernel"]) and not np.any(head["bias"]):
        return ("the classification head is all zeros (the original imagenet21k files ship it so "
                "on purpose): its predictions are meaningless; fine-tune it first "
                "(vit train --init CHECKPOINT)")
    return None
