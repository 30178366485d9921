"""Every checkpoint format in and out: vit_jax / big_vision npz, Hugging Face and timm
safetensors, and our own orbax checkpoints (training writes them through here).

`load_checkpoint(path)` reads any of them, infers the architecture from the file itself, and
returns a `LoadedCheckpoint` (config, params as our pure dict, preprocessing, labels);
`save_checkpoint(src, dst, format)` writes one. Readers hold the parameters as numpy float32
arrays, so a round trip is bit-identical where the target format can represent the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from vit.errors import CheckpointError
from vit.models.config import ViTConfig
from vit.preprocess import Preprocessing

WRITE_FORMATS = ("npz", "hf", "timm", "orbax")

__all__ = ["WRITE_FORMATS", "LoadedCheckpoint", "load_checkpoint", "save_checkpoint",
           "save_orbax"]


@dataclasses.dataclass
class LoadedCheckpoint:
    """A checkpoint read into our terms.

    `family` names the convention it came from ("vit_jax", "big_vision", "hf", "timm", "vit"),
    which decides how its position embeddings are resized.
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
        import jax
        from flax import nnx

        from vit.models.vit import VisionTransformer

        if rngs is not None:
            model = VisionTransformer(self.config, rngs=rngs)
            load_params(model, self.params, where=self.source)
            return model
        check_fits(self.params, self.config, self.source)
        abstract = nnx.eval_shape(lambda: VisionTransformer(self.config, rngs=nnx.Rngs(0)))
        graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
        if jax.tree.leaves(rest):  # non-parameter state would need a real init
            return self.build_model(nnx.Rngs(0))
        nnx.replace_by_pure_dict(params, _as_jax(self.params))
        return nnx.merge(graphdef, params, rest)

    @classmethod
    def from_model(cls, model, preprocessing: Preprocessing | None = None,
                   labels: list[str] | None = None, source: str = "model") -> LoadedCheckpoint:
        from flax import nnx

        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        params = nest({k: np.asarray(v) for k, v in flatten(params).items()})
        pre = preprocessing or Preprocessing(size=model.config.image_size)
        return cls(model.config, params, pre, labels, source)


