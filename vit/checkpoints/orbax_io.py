"""Our own orbax checkpoints: exports and training workdirs (layout in `orbax_format.py`).

Reading needs no training code: a step directory or an export holds the `params` item (a pure
dict) and the `meta` item (JSON: model config, preprocessing, labels), so predict never guesses.
Parameters are restored as host numpy arrays, whatever sharding they were saved with.

A workdir may be read while a run writes into it, without its lock. Orbax makes a step appear
by renaming its finished folder (`N.orbax-checkpoint-tmp-*` is a save in flight, not a step),
and training's keep policy makes one disappear by a rename too (`vit.training.checkpointing`). So
a step that fails to read and is gone afterwards was dropped while it was read: the reader takes
the next finished step. One that fails and is still there is damaged, and only then is it
called so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from pathlib import Path

import numpy as np

import vit.checkpoints.orbax_format as orbax_format
from vit.checkpoints.files import check_destination
from vit.checkpoints.loaded import LoadedCheckpoint, zero_head_warning
from vit.checkpoints.tree import flatten, nest, path_name
from vit.errors import CheckpointError, ConfigError, DataError
from vit.models.config import ViTConfig
from vit.preprocess import Preprocessing

# A finished step has one definition, shared with training.
from vit.step_folders import finished_steps
from vit.step_folders import has_model_items as is_orbax_dir

DAMAGED_FIX = ("copy it again if it was copied, or use another step (checkpoints/<step>) or "
               "export")


def is_workdir(path: Path) -> bool:
    return (path / orbax_format.CHECKPOINTS_DIR).is_dir()


def find_workdir_checkpoint(workdir, skip: tuple[int, ...] = (),
                            named: str = "--checkpoint") -> tuple[Path, str]:
    """(step directory, which one and why): the best checkpoint when kept, else the latest;
    never one of `skip` (steps dropped while they were read). `named` is how the user gave
    `workdir` (`--checkpoint`, `--init`, a recipe's `init`, ...), for the errors."""
    checkpoints = Path(workdir) / orbax_format.CHECKPOINTS_DIR
    steps = [s for s in finished_steps(checkpoints) if s not in skip]
    if not steps:
        saving = sorted(p.name.split(".")[0] for p in checkpoints.glob("*.orbax-checkpoint-tmp*")
                        if p.name.split(".")[0].isdigit()) if checkpoints.is_dir() else []
        now = f" (step {saving[-1]} is being saved now)" if saving else ""
        raise CheckpointError(f"{named} {workdir}: no finished checkpoint under {checkpoints}"
                              f"{now}; let that run save a step first, or point {named} at "
                              "another checkpoint (a step folder, an export, a .npz or a model "
                              "folder)")
    best_file = checkpoints / orbax_format.BEST_FILE
    if best_file.exists():
        try:
            best = int(json.loads(best_file.read_text())["step"])
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{best_file}: not a valid best-checkpoint record "
                                  '(expected {"step": N, ...})') from None
        if best in steps:
            return checkpoints / str(best), f"best checkpoint, step {best}"
        return (checkpoints / str(steps[-1]),
                f"latest checkpoint, step {steps[-1]} (best step {best} is gone)")
    return checkpoints / str(steps[-1]), f"latest checkpoint, step {steps[-1]}"


class _DamagedParams(Exception):
    """The params item cannot be read back; the message says what is wrong."""


# Event loops of failed reads, never closed: reads that were still in flight when one failed
# may yet report to them.
_LOOPS_OF_FAILED_READS: list[asyncio.AbstractEventLoop] = []


class _ReadEventLoop(asyncio.SelectorEventLoop):
    """The loop orbax makes for a read, closed by `quiet_event_loops` rather than by orbax.

    Orbax reads every array at once and closes its loop as soon as one read fails (a chunk file
    cut short). The other reads still finish, in tensorstore's threads, and each then prints an
    "Event loop is closed" traceback after our one-line error. So the loop lets its unfinished
    tasks end when orbax closes it, and stays open after a failure for futures not in a task.
    """

    def close(self):
        pending = [task for task in asyncio.all_tasks(self) if not task.done()]
        if pending and not self.is_running() and not self.is_closed():
            self.run_until_complete(asyncio.wait(pending, timeout=60))

    def close_now(self):
        super().close()


