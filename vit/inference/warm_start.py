"""A checkpoint opened for `vit predict`, warm or cold.

Warm: a prepared classifier (`vit.inference.prepared`) is stored for this checkpoint and these
options, so neither the checkpoint nor the model is read. Cold: the checkpoint is loaded, and
`Opened.store` keeps its classifier for the next run. Without a cache root (`--no-cache`, or
prompts and zero-shot names, which are never prepared) every open is cold and nothing is stored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vit.inference import prepared
from vit.inference.predictor import Predictor
from vit.preprocess import Preprocessing


@dataclasses.dataclass
class Opened:
    """What the command prints and checks, whichever way the checkpoint was opened."""

    source: str  # the checkpoint as the loader names it
    warnings: list[str]  # the loader's notices
    labels: list[str] | None  # the checkpoint's class names
    num_classes: int
    dtype: str
    entry: Path | None = None  # the prepared entry it was read from (warm)
    loaded: object = None  # the `LoadedCheckpoint` (cold); a text model's config is in it
    _warm: prepared.Prepared | None = dataclasses.field(default=None, repr=False)
    _cache: dict | None = dataclasses.field(default=None, repr=False)

    @property
    def caching(self) -> bool:
        """Whether prepared entries are read and written for this run."""
        return self._cache is not None

    def predictor(self, labels: list[str] | None, *, top_k: int, batch_size: int,
                  prompts=None, zero_shot=None) -> Predictor:
        """The `Predictor`: the prepared forward (warm), else the model built from the
        checkpoint (cold)."""
        if self._warm is not None:
            preprocess = Preprocessing.from_dict(self._warm.meta["preprocessing"])
            return Predictor.prepared(self._warm.leaves, self._warm.exported, preprocess, labels)
        return Predictor(self.loaded.build_model(), self.loaded.preprocessing, labels,
                         top_k=top_k, batch_size=batch_size, prompts=prompts,
                         zero_shot=zero_shot)

    def store(self, predictor: Predictor) -> None:
        """After a cold run whose forward could be exported: stores the prepared classifier."""
        if self._cache is None or self._warm is not None or predictor.exported is None:
            return
        from vit.checkpoints.resolve import detect

        checkpoint, loaded = self._cache["checkpoint"], self.loaded
        # A hub id or timm name is stored under the snapshot folder it resolved to.
        resolved = None if Path(checkpoint).exists() else detect(checkpoint)[1]
        prepared.store(**self._cache, leaves=predictor.leaves, exported=predictor.exported,
                       resolved=resolved,
                       meta={"source": loaded.source, "warnings": loaded.warnings,
                             "labels": loaded.labels, "dtype": self.dtype,
                             "num_classes": loaded.config.num_classes,
                             "preprocessing": loaded.preprocessing.to_dict()})


def open_checkpoint(checkpoint, *, image_size: int | None, overrides: dict, batch_size: int,
                    top_k: int, cache_root: Path | None) -> Opened:
    """The prepared entry for these options when `cache_root` holds one, else the checkpoint.
    `batch_size` and `top_k` are part of a prepared forward's key."""
    cache = None if cache_root is None else dict(
        root=cache_root, checkpoint=checkpoint, batch_size=batch_size, top_k=top_k,
        load_options={"image_size": image_size, **overrides})
    warm = prepared.load(**cache) if cache else None
    if warm is not None:
        meta = warm.meta
        return Opened(meta["source"], meta["warnings"], meta["labels"], meta["num_classes"],
                      meta["dtype"], entry=warm.folder, _warm=warm, _cache=cache)
    from vit.checkpoints import load_checkpoint

    loaded = load_checkpoint(checkpoint, image_size=image_size, **overrides)
    return Opened(loaded.source, loaded.warnings, loaded.labels, loaded.config.num_classes,
                  loaded.config.dtype, loaded=loaded, _cache=cache)
