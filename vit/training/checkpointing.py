"""Training checkpoints: orbax `CheckpointManager` in `WORKDIR/checkpoints/<step>/`.

The format is `vit.checkpoints.orbax_format`'s, so `vit predict`, `vit eval` and `--init` read a
step folder like any other orbax checkpoint. Saves are asynchronous; orbax writes each step into a
temporary folder and renames it when complete, so a crash (even SIGKILL) mid-save leaves the
finished checkpoints intact and the half-written one invisible. Kept: the last `keep` steps plus
the best by validation accuracy; the latest is always among them, so a resume never loses it.
A step the keep policy drops is first renamed into `checkpoints/dropped.orbax-checkpoint-tmp/`
(one atomic rename) and removed from there after the save: a reader that was reading it finds it
gone, not half-deleted, and takes the next finished step (`vit.checkpoints.orbax_io.read`).

A full disk during a save is an `OutOfSpace` naming the step and the checkpoint's size; the
caller removes the half-written step (`remove_unfinished`). Orbax's threads log each failed
write's traceback meanwhile; `quiet_full_disk_logs` keeps those out, the one line is the report.

`TrainCheckpoints` is the storage; `CheckpointPolicy` decides when to save, keeps
`checkpoints/best.json` pointing at a complete checkpoint, and refuses to let a diverged run
checkpoint non-finite weights.

With several processes every one calls the same saves and restores (orbax writes each
process's shards; process 0 the metadata and `best.json`), so they must agree on the step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import threading
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from vit.checkpoints import orbax_format
from vit.errors import OutOfSpace, VitError, is_out_of_space
from vit.paths import remove_until_settled
from vit.training.workdir import replace_file

METRIC = "val_accuracy"
# Where dropped steps wait for removal; its name carries orbax's temporary suffix, so neither a
# reader nor orbax takes it for a step, and a run killed before emptying it leaves nothing that
# the next run's manager does not clear.
TRASH = "dropped.orbax-checkpoint-tmp"
UNFINISHED = ".orbax-checkpoint-tmp"  # orbax's suffix of a step (or item) still being written


class TrainCheckpoints:
    def __init__(self, workdir: str | Path, keep: int = 2, async_save: bool = True):
        self.directory = Path(workdir).absolute() / orbax_format.CHECKPOINTS_DIR
        keep_policy = policies.AnyPreservationPolicy([
            policies.LatestN(n=max(keep, 1)),
            policies.BestN(get_metric_fn=lambda m: m[METRIC], n=1,
                           keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            best_fn=lambda m: m[METRIC], best_mode="max", preservation_policy=keep_policy,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True,
            todelete_subdir=TRASH)
        self.empty_trash()  # a run killed before emptying it
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.pending: tuple[int, int] | None = None  # (step, bytes) of the save in flight

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, *, params, opt_state, ema_params, data_iter: dict,
             train_state: dict, meta: dict, val_accuracy: float | None = None) -> None:
        """Starts an asynchronous save; `wait()` (or the next save) finishes it. A full disk
        now or then is an `OutOfSpace` naming the step folder and the checkpoint's size."""
        items = {
            orbax_format.PARAMS: ocp.args.StandardSave(params),
            orbax_format.META: ocp.args.JsonSave(meta),
            orbax_format.OPT_STATE: ocp.args.StandardSave(opt_state),
            orbax_format.DATA_ITER: ocp.args.JsonSave(data_iter),
            orbax_format.TRAIN_STATE: ocp.args.JsonSave(train_state),
        }
        if ema_params is not None:
            items[orbax_format.EMA_PARAMS] = ocp.args.StandardSave(ema_params)
        metrics = None if val_accuracy is None else {METRIC: float(val_accuracy)}
        self.pending = (step, sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(
            (params, opt_state, ema_params))))
        with self._out_of_space():
            self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                              force=True)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def damaged_items(self, step: int, items: list[str]) -> list[str]:
        """Those of `items` whose folder in `step` is missing or empty: a step folder damaged
        or partly copied after orbax finished it (it still looks complete to orbax)."""
        folder = self.step_dir(step)
        return [item for item in items
                if not (folder / item).is_dir() or not any((folder / item).iterdir())]

    def read_meta(self, step: int) -> dict:
        """`step`'s meta alone: enough to rebuild the model before restoring its arrays."""
        args = ocp.args.Composite(**{orbax_format.META: ocp.args.JsonRestore()})
        return self.manager.restore(step, args=args)[orbax_format.META]

    def read_train_state(self, step: int) -> dict:
        """`step`'s train state alone (step, seed, early stopping's count); {} if unreadable."""
        args = ocp.args.Composite(**{orbax_format.TRAIN_STATE: ocp.args.JsonRestore()})
        try:
            return self.manager.restore(step, args=args)[orbax_format.TRAIN_STATE] or {}
        except Exception:  # restore_state names a damaged folder; here it only costs the count
            return {}

    def restore(self, step: int, *, params, opt_state, ema_params) -> dict:
        """Restores `step` into the structure (and shardings) of the abstract trees given."""
        items = {
            orbax_format.PARAMS: ocp.args.StandardRestore(params),
            orbax_format.OPT_STATE: ocp.args.StandardRestore(opt_state),
            orbax_format.DATA_ITER: ocp.args.JsonRestore(),
            orbax_format.TRAIN_STATE: ocp.args.JsonRestore(),
            orbax_format.META: ocp.args.JsonRestore(),
        }
        if ema_params is not None:
            items[orbax_format.EMA_PARAMS] = ocp.args.StandardRestore(ema_params)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return {name: restored[name] for name in items}

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def write_best(self, step: int, val_accuracy: float) -> None:
        """`checkpoints/best.json`, replaced atomically (by process 0 alone)."""
        if jax.process_index() != 0:
            return
        replace_file(self.directory / orbax_format.BEST_FILE,
                     json.dumps({"step": int(step), METRIC: float(val_accuracy)}))

    def read_best(self) -> dict | None:
        path = self.directory / orbax_format.BEST_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def wait(self) -> None:
        """Finishes the save in flight (and the keep policy's removals after it)."""
        with self._out_of_space():
            self.manager.wait_until_finished()
        self.pending = None
        self.empty_trash()

    def close(self) -> None:
        with self._out_of_space():
            self.manager.close()
        self.pending = None
        self.empty_trash()

    def empty_trash(self) -> None:
        """Removes the steps the keep policy dropped (process 0 alone: orbax drops there)."""
        if jax.process_index() == 0:
            shutil.rmtree(self.directory / TRASH, ignore_errors=True)

    def remove_unfinished(self) -> None:
        """Removes what a failed save left: orbax's temporary step folders (process 0, after
        `close_quietly`; tensorstore's writes still in flight may make them again for a
        moment, `remove_until_settled`)."""
        if jax.process_index() != 0:
            return

        def unfinished() -> list[Path]:
            # orbax's temporary folders; vit.paths' staged files (best.json); `.tmp` files
            return ([e for e in self.directory.iterdir() if UNFINISHED in e.name
                     or e.name.endswith((".part", ".tmp"))] if self.directory.is_dir() else [])

        remove_until_settled(unfinished)

    @contextlib.contextmanager
    def _out_of_space(self):
        """A full disk met by orbax, however it reports it (an OSError from its threads, a
        tensorstore ValueError), as one `OutOfSpace` naming the step saved."""
        try:
            yield
        except Exception as err:
            if not is_out_of_space(err) or isinstance(err, OutOfSpace):
                raise
            step, size = self.pending or (None, None)
            where = self.step_dir(step) if step is not None else self.directory
            raise OutOfSpace(where, size) from None

    def close_quietly(self) -> None:
        """Closes on the way out of a failed run, before its caller may remove a new workdir
        (orbax's background thread would otherwise list a folder that is gone and print a
        traceback after the error); a second failure here must not hide the first."""
        with contextlib.suppress(Exception):  # the run's own error is the one to report
            self.manager.close()
        # A failed save stops waiting at its first error; the writes still in flight end in
        # orbax's own threads, which must be done before their folder is removed (orbax's
        # threads raise their own error again when joined).
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and \
                    type(thread).__module__.startswith("orbax."):
                with contextlib.suppress(Exception):
                    thread.join(timeout=60)


