"""Fitting a checkpoint's parameters to a model config: the one place that does it.

`load_checkpoint(path, image_size=..., **overrides)` (and through it `vit train --init`) calls
`adapt_params`; `LoadedCheckpoint.build_model` and `load_params` use its parts. Fitting means:
- a head for another number of classes is replaced by a zero-initialised one (vit_jax and
  big_vision do the same: fine-tuning starts from uniform predictions); a model without a head
  drops it;
- a `pre_logits` layer the new model does not have is dropped (vit_jax drops i21k's);
- position embeddings are resized, in the source library's convention, when the grid differs;
- a plain checkpoint into a text-conditioned model gets fresh text weights (text_path, xattn,
  prompt_head, similarity), a text checkpoint into a plain model loses them;
- anything else that does not fit is one CheckpointError naming the parameters (`check_fits`).
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
from flax import nnx

from vit.checkpoints.tree import as_jax, flatten, nest, path_name
from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.models.posemb import resize_posemb
from vit.models.vit import VisionTransformer

# Top-level parameter subtrees that only a text-conditioned model has (vit/models/vit.py); every
# other parameter is a plain ViT's, so a plain checkpoint is a text model minus these.
TEXT_SUBTREES = ("text_path", "xattn", "prompt_head", "similarity")
# What a fresh text init means, after "the checkpoint has none" ({outputs}: prompt, similarity).
TEXT_HINT = ("; {outputs} logits mean nothing until the model is trained on text "
             "(vit train --init CHECKPOINT); class logits are the checkpoint's")


def adapt_params(src_params: dict, src_config: ViTConfig, dst_config: ViTConfig, *,
                 dst_template: dict | None = None, seed: int = 0, notes: list[str] | None = None,
                 where: str = "checkpoint") -> dict:
    """`src_params` (pure dict of a model of `src_config`) fitted to `dst_config`.

    New text-conditioning weights come from `dst_template` (a fresh parameter tree of
    `dst_config`) when it holds arrays; without one, or with shape placeholders only, they are
    initialised as a model of `dst_config` built with `nnx.Rngs(seed)` would be. What was
    initialised or dropped is appended to `notes`, or issued as a Python warning without it.
    Raises CheckpointError (naming `where`) when the result does not fit `dst_config`.
    """
    params, said = dict(src_params), []
    if "pre_logits" in params and not dst_config.representation_size:
        del params["pre_logits"]
    _fit_head(params, src_config, dst_config, said)
    if "pos_embed" in params and src_config.grid != dst_config.grid:
        params["pos_embed"] = resize_posemb(np.asarray(params["pos_embed"]), src_config.grid,
                                            dst_config.grid, src_config.num_posemb_prefix,
                                            src_config.posemb_resize)  # the source's convention
    fresh = dst_template if dst_template is not None and _has_values(dst_template) else None
    params, text_notes = fit_text(params, dst_config, fresh=fresh, seed=seed)
    for note in said + text_notes:
        if notes is not None:
            notes.append(note)
        else:
            warnings.warn(note, stacklevel=2)
    check_fits(params, dst_config, where)
    return params


def _fit_head(params: dict, src: ViTConfig, dst: ViTConfig, notes: list[str]) -> None:
    """Keeps a head that fits `dst`; otherwise drops it and builds a zero one for `dst`'s
    classes (if it has any), zero-initialised as the model itself would be. DeiT's second head
    (`head_dist`) is fitted the same way."""
    width = dst.representation_size or (2 * dst.width if dst.classifier == "token_gap"
                                         else dst.width)
    _fit_one_head(params, "head", width, src, dst, notes)
    if "head_dist" in params or (dst.dist_token and dst.dist_head):
        wanted = dst.dist_token and dst.dist_head and dst.num_classes
        if not wanted:
            params.pop("head_dist", None)
        else:
            _fit_one_head(params, "head_dist", dst.width, src, dst, notes)


def _fit_one_head(params: dict, name: str, width: int, src: ViTConfig, dst: ViTConfig,
                  notes: list[str]) -> None:
    head = params.get(name)
    if head is not None and np.shape(head.get("kernel")) == (width, dst.num_classes):
        return
    what = "head" if name == "head" else "distillation head"
    if params.pop(name, None) is not None:
        notes.append(f"{what} of {src.num_classes} classes dropped" + (
            f"; a new zero {what} of {dst.num_classes} classes is built" if dst.num_classes
            else ": this model has no head"))
    elif dst.num_classes:
        notes.append(f"a zero {what} of {dst.num_classes} classes is built: the checkpoint "
                     "has none")
    if dst.num_classes:
        params[name] = {"kernel": np.zeros((width, dst.num_classes), np.float32),
                        "bias": np.zeros((dst.num_classes,), np.float32)}


def _has_values(template: dict) -> bool:
    """Whether the template's text subtrees are arrays rather than shape placeholders."""
    leaves = jax.tree.leaves({k: v for k, v in template.items() if k in TEXT_SUBTREES})
    return all(isinstance(leaf, np.ndarray | jax.Array) for leaf in leaves)


@functools.lru_cache(maxsize=8)
def abstract_model(config: ViTConfig):
    """(graphdef, parameter shapes, other state) of a model of `config`, traced once per config:
    an abstract trace of ViT-B takes seconds (flax's variable checks are slow under a trace),
    and loading a checkpoint needs it three times (fit check, build, text fit)."""
    abstract = nnx.eval_shape(lambda: VisionTransformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param, ...)


def expected_shapes(config: ViTConfig) -> dict[tuple, tuple[int, ...]]:
    """The parameter paths and shapes a model of this config has (no weights are made)."""
    pure = nnx.to_pure_dict(abstract_model(config)[1])
    return {path: tuple(leaf.shape) for path, leaf in flatten(pure).items()}


def check_fits(params: dict, config: ViTConfig, where: str) -> None:
    """Raises a one-line CheckpointError when the weights do not fit a model of `config`."""
    want = expected_shapes(config)
    have = {path: tuple(np.shape(v)) for path, v in flatten(params).items()}
    missing = [path_name(p) for p in want if p not in have]
    extra = [path_name(p) for p in have if p not in want]
    wrong = [f"{path_name(p)} has shape {have[p]}, the model needs {s}" for p, s in want.items()
             if p in have and have[p] != s]
    problems = []
    if missing:
        problems.append(f"missing {_some(missing)}")
    if extra:
        problems.append(f"unexpected {_some(extra)}")
    if wrong:
        problems.append(_some(wrong))
    if problems:
        raise CheckpointError(f"{where}: weights do not fit the model: {'; '.join(problems)}; "
                              "leave the model fields that set weight shapes (width, depth, "
                              "patch_size, ...) as the checkpoint has them")


def _some(items: list[str], n: int = 4) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def fresh_text_params(config: ViTConfig, names, seed: int = 0) -> dict:
    """Subtrees `names` of a freshly initialised `VisionTransformer(config, rngs=Rngs(seed))`,
    as numpy float32: exactly what a new model of this config starts from."""
    pure = nnx.to_pure_dict(nnx.state(VisionTransformer(config, rngs=nnx.Rngs(seed)), nnx.Param))
    return nest({k: np.asarray(v, np.float32) for k, v in flatten(pure).items() if k[0] in names})


def fit_text(params: dict, config: ViTConfig, *, fresh: dict | None = None,
             seed: int = 0) -> tuple[dict, list[str]]:
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
                     f"checkpoint has none" + TEXT_HINT.format(outputs=outputs))
    return params, notes


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