# -- parameter trees --------------------------------------------------------------------------
def flatten(tree: dict, prefix: tuple = ()) -> dict[tuple, Any]:
    """Nested dict -> {path tuple: leaf}; digit-string keys (as orbax restores them) become ints."""
    out = {}
    for key, value in tree.items():
        key = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(value, dict):
            out.update(flatten(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def torch_writers(out: dict, prefix: str = ""):
    """`put_linear(name, dense)` and `put_norm(name, norm)` writing PyTorch-layout tensors
    (`weight` transposed to `[out, in]`) into `out`, for the timm and Hugging Face writers."""

    def put_linear(name: str, dense: dict) -> None:
        out[f"{prefix}{name}.weight"] = np.asarray(dense["kernel"]).T
        if "bias" in dense:
            out[f"{prefix}{name}.bias"] = dense["bias"]

    def put_norm(name: str, norm: dict) -> None:
        out[f"{prefix}{name}.weight"], out[f"{prefix}{name}.bias"] = norm["scale"], norm["bias"]

    return put_linear, put_norm


def nest(flat: dict[tuple, Any]) -> dict:
    """{path tuple: leaf} -> nested dict (the inverse of `flatten`)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def path_name(path: tuple) -> str:
    return "/".join(str(p) for p in path)


def expected_shapes(config: ViTConfig) -> dict[tuple, tuple[int, ...]]:
    """The parameter paths and shapes a model of this config has (no weights are made)."""
    from flax import nnx

    from vit.models.vit import VisionTransformer

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
    from flax import nnx

    check_fits(params, model.config, where)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, _as_jax(params))
    nnx.update(model, state)


def _as_jax(params: dict) -> dict:
    import jax.numpy as jnp

    return nest({k: jnp.asarray(v, jnp.float32) for k, v in flatten(params).items()})




def zero_head_warning(params: dict) -> str | None:
    head = params.get("head")
    if head and not np.any(head["kernel"]) and not np.any(head["bias"]):
        return ("the classification head is all zeros (the original imagenet21k files ship it so "
                "on purpose): its predictions are meaningless; fine-tune it first "
                "(vit train --init CHECKPOINT)")
    return None


# -- the public entry points ------------------------------------------------------------------
def load_checkpoint(path, *, image_size: int | tuple[int, int] | None = None,
                    **model_overrides: Any) -> LoadedCheckpoint:
    """Reads any supported checkpoint (file, folder, training workdir or cached hub id).

    `image_size` resizes the position embeddings as the source's library would (the patch size
    stays). Other keywords override config fields that do not change weight shapes (such as
    `attention_impl`, `dtype`, `dropout`); a different `num_classes` drops the head for
    fine-tuning (a fresh zero head is built).
    """
    from vit.checkpoints import resolve
    from vit.models import posemb

    loaded = resolve.read(path)
    cfg = loaded.config
    num_classes = model_overrides.get("num_classes")
    if num_classes is not None and num_classes != cfg.num_classes:
        if "head" in loaded.params:
            loaded.params = {k: v for k, v in loaded.params.items() if k != "head"}
            loaded.warnings.append(f"head of {cfg.num_classes} classes dropped; a new zero head "
                                   f"of {num_classes} classes is built")
            loaded.warnings = [w for w in loaded.warnings if "head is all zeros" not in w]
        loaded.labels = None
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        grid = (size[0] // cfg.patch_size[0], size[1] // cfg.patch_size[1])
        cfg = cfg.replace(image_size=size)  # checks divisibility by the patch size
        if "pos_embed" in loaded.params:
            method = posemb.METHOD_OF_SOURCE[loaded.family]
            loaded.params["pos_embed"] = posemb.resize_posemb(
                loaded.params["pos_embed"], loaded.config.grid, grid, int(cfg.class_token), method)
        loaded.preprocessing = loaded.preprocessing.with_size(size)
    loaded.config = cfg = cfg.replace(**model_overrides)
    if "head" not in loaded.params and cfg.num_classes:
        # A dropped head is rebuilt zero-initialised, as the model itself would.
        width = cfg.representation_size or cfg.width
        loaded.params["head"] = {"kernel": np.zeros((width, cfg.num_classes), np.float32),
                                 "bias": np.zeros((cfg.num_classes,), np.float32)}
    check_fits(loaded.params, cfg, loaded.source)
    return loaded


def save_checkpoint(src, dst, format: str, *, preprocessing: Preprocessing | None = None,
                    labels: list[str] | None = None) -> list[str]:
    """Writes `src` (a `LoadedCheckpoint` or a model) to `dst` in `format`; returns warnings.

    Raises CheckpointError, naming what does not fit, when the format cannot hold the model.
    """
    if not isinstance(src, LoadedCheckpoint):
        src = LoadedCheckpoint.from_model(src, preprocessing, labels)
    if format == "npz":
        from vit.checkpoints import npz
        return npz.write(src, dst)
    if format == "hf":
        from vit.checkpoints import hf
        return hf.write(src, dst)
    if format == "timm":
        from vit.checkpoints import timm
        return timm.write(src, dst)
    if format == "orbax":
        from vit.checkpoints import orbax_io
        orbax_io.save_orbax(dst, src.params, src.config, src.preprocessing, src.labels)
        return []
    raise CheckpointError(f"unknown format {format!r}; choose one of {', '.join(WRITE_FORMATS)}")


def save_orbax(path, model_or_params, config=None, preprocessing=None, labels=None):
    """Exports params (or a model) with its config, preprocessing and labels as orbax."""
    from vit.checkpoints import orbax_io

    return orbax_io.save_orbax(path, model_or_params, config, preprocessing, labels)
