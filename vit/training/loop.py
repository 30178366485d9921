"""`train(config, workdir)`: build or resume, step, evaluate, checkpoint, plot.

Running it again on the same workdir resumes from the latest complete checkpoint: parameters,
optimiser state, EMA, data-iterator position and step all come back, and randomness is a pure
function of (seed, step), so the resumed run's losses equal an uninterrupted run's.

This file is the orchestration only, top to bottom; each concern lives in its own module:
`workdir` (ours or refused, its lock, its files), `resume` (whether a resume fits), `program`
(the recipe's mesh, model, optimiser, placement, state and compiled step: the one builder the
dry run, the benchmarks and the tests use too), `checkpointing` (storage and save policy),
`signals`, `progress`, `metrics` and `timings` (where the run's time went, as records of
metrics.jsonl).

What a run may cost the workdir: nothing until the lock is held and the checks pass; a run that
fails before its first checkpoint takes back what it added; a full disk leaves no temporary
file and the last finished checkpoint intact, and says so in its one line.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import threading
import time
from pathlib import Path

import jax

from vit import device_mesh
from vit.checkpoints import orbax_format
from vit.checkpoints.orbax_io import quiet_event_loops
from vit.data import open_source, train_iterator
from vit.errors import ConfigError, OutOfMemory, OutOfSpace, is_out_of_memory
from vit.inference.evaluate import (
    CompiledAhead,
    evaluate_task,
    make_logits_fn,
    model_inputs,
    sharded_eval_batches,
)
from vit.step_folders import finished_steps
from vit.training import parallel
from vit.training import workdir as workdirs
from vit.training.checkpointing import (
    METRIC,
    CheckpointPolicy,
    TrainCheckpoints,
    quiet_full_disk_logs,
)
from vit.training.early_stop import REASON as STOPPED_EARLY
from vit.training.early_stop import EarlyStop
from vit.training.from_recipe import augment_of
from vit.training.iterator_records import iterator_states
from vit.training.losses import DEFAULT as DEFAULT_LOSS
from vit.training.metrics import MetricsLog, TrainMeter, plot_curves
from vit.training.placement import abstract
from vit.training.program import Resume, TrainProgram, build_program, eval_pieces
from vit.training.progress import progress
from vit.training.resume import check_resume
from vit.training.signals import StopSignals
from vit.training.tensorboard import FOLDER as TB_FOLDER
from vit.training.tensorboard import EventLog
from vit.training.timings import RunClock
from vit.training.workdir import has_finished_step, write_config

VALIDATION = "the first validation"  # what an out-of-memory there names


def train(config, workdir: str | Path, *, init: str | None = None,
          stop_after: int | None = None, sources: dict | None = None) -> dict:
    """Trains (or resumes) into `workdir`; returns the last metrics.

    `init` is a pretrained checkpoint (any format `vit.checkpoints` reads). `stop_after`
    runs at most that many steps in this call, then saves, as an interruption would.
    `sources` (`{"train": source, "validation": source}`, random-access as
    `vit.data.open_source` returns them) replace the recipe's dataset.
    Raises `vit.training.checkpointing.Diverged` if the loss or the weights become non-finite,
    `vit.training.workdir.WorkdirError` for a folder that is not a run's or one another run holds.
    A recipe with `stages` is run by `vit.training.stages.train_stages`, one call per stage.
    """
    if "stages" in config:
        raise ConfigError("a staged recipe runs through vit.training.stages.train_stages")
    with workdirs.claim(workdir, primary=parallel.is_primary(),
                        agree=parallel.allgather_json) as claim:
        return train_claimed(config, Path(workdir), claim, init=init, stop_after=stop_after,
                             sources=sources)


def train_claimed(config, workdir: Path, claim: workdirs.Claim | None, *, init: str | None,
                  stop_after: int | None, sources: dict | None = None) -> dict:
    """`train` in a workdir already claimed (`claim` is None on processes other than 0)."""
    quiet_full_disk_logs()
    with quiet_event_loops(keep=64):  # orbax's loops wait for every write, failed ones too
        ckpts, clock = None, RunClock()
        try:
            ckpts = TrainCheckpoints(workdir, keep=config.train.keep_checkpoints)
            return _train(config, workdir, ckpts, claim, clock, init=init,
                          stop_after=stop_after, sources=sources)
        except Exception as err:
            if ckpts is not None:  # before anything is removed under orbax's threads
                ckpts.close_quietly()
                ckpts.remove_unfinished()
            if claim is not None and not has_finished_step(workdir):
                claim.undo()  # a run with no checkpoint leaves nothing behind
            if isinstance(err, OutOfSpace):
                raise _out_of_space(err, workdir) from None
            raise
        finally:
            clock.close()


def _out_of_space(err: OutOfSpace, workdir: Path) -> OutOfSpace:
    """`err` with what the run kept: the last finished checkpoint, from which it resumes."""
    checkpoints = workdir / orbax_format.CHECKPOINTS_DIR
    steps = finished_steps(checkpoints)
    kept = (f"the last finished checkpoint, {checkpoints / str(steps[-1])}, is intact: free "
            "some space, then run the same command to resume from it" if steps
            else "no checkpoint was finished, and nothing of this run was kept")
    out = OutOfSpace(err.path, err.needed)
    out.args = (f"{out}; {kept}",)
    return out


def _train(config, workdir: Path, ckpts: TrainCheckpoints, claim: workdirs.Claim | None,
           clock: RunClock, *, init: str | None, stop_after: int | None,
           sources: dict | None) -> dict:
    primary = parallel.is_primary()  # process 0 alone writes files and prints
    mesh = parallel.mesh_from_config(config)
    augment = augment_of(config)  # a bad input.randaugment: one line, before anything is built
    loss_name = config.train.get("loss", DEFAULT_LOSS)
    train_src, val_src = _open_sources(config, loss_name, sources)
    config = _fit_batch(config, len(train_src), mesh, primary)
    tc, steps = config.train, config.train.steps
    host_batch = device_mesh.host_batch_size(tc.batch_size, mesh)
    eval_batch = min(tc.eval_batch_size, len(val_src)) if val_src else tc.eval_batch_size
    eval_host_batch = device_mesh.eval_host_batch_size(eval_batch, mesh)
    num_classes = len(train_src.class_names)

    # Model and train state: from the latest checkpoint, else from --init, else fresh. A
    # resume that does not fit the checkpoint is refused here, before anything is written.
    start = ckpts.latest_step() or 0
    resume_meta = None
    if start:
        resume_meta, config = check_resume(config, ckpts, start, num_classes, config.data.name,
                                           primary=primary)
        tc = config.train
    early = EarlyStop(tc.get("early_stop_patience", 0),
                      ckpts.read_train_state(start).get("early_stop") if start else None)
    if start >= steps or early.due:  # finished before: nothing to train, nothing rewritten
        ckpts.close()
        if primary:
            print(f"done: {steps} steps, all saved earlier in {ckpts.directory}; raise "
                  "train.steps to train further" if start >= steps else
                  f"done: stopped early at step {start} earlier ({ckpts.directory}); raise "
                  "train.early_stop_patience (or set it to 0) to train further")
        return {"stopped_by": None if start >= steps else STOPPED_EARLY,
                "best_val_accuracy": (ckpts.read_best() or {}).get(METRIC, -1.0)}
    program = build_program(config, num_classes, init=init, mesh=mesh,
                            resume=Resume(ckpts, start, resume_meta) if start else None)
    end = steps if stop_after is None else min(steps, start + stop_after)
    try:
        last, step, stopped_by, run = _steps(
            config, workdir, ckpts, claim, clock, program, sources=(train_src, val_src),
            augment=augment, start=start, end=end, host_batch=host_batch,
            eval_host_batch=eval_host_batch, early=early, primary=primary)
    finally:  # a new state may still be building: no exit inside XLA's compile
        program.wait()
    if (step >= steps or stopped_by == STOPPED_EARLY) and primary:
        with_tb = tc.get("tensorboard", True)  # a 0.1.0 workdir's config lacks the key
        tb = f", TensorBoard events in {workdir / TB_FOLDER}" if with_tb else ""
        print(f"done: {step} steps; checkpoints in {ckpts.directory}, metrics in "
              f"{workdir / 'metrics.jsonl'}, curves in {workdir / 'curves.png'}{tb}")
    clock.note(step, exit_s=round(time.perf_counter() - run.ended_at, 6))
    clock.write(run.log)
    return {**last, **{f"val_{k}": v for k, v in run.last_val.items()},
            "stopped_by": stopped_by, "best_val_accuracy": run.saver.best_accuracy}


def _steps(config, workdir: Path, ckpts: TrainCheckpoints, claim: workdirs.Claim | None,
           clock: RunClock, program: TrainProgram, *, sources: tuple, augment, start: int,
           end: int, host_batch: int, eval_host_batch: int, early: EarlyStop, primary: bool):
    """`program`'s steps from `start` to `end` over the recipe's data: (last train metrics,
    the step reached, what stopped it, the `_Run`)."""
    train_src, val_src = sources
    num_classes = len(train_src.class_names)
    model, tokenizer = program.model, program.tokenizer
    iterator = train_iterator(train_src, model.preprocessing, augment,
                              batch_size=host_batch, seed=config.seed, num_classes=num_classes,
                              shard_index=jax.process_index(),
                              shard_count=jax.process_count(),
                              num_threads=config.data.num_threads, tokenize=tokenizer)
    if start and program.state.iterator_state is not None:  # a resumed run's data position
        iterator.set_state(program.state.iterator_state)
    run = _Run(config, workdir, ckpts, program, clock, iterator=iterator,
               sources=sources, tokenizer=tokenizer,
               logits_fn=make_logits_fn(model.graphdef, program.mesh, program.place.params,
                                         model.config.dtype,
                                         eval_pieces(config, model.config, program.mesh,
                                                     eval_host_batch)),
               eval_batch_size=eval_host_batch, start=start, primary=primary, early=early)
    if claim is not None:  # the run writes from here on: an unmarked workdir becomes ours
        claim.adopt()
    clock.started_up(start + 1)  # the step it leads to: a restart from `start` drops it
    try:
        return (*run.steps(start, end), run)
    finally:  # batches made ahead are dropped: the interpreter's exit would wait for them all
        iterator.close()
        if isinstance(run.logits_fn, CompiledAhead):  # no exit inside XLA's compile
            run.logits_fn.wait()


def _open_sources(config, loss_name: str, sources: dict | None = None):
    """`(train, validation or None)`: the recipe's splits (or the `sources` given), refused
    when the loss cannot train on them."""
    data = config.data
    if sources is not None:
        train_src, val_src = sources["train"], sources.get("validation")
        val_src = val_src if data.val_split else None
    else:
        train_src = open_source(data.name, data.train_split, data_dir=data.data_dir,
                                strict=data.strict, labels=data.get("labels"))
        val_src = (open_source(data.name, data.val_split, data_dir=data.data_dir,
                               strict=data.strict, labels=data.get("labels"))
                   if data.val_split else None)
    class_names = train_src.class_names
    if getattr(train_src, "multi_label", False) and loss_name == "softmax_xent":
        raise ConfigError(f"{data.name} has multi-hot labels; set train.loss=sigmoid_xent (or "
                          "prompt_xent to train a text model on its prompts)")
    if config.train.get("patch_loss", 0.0) > 0 and "where" not in train_src[0]:
        raise ConfigError(f"train.patch_loss={config.train.patch_loss}: {data.name} does not say "
                          "what lies where in its images (promptshapes and fashion_scenes do); "
                          "set train.patch_loss=0")
    if len(class_names) < 2 and loss_name == "softmax_xent":  # the loss is 0 from the first step
        raise ConfigError(f"{data.name} has one class ({', '.join(class_names)}); a classifier "
                          "needs at least two: add a folder per class")
    return train_src, val_src


def _fit_batch(config, examples: int, mesh, primary: bool):
    """`config` with `train.batch_size` capped at the number of training examples (kept a
    multiple of the devices and of `train.accum_steps`), with a note: a larger batch only
    repeats images, and one of millions would be allocated whole before the first step."""
    tc = config.train
    unit = math.lcm(mesh.devices.size, tc.accum_steps)
    capped = examples // unit * unit
    if tc.batch_size <= examples or capped < unit:
        return config
    if primary:
        print(f"note: train.batch_size={tc.batch_size} is more than the {examples} training "
              f"images of {config.data.name}: capped at {capped}", file=sys.stderr)
    config = copy.deepcopy(config)
    config.train.batch_size = capped
    return config


class _Run:
    """The steps of one `train` call: the program whose state they advance, and the
    validation, log, checkpoints and timings they feed. A step's metrics stay on the device
    until a log or a save needs them, so the host never waits on a step in between."""

    def __init__(self, config, workdir: Path, ckpts: TrainCheckpoints, program: TrainProgram,
                 clock: RunClock, *, iterator, sources, tokenizer, logits_fn,
                 eval_batch_size: int, start: int, primary: bool, early: EarlyStop):
        self.config, self.workdir, self.ckpts = config, workdir, ckpts
        self.program, self.clock, self.model = program, clock, program.model
        self.iterator, (self.train_src, self.val_src) = iterator, sources
        self.tokenizer, self.loss_name, self.logits_fn = tokenizer, program.loss_name, logits_fn
        self.mesh, self.eval_batch_size, self.primary = program.mesh, eval_batch_size, primary
        events = EventLog(workdir / TB_FOLDER) if config.train.get("tensorboard", True) else None
        self.log = MetricsLog(workdir, start, enabled=primary, events=events)
        self.saver = CheckpointPolicy(ckpts, every=config.train.checkpoint_every,
                                      resumed=bool(start))
        self.meter, self.pending, self.early, self.last_val = TrainMeter(), [], early, {}
        self.validated = False
        self.ended_at = time.perf_counter()  # when the last step ended: the exit's start

    def _compile_validation_ahead(self) -> None:
        """The validation forward compiles in a thread while the first steps run: XLA
        compiles on one core, and beside the step's own compile the two slow each other."""
        if self.val_src is not None:
            params = abstract(self.evaluated_params(), self.program.place.params)
            self.logits_fn = CompiledAhead(self.logits_fn, lambda: (params, model_inputs(
                device_mesh.to_global(self._first_validation_batch(), self.mesh))))

    def _load_matplotlib_ahead(self) -> None:
        """matplotlib loads beside the first steps, not at the end of the run, and not during
        the step's trace: its import is Python holding the interpreter the trace needs too."""
        if self.primary:
            threading.Thread(target=_load_matplotlib, name="vit-matplotlib", daemon=True).start()

    def _first_validation_batch(self) -> dict:
        with contextlib.closing(self._validation_batches()) as batches:  # its readers stop
            return next(batches)

    def _validation_batches(self):
        return sharded_eval_batches(self.val_src, self.model.preprocessing,
                                    batch_size=self.eval_batch_size,
                                    num_threads=self.config.data.num_threads,
                                    tokenize=self.tokenizer)

    def steps(self, start: int, end: int) -> tuple[dict, int, str | None]:
        """Trains from `start` to `end`, validating and saving when due; returns the last
        train metrics, the step reached and what stopped it: the signal, `STOPPED_EARLY`
        (validation stopped improving) or None."""
        tc, steps = self.config.train, self.config.train.steps
        last, bar = {}, progress(start, steps, enabled=self.primary)
        stop = StopSignals(kept=self.kept)
        stopped_early = False
        program, clock = self.program, self.clock
        with stop.installed():
            step = start
            while step < end:
                with self._fits_memory(first=step == start):
                    with self.meter.waiting():  # blocked on the input pipeline
                        host_batch = next(self.iterator)
                    batch = program.put(host_batch)
                    if program.compiled is None:  # where a program that cannot fit fails
                        program.compile(batch)
                        waited = time.perf_counter()
                        program.wait()  # a new state, built beside the compile
                        clock.note(step + 1, compile_s=round(
                            program.compile_s + time.perf_counter() - waited, 6))
                        self._compile_validation_ahead()
                        self._load_matplotlib_ahead()
                    called = time.perf_counter()
                    metrics = program(batch)
                    clock.steps.started(metrics, called)
                    if step == start:  # where a step that cannot fit fails
                        jax.block_until_ready(metrics)
                step += 1
                self.pending.append((step, metrics))
                bar.update(1)
                stopping = stop.check(step)
                validating = self.val_src is not None and (step % tc.eval_every == 0
                                                           or step == steps)
                logged = step % tc.log_every == 0 or step == end or stopping
                if logged:
                    last = self._log_train(step, bar)
                if validating:
                    self._drain()  # waits for the step (training time)
                    with self.meter.paused(), clock.timed(step, "evaluation_s"):
                        val_acc = self.validate(step)  # images/s counts training steps only
                    clock.write(self.log)
                    # At the last step the run ends anyway: that is no early stop.
                    stopped_early = self.early.update(step, val_acc) and step < steps
                    if stopped_early and not logged:  # the run's last training figures
                        last = self._log_train(step, bar)
                else:
                    val_acc = None
                saving = self.saver.due(step, end, stopping=bool(stopping) or stopped_early)
                if saving:
                    self._drain()  # never saves non-finite weights
                    with self.meter.paused(), clock.timed(step, "checkpoint_s"):
                        self.save(step, val_acc)
                    clock.write(self.log)
                if stopped_early:
                    self.log.write(self.early.record(step))
                    if self.primary:
                        print(self.early.line(step), flush=True)
                    break
                if stopping:  # every process says so: each one's log shows where it stopped
                    who = f"process {jax.process_index()} " if jax.process_count() > 1 else ""
                    print(f"{stopping}: {who}saved step {step} to {self.ckpts.step_dir(step)}; "
                          "run the same command to resume", file=sys.stderr, flush=True)
                    break
            self.ended_at = time.perf_counter()
            self.saver.close()  # the last save finished (where a second Ctrl-C ends it)
            self._draw_curves()
        bar.close()
        return last, step, STOPPED_EARLY if stopped_early else stop.received

    def _draw_curves(self) -> None:
        """curves.png from metrics.jsonl, once the last save has finished: drawn beside orbax's
        finishing threads, the two contend for the interpreter and take longer than one after
        the other."""
        metrics = self.workdir / "metrics.jsonl"
        if self.primary and metrics.exists():
            plot_curves(metrics, self.workdir / "curves.png")

    def _log_train(self, step: int, bar) -> dict:
        """Writes (and shows) the training record of the steps since the last one."""
        self._drain()
        means, images_per_s, data_wait = self.meter.flush(self.config.train.batch_size)
        record = {"step": step, "split": "train", **means,
                  "lr": float(self.program.lr_fn(step - 1)),
                  "images_per_s": images_per_s, "data_wait": data_wait}
        self.clock.note_steps(step)
        self.clock.write(self.log)
        self.log.write(record)
        bar.report(record)
        return record

    @contextlib.contextmanager
    def _fits_memory(self, first: bool, what: str = "the first training step"):
        """The first step's (or validation's) batch and program, where memory that cannot
        suffice runs out: an `OutOfMemory` naming what to lower, with the values this run has."""
        if not first:
            yield
            return
        try:
            yield
        except Exception as err:
            if not any(is_out_of_memory(e) for e in _chain(err)):
                raise
            tc, cfg = self.config.train, self.model.config
            said = next(str(e) for e in _chain(err) if is_out_of_memory(e)).strip()
            said = (said.splitlines() or [type(err).__name__])[0].removeprefix(
                "RESOURCE_EXHAUSTED: ")[:120]
            batch = (f"train.eval_batch_size={tc.eval_batch_size}" if what == VALIDATION else
                     f"train.batch_size={tc.batch_size} (or raise train.accum_steps="
                     f"{tc.accum_steps} to split it)")
            raise OutOfMemory(
                f"{what} does not fit in memory ({said}); lower {batch}, "
                f"input.image_size={cfg.image_size[0]}, or the model (width {cfg.width}, "
                f"depth {cfg.depth}, mlp_dim {cfg.mlp_dim})") from None

    def kept(self) -> str:
        """Which checkpoint an interruption leaves, for its line."""
        steps = finished_steps(self.ckpts.directory)
        return (f"the last finished checkpoint, {self.ckpts.step_dir(steps[-1])}, is intact: "
                "run the same command to resume from it" if steps else "no checkpoint was saved")

    def _drain(self) -> None:
        """Reads the pending steps' metrics: raises `Diverged` at the first non-finite one."""
        for s, metrics in jax.device_get(self.pending):  # one transfer for all of them
            self.saver.check_finite(s, float(metrics["loss"]), bool(metrics["finite"]))
            self.meter.add({k: float(v) for k, v in metrics.items() if k != "finite"})
        self.pending.clear()

    def validate(self, step: int) -> float:
        batches = self._validation_batches()
        # The first validation compiles its forward at train.eval_batch_size (in the step's
        # cache pieces, if any): a run whose training steps fit can still fail here.
        with self._fits_memory(first=not self.validated, what=VALIDATION):
            res = evaluate_task(self.loss_name, self.logits_fn, self.evaluated_params(),
                                batches, len(self.train_src.class_names), self.mesh)
        self.validated = True
        self.last_val = {"loss": res["loss"], "accuracy": res["accuracy"],
                         **{k: res[k] for k in ("top5_accuracy", "label_accuracy") if k in res}}
        self.clock.write(self.log)
        self.log.write({"step": step, "split": "validation", **self.last_val})
        if self.primary:
            print(f"step {step}: validation accuracy {res['accuracy']:.4f} "
                  f"loss {res['loss']:.4f}", flush=True)
        return res["accuracy"]

    def evaluated_params(self):
        """The weights validation scores: the EMA where the run keeps one (as timm's
        `--model-ema` does), so the best checkpoint, early stopping and every reader of the
        checkpoint (`vit.checkpoints.orbax_io`) agree on one model."""
        state = self.program.state
        return state.params if state.ema is None else state.ema

    def save(self, step: int, val_acc: float | None) -> None:
        config = self.config
        self.ckpts.wait()  # the previous save's failure (a full disk) is reported as its own
        if self.primary:  # the recipe of the checkpoints: a run refused or crashed before its
            write_config(self.workdir, config)  # first save leaves config.json as it was
        meta = orbax_format.make_meta(
            model_config=self.model.config.to_dict(),
            preprocessing=self.model.preprocessing.to_dict(),
            labels=self.train_src.class_names, step=step,
            extra={"dataset": self.train_src.name, "val_accuracy": val_acc,
                   "config": config.to_dict()})
        state = self.program.state
        self.saver.save(step, params=state.params, opt_state=state.opt_state,
                        ema_params=state.ema, data_iter=iterator_states(self.iterator.get_state()),
                        train_state={"step": step, "seed": config.seed,
                                     "early_stop": self.early.state()},
                        meta=json.loads(json.dumps(meta, default=list)), val_accuracy=val_acc)


def _load_matplotlib() -> None:
    """matplotlib imported, and its font and text machinery warmed by a throwaway drawing of
    the curves' kinds (a log axis, a title, a legend), so the curves at the end draw fast."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    ax = fig.subplots()
    ax.plot([1, 2], [1, 2], "o-", label="a")
    ax.set(yscale="log", title="t", xlabel="x", ylabel="y")
    ax.legend(loc="upper right")
    fig.savefig(io.BytesIO(), format="png", dpi=20)


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the errors it was raised from (a data thread's MemoryError inside grain's)."""
    out = []
    while err is not None and err not in out:
        out.append(err)
        err = err.__cause__ or err.__context__
    return out
