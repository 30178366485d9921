"""`LoadedCheckpoint`, what every reader returns, and the checks that weights fit a config."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from vit.checkpoints.tree import as_jax, flatten, nest, path_name
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.vit import VisionTransformer
from vit.preprocess import Preprocessing


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
        model is traced abstractly and the weights are put in its place.
        """
        if rngs is not None:
            model = VisionTransformer(self.config, rngs=rngs)
            load_params(model, self.params, where=self.source)
            return model
        check_fits(self.params, self.config, self.source)
        abstract = nnx.eval_shape(lambda: VisionTransformer(self.config, rngs=nnx.Rngs(0)))
        graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
        if jax.tree.leaves(rest):  # non-parameter state would need a real init
            return self.build_model(nnx.Rngs(0))
        nnx.replace_by_pure_dict(params, as_jax(self.params))
        return nnx.merge(graphdef, params, rest)

    @classmethod
    def from_model(cls, model, preprocessing: Preprocessing | None = None,
                   labels: list[str] | None = None, source: str = "model") -> LoadedCheckpoint:
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
        pre = preprocessing or Preprocessing(size=model.config.image_size)
        return cls(model.config, params, pre, labels, source)


def expected_shapes(config: ViTConfig) -> dict[tuple, tuple[int, ...]]:
    """The parameter paths and shapes a model of this config has (no weights are made)."""
    abstract = nnx.eval_shape(lambda: VisionTransformer(config, rngs=nnx.Rngs(0)))
    pure = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    return {path: tuple(leaf.shape) for path, leaf in flatten(pure).items()}


def check_fits(params: dict, config: ViTConfig, where: str) -> None:
    """Raises a one-line CheckpointError when the weights do not fit a model of `config`."""
    want = expected_shapes(config)
    have = {path: tuple(np.shape(v)) for path, v in flatten(params).items()}
    missing = [path_name(p) for p in want if p not in have]
    extra = [path_name(p) for p in have if p not in want]
    wrong = [f"{path_name(p)} {have[p]} vs {s}" for p, s in want.items()
             if p in have and have[p] != s]
    problems = []
    if missing:
        problems.append(f"missing {_some(missing)}")
    if extra:
        problems.append(f"unexpected {_some(extra)}")
    if wrong:
        problems.append(f"shape (checkpoint vs model) {_some(wrong)}")
    if problems:
        raise CheckpointError(f"{where}: weights do not fit the model: {'; '.join(problems)}")


def _some(items: list[str], n: int = 4) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def load_params(model, params: dict, where: str = "checkpoint") -> None:
    """Puts a pure-dict parameter tree into `model` (checked against its shapes first)."""
    check_fits(params, model.config, where)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, as_jax(params))
    nnx.update(model, state)


def zero_head_warning(params: dict) -> str | None:
    """The warning for an all-zero classification head (imagenet21k files), else None."""
    head = params.get("head")
    if head and not np.any(head["kernel"]) and not np.any(head["bias"]):
        return ("the classification head is all zeros (the original imagenet21k files ship it so "
                "on purpose): its predictions are meaningless; fine-tune it first "
                "(vit train --init CHECKPOINT)")
    return None