class _NotFullDisk(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        return not (err is not None and is_out_of_space(err))


_QUIET = _NotFullDisk()


def quiet_full_disk_logs() -> None:
    """From now on, orbax's (absl's) and asyncio's log records of a full disk are dropped, every
    other record passes. For good, not for a block: orbax's threads and garbage-collected
    futures report a failed save after the run has ended and said so."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


class Diverged(VitError):
    """The loss became NaN or infinite."""


class CheckpointPolicy:
    """When to save, `best.json`, and no checkpoint of a diverged run.

    A save happens every `every` steps, at the run's last step, and when a stop signal
    arrived. `best.json` names the best validated step, but only once that step's
    (asynchronous) save is complete, so it never points at a checkpoint a crash could lose.
    """

    def __init__(self, ckpts: TrainCheckpoints, *, every: int, resumed: bool):
        self.ckpts, self.every = ckpts, every
        best = ckpts.read_best() or {}
        self.best_accuracy: float = best.get(METRIC, -1.0) if resumed else -1.0
        self._pending_best: tuple[int, float] | None = None

    def due(self, step: int, end: int, stopping: bool) -> bool:
        return step % self.every == 0 or step == end or stopping

    def save(self, step: int, *, val_accuracy: float | None, **items) -> None:
        """Starts saving `step` (`items` as `TrainCheckpoints.save` takes them)."""
        self.ckpts.wait()  # the previous save is complete: its best.json entry may now point at it
        self._write_pending_best()
        self.ckpts.save(step, val_accuracy=val_accuracy, **items)
        # Ties go to the later step, as orbax's BestN keeps the later of equal checkpoints.
        if val_accuracy is not None and val_accuracy >= self.best_accuracy:
            self.best_accuracy, self._pending_best = val_accuracy, (step, val_accuracy)

    def check_finite(self, step: int, loss: float, weights_finite: bool) -> None:
        """Raises `Diverged` (before anything saves them) if `step` left non-finite values."""
        if math.isfinite(loss) and weights_finite:
            return
        self.ckpts.wait()
        self._write_pending_best()
        kept = self.ckpts.latest_step()
        what = f"loss became {loss}" if not math.isfinite(loss) else \
            "the weights became non-finite"
        raise Diverged(
            f"{what} at step {step}; stopped. The last good checkpoint is "
            f"{self.ckpts.step_dir(kept) if kept else 'none'}; lower optim.lr or raise "
            "optim.warmup_steps, then run again (it resumes from there)")

    def close(self) -> None:
        """Finishes the last save, then writes its best.json entry."""
        self.ckpts.wait()
        self._write_pending_best()
        self.ckpts.close()

    def _write_pending_best(self) -> None:
        if self._pending_best:
            self.ckpts.write_best(*self._pending_best)
            self._pending_best = None
