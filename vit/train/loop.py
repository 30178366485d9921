"""`train(config, workdir)`: build or resume, step, evaluate, checkpoint, plot.

Running it again on the same workdir resumes from the latest complete checkpoint: parameters,
optimiser state, EMA, data-iterator position and step all come back, and randomness is a pure
function of (seed, step), so the resumed run's losses equal an uninterrupted run's.

This file is the orchestration only, top to bottom; each concern lives in its own module:
`state` (build or resume), `step` (the jitted step) with `losses`, `placement` (shardings),
`checkpointing` (storage and save policy), `signals`, `progress` and `metrics`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import jax

from vit import device_mesh
from vit.checkpoints import orbax_format
from vit.data import open_source, train_iterator
from vit.errors import ConfigError
from vit.inference.evaluate import evaluate_task, make_logits_fn, sharded_eval_batches
from vit.models.text import tokenize
from vit.train import parallel
from vit.train.checkpointing import METRIC, CheckpointPolicy, TrainCheckpoints
from vit.train.losses import DEFAULT as DEFAULT_LOSS
from vit.train.losses import TEXT_LOSSES, get_loss
from vit.train.metrics import MetricsLog, TrainMeter, plot_curves
from vit.train.optim import make_optimizer
from vit.train.placement import Placement
from vit.train.progress import progress
from vit.train.signals import StopSignals
from vit.train.state import (
    augment_of,
    build_model,
    check_resume,
    iterator_states,
    new_state,
    restore_state,
)
from vit.train.step import make_train_step


def train(config, workdir: str | Path, *, init: str | None = None,
          stop_after: int | None = None) -> dict:
    """Trains (or resumes) into `workdir`; returns the last metrics.

    `init` is a pretrained checkpoint (any format `vit.checkpoints` reads). `stop_after`
    runs at most that many steps in this call, then saves, as an interruption would.
    Raises `vit.train.checkpointing.Diverged` if the loss or the weights become non-finite.
    A recipe with `stages` is run by `vit.train.stages.train_stages`, one call per stage.
    """
    if "stages" in config:
        raise ConfigError("a staged recipe runs through vit.train.stages.train_stages")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpts = TrainCheckpoints(workdir, keep=config.train.keep_checkpoints)
    try:
        return _train(config, workdir, ckpts, init=init, stop_after=stop_after)
    except Exception:
        ckpts.close_quietly()  # before the caller may remove a new workdir under orbax's thread
        raise


def _train(config, workdir: Path, ckpts: TrainCheckpoints, *, init: str | None,
           stop_after: int | None) -> dict:
    primary = parallel.is_primary()  # process 0 alone writes files and prints
    tc, steps = config.train, config.train.steps
    mesh = parallel.mesh_from_config(config)
    host_batch = device_mesh.host_batch_size(tc.batch_size, mesh)
    eval_host_batch = device_mesh.eval_host_batch_size(tc.eval_batch_size, mesh)
    if tc.batch_size % tc.accum_steps:
        raise ConfigError(f"train.batch_size={tc.batch_size} is not divisible by "
                          f"train.accum_steps={tc.accum_steps}")
    loss_name = tc.get("loss", DEFAULT_LOSS)
    loss_fn = get_loss(loss_name)
    train_src, val_src = _open_sources(config, loss_name, primary)
    num_classes = len(train_src.class_names)

    # Model and train state: from the latest checkpoint, else from --init, else fresh. A
    # resume that does not fit the checkpoint is refused here, before anything is written.
    start = ckpts.latest_step() or 0
    resume_meta = (check_resume(config, ckpts, start, num_classes, config.data.name) if start
                   else None)
    if start >= steps:  # finished earlier: nothing to train, nothing rewritten
        ckpts.close()
        if primary:
            print(f"done: {steps} steps, all saved earlier in {ckpts.directory}; raise "
                  "train.steps to train further")
        return {"stopped_by": None,
                "best_val_accuracy": (ckpts.read_best() or {}).get(METRIC, -1.0)}
    model, params = build_model(config, num_classes, resume_meta=resume_meta,
                                init=init or config.init)
    tokenizer = prompt_tokenizer(model.config, loss_name)
    tx, lr_fn = make_optimizer(config.optim, params, model.config.depth, steps)
    place = Placement.of(mesh, params, tx, parallel.rules_from_config(config))
    use_ema = tc.ema_decay > 0
    state = (restore_state(ckpts, start, params, tx, place, ema=use_ema, config=config,
                           meta=resume_meta) if start
             else new_state(params, tx, place, ema=use_ema))
    iterator = train_iterator(train_src, model.preprocessing, augment_of(config),
                              batch_size=host_batch, seed=config.seed, num_classes=num_classes,
                              shard_index=jax.process_index(),
                              shard_count=jax.process_count(),
                              num_threads=config.data.num_threads, tokenize=tokenizer)
    if state.iterator_state is not None:
        iterator.set_state(state.iterator_state)
    step_fn = make_train_step(model.graphdef, tx, place, accum_steps=tc.accum_steps,
                              ema_decay=tc.ema_decay, loss_fn=loss_fn)
    run = _Run(config, workdir, ckpts, state, model=model, iterator=iterator,
               sources=(train_src, val_src), tokenizer=tokenizer, loss_name=loss_name,
               logits_fn=make_logits_fn(model.graphdef, mesh, place.params), mesh=mesh,
               eval_batch_size=eval_host_batch, start=start, primary=primary)
    end = steps if stop_after is None else min(steps, start + stop_after)
    last, step, stopped_by = run.steps(step_fn, lr_fn, start, end)
    if primary and (workdir / "metrics.jsonl").exists():
        plot_curves(workdir / "metrics.jsonl", workdir / "curves.png")
    if step >= steps and primary:
        print(f"done: {steps} steps; checkpoints in {ckpts.directory}, metrics in "
              f"{workdir / 'metrics.jsonl'}, curves in {workdir / 'curves.png'}")
    return {**last, "stopped_by": stopped_by, "best_val_accuracy": run.saver.best_accuracy}


def _open_sources(config, loss_name: str, primary: bool):
    """`(train, validation or None)`: the recipe's splits, refused when the loss cannot train
    on them."""
    data, batch_size = config.data, config.train.batch_size
    train_src = open_source(data.name, data.train_split, data_dir=data.data_dir,
                            strict=data.strict)
    val_src = (open_source(data.name, data.val_split, data_dir=data.data_dir, strict=data.strict)
               if data.val_split else None)
    class_names = train_src.class_names
    if getattr(train_src, "multi_label", False) and loss_name == "softmax_xent":
        raise ConfigError(f"{data.name} has multi-hot labels; set train.loss=sigmoid_xent (or "
                          "prompt_xent to train a text model on its prompts)")
    if len(class_names) < 2 and loss_name == "softmax_xent":  # the loss is 0 from the first step
        raise ConfigError(f"{data.name} has one class ({', '.join(class_names)}); a classifier "
                          "needs at least two: add a folder per class")
    if primary and batch_size > len(train_src):
        print(f"note: train.batch_size={batch_size} is more than the {len(train_src)} "
              f"training images of {data.name}; each batch repeats images", file=sys.stderr)
    return train_src, val_src


class _Run:
    """The steps of one `train` call: the state they advance, and the validation, log and
    checkpoints they feed. A step's metrics stay on the device until a log or a save needs
    them, so the host never waits on a step in between."""

    def __init__(self, config, workdir: Path, ckpts: TrainCheckpoints, state, *, model,
                 iterator, sources, tokenizer, loss_name: str, logits_fn, mesh,
                 eval_batch_size: int, start: int, primary: bool):
        self.config, self.workdir, self.ckpts, self.model = config, workdir, ckpts, model
        self.params, self.opt_state, self.ema = state.params, state.opt_state, state.ema
        self.iterator, (self.train_src, self.val_src) = iterator, sources
        self.tokenizer, self.loss_name, self.logits_fn = tokenizer, loss_name, logits_fn
        self.mesh, self.eval_batch_size, self.primary = mesh, eval_batch_size, primary
        self.log = MetricsLog(workdir, start, enabled=primary)
        self.saver = CheckpointPolicy(ckpts, every=config.train.checkpoint_every,
                                      resumed=bool(start))
        self.meter, self.pending = TrainMeter(), []

    def steps(self, step_fn, lr_fn, start: int, end: int) -> tuple[dict, int, str | None]:
        """Trains from `start` to `end`, validating and saving when due; returns the last
        train metrics, the step reached and the signal that stopped it (or None)."""
        tc, steps = self.config.train, self.config.train.steps
        last, bar, stop = {}, progress(start, steps, enabled=self.primary), StopSignals()
        with stop.installed():
            step = start
            while step < end:
                batch = device_mesh.to_global(next(self.iterator), self.mesh)
                self.params, self.opt_state, self.ema, metrics = step_fn(
                    self.params, self.opt_state, self.ema, batch, self.config.seed, step)
                step += 1
                self.pending.append((step, metrics))
                bar.update(1)
                stopping = stop.check(step)
                if step % tc.log_every == 0 or step == end or stopping:
                    self._drain()
                    means, images_per_s = self.meter.flush(tc.batch_size)
                    last = {"step": step, "split": "train", **means,
                            "lr": float(lr_fn(step - 1)), "images_per_s": images_per_s}
                    self.log.write(last)
                    bar.report(last)
                validating = self.val_src is not None and (step % tc.eval_every == 0
                                                           or step == steps)
                saving = self.saver.due(step, end, stopping=bool(stopping))
                if validating or saving:
                    self._drain()  # waits for the step (training time); never saves non-finite
                with self.meter.paused():  # images/s counts training steps only
                    val_acc = self.validate(step) if validating else None
                    if saving:
                        self.save(step, val_acc)
                if stopping:  # every process says so: each one's log shows where it stopped
                    who = f"process {jax.process_index()} " if jax.process_count() > 1 else ""
                    print(f"{stopping}: {who}saved step {step} to {self.ckpts.step_dir(step)}; "
                          "run the same command to resume", file=sys.stderr, flush=True)
                    break
        bar.close()
        self.saver.close()
        return last, step, stop.received

    def _drain(self) -> None:
        """Reads the pending steps' metrics: raises `Diverged` at the first non-finite one."""
        for s, metrics in jax.device_get(self.pending):  # one transfer for all of them
            self.saver.check_finite(s, float(metrics["loss"]), bool(metrics["finite"]))
            self.meter.add({k: float(v) for k, v in metrics.items() if k != "finite"})
        self.pending.clear()

    def validate(self, step: int) -> float:
        batches = sharded_eval_batches(self.val_src, self.model.preprocessing,
                                       batch_size=self.eval_batch_size,
                                       num_threads=self.config.data.num_threads,
                                       tokenize=self.tokenizer)
        res = evaluate_task(self.loss_name, self.logits_fn, self.params, batches,
                            len(self.train_src.class_names), self.mesh)
        self.log.write({"step": step, "split": "validation", "loss": res["loss"],
                        "accuracy": res["accuracy"],
                        **{k: res[k] for k in ("top5_accuracy", "label_accuracy") if k in res}})
        if self.primary:
            print(f"step {step}: validation accuracy {res['accuracy']:.4f} "
                  f"loss {res['loss']:.4f}", flush=True)
        return res["accuracy"]

    def save(self, step: int, val_acc: float | None) -> None:
        config = self.config
        if self.primary:  # the recipe of the checkpoints: a run refused or crashed before its
            write_config(self.workdir, config)  # first save leaves config.json as it was
        meta = orbax_format.make_meta(
            model_config=self.model.config.to_dict(),
            preprocessing=self.model.preprocessing.to_dict(),
            labels=self.train_src.class_names, step=step,
            extra={"dataset": self.train_src.name, "val_accuracy": val_acc,
                   "config": config.to_dict()})
        self.saver.save(step, params=self.params, opt_state=self.opt_state,
                        ema_params=self.ema, data_iter=iterator_states(self.iterator.get_state()),
                        train_state={"step": step, "seed": config.seed},
                        meta=json.loads(json.dumps(meta, default=list)), val_accuracy=val_acc)


def write_config(workdir: Path, config, name: str = "config.json") -> None:
    """`WORKDIR/config.json`, the resolved recipe (`vit eval --workdir` reads it), replaced
    atomically."""
    path = workdir / name
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(config.to_json(indent=2))
    os.replace(tmp, path)


def prompt_tokenizer(model_config, loss_name: str):
    """The data pipeline's prompt tokenizer for a loss that reads text, else None."""
    if loss_name not in TEXT_LOSSES:
        return None
    if model_config.text is None:
        raise ConfigError(f"train.loss={loss_name!r} reads prompts, but the model has no text "
                          "path; set model.text (see configs/promptshapes.py)")
    return functools.partial(tokenize, max_len=model_config.text.max_len)
