"""`LoadedCheckpoint`, what every reader returns, and the checks that weights fit a config."""

from __future__ import annotations

import dataclasses
import functools
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
        graphdef, shapes, rest = _abstract_model(self.config)
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


@functools.lru_cache(maxsize=8)
def _abstract_model(config: ViTConfig):
    """(graphdef, parameter shapes, other state) of a model of `config`, traced once per config:
    an abstract trace of ViT-B takes seconds (flax's variable checks are slow under a trace),
    and loading a checkpoint needs it three times (fit check, build, text fit)."""
    abstract = nnx.eval_shape(lambda: VisionTransformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param, ...)


def expected_shapes(config: ViTConfig) -> dict[tuple, tuple[int, ...]]:
    """The parameter paths and shapes a model of this config has (no weights are made)."""
    pure = nnx.to_pure_dict(_abstract_model(config)[1])
    return {path: tuple(leaf.shape) for path, leaf in flatten(pure).items()}


# Top-level parameter subtrees that only a text-conditioned model has (vit/models/vit.py); every
# other parameter is a plain ViT's, so a plain checkpoint is a text model minus these.
TEXT_SUBTREES = ("text_path", "xattn", "prompt_head", "similarity")
# What a fresh text init means, after "the checkpoint has none" ({outputs}: prompt, similarity).
LOAD_HINT = ("; {outputs} logits mean nothing until the model is trained on text "
             "(vit train --init CHECKPOINT); class logits are the checkpoint's")


def fresh_text_params(config: ViTConfig, names, seed: int = 0) -> dict:
    """Subtrees `names` of a freshly initialised `VisionTransformer(config, rngs=Rngs(seed))`,
    as numpy float32: exactly what a new model of this config starts from."""
    pure = nnx.to_pure_dict(nnx.state(VisionTransformer(config, rngs=nnx.Rngs(seed)), nnx.Param))
    return nest({k: np.asarray(v, np.float32) for k, v in flatten(pure).items() if k[0] in names})


def fit_text(params: dict, config: ViTConfig, *, fresh: dict | None = None, seed: int = 0,
             hint: str = LOAD_HINT) -> tuple[dict, list[str]]:
    """(params, notes): `params` with their text-conditioning subtrees made to match `config`.

    Subtrees the model lacks are dropped (a text checkpoint into a plain model); subtrees it
    needs and the params lack are taken from `fresh` (a fresh parameter tree of `config`) or,
    without it, from a model built with `nnx.Rngs(seed)` (a plain checkpoint into a text
    model). Every other parameter is passed through untouched; one note per kind of change.
    """
    if config.text is None and not any(k in params for k in TEXT_SUBTREES):
        return params, []  # the plain-to-plain load: nothing to trace
    want = set(fresh) if fresh is not None else {path[0] for path in expected_shapes(config)}
    dropped = [k for k in TEXT_SUBTREES if k in params and k not in want]
    added = [k for k in TEXT_SUBTREES if k in want and k not in params]
    notes = []
    if dropped:
        params = {k: v for k, v in params.items() if k not in dropped}
        why = ("this model has no text path" if config.text is None else
               "this model has no similarity head (text.similarity_dim is 0)")
        notes.append(f"text-conditioning weights dropped ({', '.join(dropped)}): {why}")
    if added:
        if fresh is None:
            new = fresh_text_params(config, added, seed)
        else:
            new = nest({k: np.asarray(v, np.float32) for k, v in flatten(fresh).items()
                        if k[0] in added})
        params = {**params, **new}
        outputs = ("similarity" if added == ["similarity"] else
                   "prompt and similarity" if "similarity" in added else "prompt")
        notes.append(f"text-conditioning weights initialised fresh ({', '.join(added)}): the "
                     f"checkpoint has none" + hint.format(outputs=outputs))
    return params, notes


def refuse_text(config: ViTConfig, what: str) -> None:
    """The one-line refusal of a writer whose format has no place for text conditioning."""
    if config.text is not None:
        raise CheckpointError(f"{what} cannot hold text conditioning (text_path, xattn, "
                              "prompt_head): use --format orbax, the format that keeps a "
                              "text-conditioned model (weights and text config)")


def describe(pre: Preprocessing) -> str:
    """`bicubic resize to 224x224, crop 0.9, mean (0.5, ...), std (...)`, for refusals."""
    crop = f", crop_pct {pre.crop_pct:g}" if pre.crop_pct is not None else ", no crop"
    mean = ", ".join(f"{m:.4g}" for m in pre.mean)
    std = ", ".join(f"{s:.4g}" for s in pre.std)
    return (f"({pre.resample} resize to {pre.size[0]}x{pre.size[1]}{crop}, mean ({mean}), "
            f"std ({std}))")


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


def load_params(model, params: dict, where: str = "checkpoint") -> list[str]:
    """Puts a pure-dict parameter tree into `model` (checked against its shapes first).

    Text-conditioning weights are fitted as `fit_text` does: text weights the params lack keep
    the model's own values; ones the model lacks are dropped. Returns those notes."""
    state = nnx.state(model, nnx.Param)
    params, notes = fit_text(params, model.config, fresh=nnx.to_pure_dict(state))
    check_fits(params, model.config, where)
    nnx.replace_by_pure_dict(state, as_jax(params))
    nnx.update(model, state)
    return notes


def zero_head_warning(params: dict) -> str | None:
    """The warning for an all-zero classification head (imagenet21k files), else None."""
    head = params.get("head")
    if head and not np.any(head["kernel"]) and not np.any(head["bias"]):
        return ("the classification head is all zeros (the original imagenet21k files ship it so "
                "on purpose): its predictions are meaningless; fine-tune it first "
                "(vit train --init CHECKPOINT)")
    return None
