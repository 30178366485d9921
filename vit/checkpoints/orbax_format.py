"""The on-disk layout of our own orbax checkpoints, shared by training (writer) and loaders.

A training workdir holds `checkpoints/<step>/`, each an orbax composite checkpoint with items:

- `params`: the model's `nnx.Param` state as a pure dict (`nnx.to_pure_dict`), float32;
- `meta`: JSON, see `make_meta`: the model config, preprocessing, labels, step;
- training-only items: `opt_state`, `ema_params`, `data_iter`, `train_state` (step, rng).

`checkpoints/best.json` names the best step by validation accuracy when the run keeps one.
An exported checkpoint (`vit convert --format orbax`) is a single composite directory with
`params` and `meta`, no step folders.
"""

from __future__ import annotations

from typing import Any

FORMAT = "vit-orbax-1"
PARAMS, META = "params", "meta"
OPT_STATE, EMA_PARAMS = "opt_state", "ema_params"
DATA_ITER, TRAIN_STATE = "data_iter", "train_state"
CHECKPOINTS_DIR = "checkpoints"
BEST_FILE = "best.json"


def make_meta(model_config: dict[str, Any], preprocessing: dict[str, Any],
              labels: list[str] | None, step: int | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `meta` item: everything needed to rebuild the model and feed it correctly."""
    meta = {"format": FORMAT, "model_config": model_config, "preprocessing": preprocessing,
            "labels": labels, "step": step}
    meta.update(extra or {})
    return meta