@contextlib.contextmanager
def quiet_event_loops(keep: int | None = None):
    """Inside the block, new event loops are `_ReadEventLoop`s: closed at its end when it
    succeeds, kept open when it fails. With `keep` (a long block: a training run making loops
    at every save), only the `keep` newest stay open meanwhile; older ones, long done, close."""
    loops: list[_ReadEventLoop] = []
    lock = threading.Lock()  # orbax makes loops from several threads at once

    class Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self):
            loop = _ReadEventLoop()
            with lock:
                loops.append(loop)
                if keep is not None and len(loops) > keep:
                    done = [old for old in loops[:-keep] if not old.is_running()]
                    for old in done:
                        old.close_now()
                        loops.remove(old)
            return loop

    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(Policy())
    try:
        yield
    except BaseException:
        _LOOPS_OF_FAILED_READS.extend(loops)  # a few, and only when a checkpoint is damaged
        raise
    else:
        for loop in loops:
            loop.close_now()
    finally:
        asyncio.set_event_loop_policy(previous)


def _restore_params(directory: Path) -> dict:
    import jax
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    try:
        with quiet_event_loops():
            # An item saved inside a composite checkpoint has no _CHECKPOINT_METADATA of its
            # own; orbax logs that as a warning on every load although the tree metadata it
            # needs is there. When that tree metadata cannot be read, orbax logs a warning too
            # and returns None.
            absl_logger = logging.getLogger("absl")
            level = absl_logger.level
            absl_logger.setLevel(logging.ERROR)
            try:
                metadata = checkpointer.metadata(directory).item_metadata
            finally:
                absl_logger.setLevel(level)
            if metadata is None or getattr(metadata, "tree", None) is None:
                raise _DamagedParams("their tree metadata is missing or damaged: _METADATA, "
                                     "manifest.ocdbt or the files under d/")
            as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                    metadata.tree)
            params = checkpointer.restore(directory,
                                          args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    except (ValueError, OSError, TypeError, KeyError) as err:  # tensorstore's errors included
        raise _DamagedParams(str(err)) from None
    finally:
        checkpointer.close()  # its threads and open files go now, failed read or not
    return nest({k: np.asarray(v) for k, v in flatten(params).items()})  # "0" -> 0


def _restore_meta(directory: Path) -> dict:
    """The `meta` item (a one-line error when it cannot be parsed)."""
    import orbax.checkpoint as ocp

    try:
        meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(directory)
    except (ValueError, OSError, TypeError, KeyError) as err:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{directory}: unreadable checkpoint metadata ({err}); the "
                              f"checkpoint is damaged: {DAMAGED_FIX}") from None
    return meta if isinstance(meta, dict) else {}


def read(path, named: str = "--checkpoint") -> LoadedCheckpoint:
    """A workdir (its best, else latest, finished step), a step directory or an export;
    `named` is how the user gave `path`, for the errors."""
    path = Path(path).absolute()  # orbax's metadata lookup fails on relative paths
    if not is_workdir(path):
        try:
            return _read_step(path, f"{path} (orbax)")
        except CheckpointError:
            if path.parent.name == orbax_format.CHECKPOINTS_DIR and not path.exists():
                raise CheckpointError(
                    f"{path}: removed while it was read, by the keep policy of the run training "
                    f"in {path.parent.parent}; read the workdir itself for its newest step, or "
                    "copy the step elsewhere first") from None
            raise
    dropped: list[int] = []
    for _ in range(MAX_DROPPED_WHILE_READ):
        step_dir, which = find_workdir_checkpoint(path, skip=tuple(dropped), named=named)
        try:
            return _read_step(step_dir, f"workdir {path}: {which}")
        except CheckpointError:
            if step_dir.exists():  # still there: its files really are damaged
                raise
            dropped.append(int(step_dir.name))
    raise CheckpointError(f"{path}: the run training there dropped {len(dropped)} steps while "
                          "they were read; read it again, or read a step copied elsewhere")


# Steps a reader lets go (dropped by the keep policy as it read them) before it gives up.
MAX_DROPPED_WHILE_READ = 8


