"""Training checkpoints: orbax `CheckpointManager` in `WORKDIR/checkpoints/<step>/`.

The layout is `vit.checkpoints.layout`'s, so `vit predict`, `vit eval` and `--init` read a step
folder like any other orbax checkpoint. Saves are asynchronous; orbax writes each step into a
temporary folder and renames it when complete, so a crash (even SIGKILL) mid-save leaves the
earlier checkpoints intact and the half-written one invisible. Kept: the last `keep` steps plus
the best by validation accuracy; the latest is always among them, so a resume never loses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from vit.checkpoints import layout

METRIC = "val_accuracy"


class TrainCheckpoints:
    def __init__(self, workdir: str | Path, keep: int = 2, async_save: bool = True):
        self.directory = Path(workdir).absolute() / layout.CHECKPOINTS_DIR
        keep_policy = policies.AnyPreservationPolicy([
            policies.LatestN(n=max(keep, 1)),
            policies.BestN(get_metric_fn=lambda m: m[METRIC], n=1,
                           keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            best_fn=lambda m: m[METRIC], best_mode="max", preservation_policy=keep_policy,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, *, params, opt_state, ema_params, data_iter: dict,
             train_state: dict, meta: dict, val_accuracy: float | None = None) -> None:
        """Starts an asynchronous save; `wait()` (or the next save) finishes it."""
        items = {
            layout.PARAMS: ocp.args.StandardSave(params),
            layout.META: ocp.args.JsonSave(meta),
            layout.OPT_STATE: ocp.args.StandardSave(opt_state),
            layout.DATA_ITER: ocp.args.JsonSave(data_iter),
            layout.TRAIN_STATE: ocp.args.JsonSave(train_state),
        }
        if ema_params is not None:
            items[layout.EMA_PARAMS] = ocp.args.StandardSave(ema_params)
        metrics = None if val_accuracy is None else {METRIC: float(val_accuracy)}
        self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)

    def restore(self, step: int, *, params, opt_state, ema_params) -> dict:
        """Restores `step` into the structure (and shardings) of the abstract trees given."""
        items = {
            layout.PARAMS: ocp.args.StandardRestore(params),
            layout.OPT_STATE: ocp.args.StandardRestore(opt_state),
            layout.DATA_ITER: ocp.args.JsonRestore(),
            layout.TRAIN_STATE: ocp.args.JsonRestore(),
            layout.META: ocp.args.JsonRestore(),
        }
        if ema_params is not None:
            items[layout.EMA_PARAMS] = ocp.args.StandardRestore(ema_params)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return {name: restored[name] for name in items}

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def write_best(self, step: int, val_accuracy: float) -> None:
        """`checkpoints/best.json`, replaced atomically."""
        path = self.directory / layout.BEST_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"step": int(step), METRIC: float(val_accuracy)}))
        os.replace(tmp, path)

    def read_best(self) -> dict | None:
        path = self.directory / layout.BEST_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
