"""`train(config, workdir)`: build or resume, step, evaluate, checkpoint, plot.

Running it again on the same workdir resumes from the latest complete checkpoint: parameters,
optimiser state, EMA, data-iterator position and step all come back, and randomness is a pure
function of (seed, step), so the resumed run's losses equal an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit.checkpoints import layout
from vit.data import Augment, eval_batches, open_source, train_iterator
from vit.errors import ConfigError, VitError
from vit.models.config import ViTConfig, get_config
from vit.models.vit import VisionTransformer
from vit.preprocess import Preprocessing
from vit.train import parallel
from vit.train.checkpointing import TrainCheckpoints
from vit.train.evaluate import evaluate, make_logits_fn
from vit.train.metrics import MetricsLog, plot_curves
from vit.train.optim import make_optimizer

# Model fields a fine-tuning config may change on a pretrained architecture.
TRAINING_FIELDS = ("dropout", "attention_dropout", "drop_path", "dtype", "remat",
                   "attention_impl")


class Diverged(VitError):
    """The loss became NaN or infinite."""


def model_fields(config) -> dict:
    return {k: v for k, v in config.model.items() if k != "name"}


def augment_of(config) -> Augment:
    fields = set(Augment.__dataclass_fields__)
    return Augment(**{k: (tuple(v) if isinstance(v, list) else v)
                      for k, v in config.input.items() if k in fields})


def preprocessing_of(config) -> Preprocessing:
    inp = config.input
    return Preprocessing(size=(inp.image_size, inp.image_size), resample=inp.resample,
                         crop_pct=inp.crop_pct, mean=tuple(inp.mean or (0.5,) * 3),
                         std=tuple(inp.std or (0.5,) * 3))


def fresh_params(model_config: ViTConfig, seed: int):
    model = VisionTransformer(model_config, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def abstract_params(model_config: ViTConfig):
    model = nnx.eval_shape(lambda: VisionTransformer(model_config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def start_from_init(init: str, config, num_classes: int):
    """(model config, params, preprocessing) from a pretrained checkpoint, adapted."""
    from vit.checkpoints import load_checkpoint
    from vit.train.init import adapt_params

    size = config.input.image_size
    loaded = load_checkpoint(init, image_size=size)
    overrides = {k: v for k, v in model_fields(config).items() if k in TRAINING_FIELDS}
    model_config = loaded.config.replace(num_classes=num_classes, image_size=(size, size),
                                         **overrides)
    _, template = abstract_params(model_config)
    params = adapt_params(loaded.params, loaded.config, model_config, dst_template=template)
    pre = loaded.preprocessing.with_size(size)
    if config.input.mean is not None:  # an explicit normalisation in the config wins
        pre = Preprocessing(**{**pre.to_dict(), "mean": tuple(config.input.mean),
                               "std": tuple(config.input.std)})
    print(f"initialised from {init} ({loaded.source}); head "
          f"{'kept' if loaded.config.num_classes == num_classes else 'replaced (zeros)'}")
    return model_config, jax.tree.map(jnp.asarray, params), pre


class StopSignals:
    """SIGINT/SIGTERM ask the loop to save and stop; a second SIGINT interrupts at once."""

    def __init__(self):
        self.received: str | None = None

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self):
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def make_train_step(graphdef, tx, mesh, *, accum_steps: int, ema_decay: float):
    rep, sharded = parallel.replicated(mesh), parallel.batch_sharded(mesh)

    def loss_fn(params, images, targets, labels, key):
        logits = nnx.merge(graphdef, params)(images, train=True, rng=key)
        loss = optax.softmax_cross_entropy(logits, targets).mean()
        return loss, (logits.argmax(-1) == labels).mean()

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step_fn(params, opt_state, ema, batch, seed, step):
        key = jax.random.fold_in(jax.random.key(seed), step)
        if accum_steps == 1:
            (loss, acc), grads = grad_fn(params, batch["image"], batch["target"],
                                         batch["label"], key)
        else:  # gradient accumulation: micro-batches in sequence, one update
            micro = jax.tree.map(
                lambda x: x.reshape((accum_steps, -1) + x.shape[1:]), batch)

            def body(carry, xs):
                i, mb = xs
                (loss, acc), grads = grad_fn(params, mb["image"], mb["target"], mb["label"],
                                             jax.random.fold_in(key, i))
                return jax.tree.map(jnp.add, carry, (loss, acc, grads)), None

            zeros = (0.0, 0.0, jax.tree.map(jnp.zeros_like, params))
            (loss, acc, grads), _ = jax.lax.scan(body, zeros,
                                                 (jnp.arange(accum_steps), micro))
            loss, acc, grads = jax.tree.map(lambda x: x / accum_steps, (loss, acc, grads))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if ema is not None:
            # EMA with warm-up (timm): early steps average over fewer updates.
            decay = jnp.minimum(ema_decay, (1.0 + step) / (10.0 + step))
            ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        # An update can overflow the weights while this step's loss is still finite: check
        # both, so a checkpoint never holds non-finite weights.
        finite = jnp.all(jnp.array([jnp.isfinite(x).all() for x in jax.tree.leaves(params)]))
        return params, opt_state, ema, {"loss": loss, "accuracy": acc, "finite": finite}

    return jax.jit(step_fn, in_shardings=(rep, rep, rep, sharded, None, None),
                   out_shardings=(rep, rep, rep, rep), donate_argnums=(0, 1, 2))


def train(config, workdir: str | Path, *, init: str | None = None,
          stop_after: int | None = None) -> dict:
    """Trains (or resumes) into `workdir`; returns the last metrics.

    `init` is a pretrained checkpoint (any format `vit.checkpoints` reads). `stop_after`
    runs at most that many steps in this call, then saves, as an interruption would.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json(indent=2))
    tc, steps = config.train, config.train.steps
    mesh = parallel.make_mesh(tc.num_devices)
    host_batch = parallel.host_batch_size(tc.batch_size, mesh)
    if tc.batch_size % tc.accum_steps:
        raise ConfigError(f"train.batch_size={tc.batch_size} is not divisible by "
                          f"train.accum_steps={tc.accum_steps}")
    data = config.data
    train_src = open_source(data.name, data.train_split, data_dir=data.data_dir,
                            strict=data.strict)
    val_src = (open_source(data.name, data.val_split, data_dir=data.data_dir, strict=data.strict)
               if data.val_split else None)
    class_names = train_src.class_names
    num_classes = len(class_names)

    ckpts = TrainCheckpoints(workdir, keep=tc.keep_checkpoints)
    start = ckpts.latest_step() or 0
    if start:
        meta = ckpts.manager.restore(start, args=_meta_only())[layout.META]
        model_config = ViTConfig(**meta["model_config"])
        pre = Preprocessing.from_dict(meta["preprocessing"])
        graphdef, params = abstract_params(model_config)
    elif init or config.init:
        model_config, params, pre = start_from_init(init or config.init, config, num_classes)
        graphdef, _ = abstract_params(model_config)
    else:
        model_config = get_config(config.model.name, num_classes=num_classes,
                                  image_size=config.input.image_size, **model_fields(config))
        pre = preprocessing_of(config)
        graphdef, params = fresh_params(model_config, config.seed)

    tx, lr_fn = make_optimizer(config.optim, params, model_config.depth, steps)
    rep = parallel.replicated(mesh)
    use_ema = tc.ema_decay > 0
    if start:
        abstract = lambda tree: jax.tree.map(  # noqa: E731
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)
        opt_shape = jax.eval_shape(tx.init, params)
        restored = ckpts.restore(start, params=abstract(params), opt_state=abstract(opt_shape),
                                 ema_params=abstract(params) if use_ema else None)
        params, opt_state = restored[layout.PARAMS], restored[layout.OPT_STATE]
        ema = restored.get(layout.EMA_PARAMS)
        iterator_state = restored[layout.DATA_ITER]
        print(f"resumed from step {start} ({ckpts.step_dir(start)})")
    else:
        params = jax.device_put(params, rep)
        opt_state = jax.device_put(tx.init(params), rep)
        ema = jax.tree.map(jnp.copy, params) if use_ema else None
        iterator_state = None

    iterator = train_iterator(train_src, pre, augment_of(config), batch_size=host_batch,
                              seed=config.seed, num_classes=num_classes,
                              shard_index=jax.process_index(),
                              shard_count=jax.process_count(), num_threads=data.num_threads)
    if iterator_state is not None:
        iterator.set_state(iterator_state)
    step_fn = make_train_step(graphdef, tx, mesh, accum_steps=tc.accum_steps,
                              ema_decay=tc.ema_decay)
    logits_fn = make_logits_fn(graphdef, mesh)
    log = MetricsLog(workdir, start)
    best = ckpts.read_best() or {}
    best_acc = best.get("val_accuracy", -1.0) if start else -1.0
    pending_best: tuple[int, float] | None = None

    def validate(step: int) -> float:
        batches = eval_batches(val_src, pre, batch_size=tc.eval_batch_size,
                               shard_index=jax.process_index(),
                               shard_count=jax.process_count(), num_threads=data.num_threads)
        res = evaluate(logits_fn, params, batches, num_classes, mesh)
        log.write({"step": step, "split": "validation", "loss": res["loss"],
                   "accuracy": res["accuracy"], "top5_accuracy": res["top5_accuracy"]})
        print(f"step {step}: validation accuracy {res['accuracy']:.4f} "
              f"loss {res['loss']:.4f}", flush=True)
        return res["accuracy"]

    def save(step: int, val_acc: float | None) -> None:
        nonlocal best_acc, pending_best
        ckpts.wait()  # the previous save is complete: its best.json entry may now point at it
        if pending_best:
            ckpts.write_best(*pending_best)
            pending_best = None
        meta = layout.make_meta(
            model_config=model_config.to_dict(), preprocessing=pre.to_dict(),
            labels=class_names, step=step,
            extra={"dataset": train_src.name, "val_accuracy": val_acc, "config": config.to_dict()})
        ckpts.save(step, params=params, opt_state=opt_state, ema_params=ema,
                   data_iter=iterator.get_state(), train_state={"step": step, "seed": config.seed},
                   meta=json.loads(json.dumps(meta, default=list)), val_accuracy=val_acc)
        # Ties go to the later step, as orbax's BestN keeps the later of equal checkpoints.
        if val_acc is not None and val_acc >= best_acc:
            best_acc, pending_best = val_acc, (step, val_acc)

    last = {}
    end = steps if stop_after is None else min(steps, start + stop_after)
    sums, count, t_log = {"loss": 0.0, "accuracy": 0.0}, 0, time.time()
    bar = _progress(start, steps)
    stop = StopSignals()
    with stop.installed():
        step = start
        while step < end:
            batch = parallel.to_global(next(iterator), mesh)
            params, opt_state, ema, metrics = step_fn(params, opt_state, ema, batch,
                                                      config.seed, step)
            loss = float(metrics["loss"])
            if not (math.isfinite(loss) and bool(metrics["finite"])):
                ckpts.wait()
                kept = ckpts.latest_step()
                what = f"loss became {loss}" if not math.isfinite(loss) else \
                    "the weights became non-finite"
                raise Diverged(
                    f"{what} at step {step + 1}; stopped. The last good checkpoint "
                    f"is {ckpts.step_dir(kept) if kept else 'none'}; lower optim.lr or raise "
                    "optim.warmup_steps, then run again (it resumes from there)")
            step += 1
            sums["loss"] += loss
            sums["accuracy"] += float(metrics["accuracy"])
            count += 1
            bar.update(1)
            if step % tc.log_every == 0 or step == end:
                now = time.time()
                last = {"step": step, "split": "train", "loss": sums["loss"] / count,
                        "accuracy": sums["accuracy"] / count, "lr": float(lr_fn(step - 1)),
                        "images_per_s": count * tc.batch_size / (now - t_log)}
                log.write(last)
                bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['accuracy']:.3f}")
                if not bar.visible:
                    print(f"step {step}/{steps}: loss {last['loss']:.4f} "
                          f"accuracy {last['accuracy']:.3f} lr {last['lr']:.2e} "
                          f"{last['images_per_s']:.0f} img/s", flush=True)
                sums, count, t_log = {"loss": 0.0, "accuracy": 0.0}, 0, time.time()
            val_acc, t_pause = None, time.time()
            if val_src is not None and (step % tc.eval_every == 0 or step == steps):
                val_acc = validate(step)
            if step % tc.checkpoint_every == 0 or step == end or stop.received:
                save(step, val_acc)
            t_log += time.time() - t_pause  # images/s counts training steps only
            if stop.received:
                print(f"{stop.received}: saved step {step} to {ckpts.step_dir(step)}; run the "
                      "same command to resume", file=sys.stderr)
                break
    bar.close()
    ckpts.wait()
    if pending_best:
        ckpts.write_best(*pending_best)
    ckpts.close()
    if (workdir / "metrics.jsonl").exists():
        plot_curves(workdir / "metrics.jsonl", workdir / "curves.png")
    if step >= steps:
        print(f"done: {steps} steps; checkpoints in {ckpts.directory}, metrics in "
              f"{workdir / 'metrics.jsonl'}, curves in {workdir / 'curves.png'}")
    return {**last, "stopped_by": stop.received, "best_val_accuracy": best_acc}


def _meta_only():
    import orbax.checkpoint as ocp

    return ocp.args.Composite(**{layout.META: ocp.args.JsonRestore()})


class _NoBar:
    visible = False

    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(start: int, total: int):
    """A tqdm bar on a terminal; plain log lines otherwise."""
    if not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
    bar.visible = True
    return bar