def _read_step(step_dir: Path, source: str) -> LoadedCheckpoint:
    if not is_orbax_dir(step_dir):
        raise CheckpointError(f"{step_dir}: not an orbax checkpoint (expected the items "
                              f"'{orbax_format.PARAMS}' and '{orbax_format.META}')")
    meta = _restore_meta(step_dir / orbax_format.META)
    if meta.get("format") != orbax_format.FORMAT:  # checked before its fields are trusted
        raise CheckpointError(f"{step_dir}: meta format {meta.get('format')!r} is not "
                              f"{orbax_format.FORMAT!r}; it was not written by vit")
    if not isinstance(meta.get("model_config"), dict) or not isinstance(
            meta.get("preprocessing"), dict):
        raise CheckpointError(f"{step_dir}: checkpoint metadata lacks model_config or "
                              "preprocessing; the checkpoint is damaged")
    try:
        config = ViTConfig.from_dict(meta["model_config"])
        preprocessing = Preprocessing.from_dict(meta["preprocessing"])
    except (ConfigError, DataError, TypeError, ValueError) as err:
        raise CheckpointError(f"{step_dir}: checkpoint metadata does not describe a model "
                              f"({err}); the checkpoint is damaged: {DAMAGED_FIX}") from None
    # A run that keeps an EMA of its weights was validated (and its best step chosen) on the
    # EMA: that is the model its steps hold.
    item = (orbax_format.EMA_PARAMS if (step_dir / orbax_format.EMA_PARAMS).is_dir()
            else orbax_format.PARAMS)
    try:
        params = _restore_params(step_dir / item)
    except _DamagedParams as err:
        raise CheckpointError(f"{step_dir}: checkpoint is incomplete or damaged: the parameters "
                              f"in {item}/ cannot be read ({err}); {DAMAGED_FIX}") from None
    _check_every_array(params, config, step_dir)
    warning = zero_head_warning(params)
    return LoadedCheckpoint(
        config=config, params=params, preprocessing=preprocessing, labels=meta.get("labels"),
        source=source + (", its EMA weights" if item == orbax_format.EMA_PARAMS else ""),
        warnings=[warning] if warning else [], family="vit")


def _check_every_array(params: dict, config: ViTConfig, step_dir: Path) -> None:
    """Raises naming the arrays that the model its own `meta` describes would not read, or
    would miss. Text-conditioning weights are fitted later (`LoadedCheckpoint.adapt_text`)."""
    from vit.checkpoints.fit import TEXT_SUBTREES, expected_shapes

    want = {p: s for p, s in expected_shapes(config).items() if p[0] not in TEXT_SUBTREES}
    have = {p: tuple(np.shape(v)) for p, v in flatten(params).items()
            if p[0] not in TEXT_SUBTREES}
    problems = []
    for what, paths in (("unexpected", [p for p in have if p not in want]),
                        ("missing", [p for p in want if p not in have]),
                        ("of another shape", [p for p in want if p in have
                                              and have[p] != want[p]])):
        if paths:
            more = f" and {len(paths) - 4} more" if len(paths) > 4 else ""
            problems.append(f"{what}: {', '.join(path_name(p) for p in paths[:4])}{more}")
    if problems:
        raise CheckpointError(f"{step_dir}: the parameters do not match the model its meta item "
                              f"describes ({'; '.join(problems)}); the checkpoint is damaged "
                              f"or was edited: {DAMAGED_FIX}")


def save_orbax(path, model_or_params, config: ViTConfig | None = None,
               preprocessing: Preprocessing | None = None,
               labels: list[str] | None = None) -> Path:
    """Writes an export: one composite directory with `params` and `meta`, no step folders."""
    import orbax.checkpoint as ocp

    if isinstance(model_or_params, dict):
        params = model_or_params
        if config is None:
            raise ValueError("save_orbax(path, params, config, ...) needs the model config")
    else:
        from flax import nnx

        params = nnx.to_pure_dict(nnx.state(model_or_params, nnx.Param))
        config = config or model_or_params.config
    preprocessing = preprocessing or Preprocessing(size=config.image_size)
    params = nest({k: np.asarray(v, np.float32) for k, v in flatten(params).items()})
    meta = orbax_format.make_meta(config.to_dict(), preprocessing.to_dict(), labels)
    path = check_destination(Path(path).absolute())
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    checkpointer.save(path, ocp.args.Composite(**{
        orbax_format.PARAMS: ocp.args.StandardSave(params),
        orbax_format.META: ocp.args.JsonSave(meta)}))
    return path
