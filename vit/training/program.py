"""The training program: a recipe becomes the mesh, the model, the optimiser, the placement,
the training state and the compiled step, here and nowhere else.

`vit train` (loop.py), `vit train --dry-run` (dry_run.py), the benchmarks and the tests'
builders all call `build_program`, so each of them compiles, runs and times the step users run.
What the step does with a batch is `step.py`'s; how the recipe shapes it is decided here, in
the open: the micro-batches a step runs (`micro_batches`: `train.accum_steps`, each split
further on one CPU device by `train.micro_tokens`), the loss (`train.loss`), the optimiser
(`optim`), the shardings (`parallel`) and the compile options of the model's dtype.
"""

from __future__ import annotations

import contextlib
import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from vit import device_mesh
from vit.errors import ConfigError
from vit.recipes.defaults import DEFAULTS
from vit.training import parallel
from vit.training.losses import DEFAULT as DEFAULT_LOSS
from vit.training.losses import TEXT_LOSSES, WithPatchLoss, get_loss
from vit.training.model import Model, build_model
from vit.training.optim import make_optimizer
from vit.training.placement import Placement, abstract
from vit.training.state import TrainState, new_state, restore_state
from vit.training.step import make_train_step

# The dtypes a CPU step splits for its cache: float16 has no CPU arithmetic for a split to keep
# in cache.
CACHE_SPLIT_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Resume:
    """Where a resumed run's state comes from: `step`'s checkpoint in `ckpts`, whose `meta`
    `vit.training.resume.check_resume` has found to fit."""

    ckpts: Any  # vit.training.checkpointing.TrainCheckpoints
    step: int
    meta: dict


def build_program(config, num_classes: int, *, init: str | None = None,
                  resume: Resume | None = None, mesh=None) -> TrainProgram:
    """`config` (a loaded recipe) as a `TrainProgram` for `num_classes` classes: its model
    fresh from the recipe's seed, from `init` (or the recipe's `init`), or rebuilt from
    `resume`'s checkpoint with the state restored; `mesh` (default: the recipe's `parallel`
    section) given where the caller needed it first."""
    tc = config.train
    if tc.batch_size % tc.accum_steps:
        raise ConfigError(f"train.batch_size={tc.batch_size} is not divisible by "
                          f"train.accum_steps={tc.accum_steps}")
    mesh = parallel.mesh_from_config(config) if mesh is None else mesh
    loss_name = tc.get("loss", DEFAULT_LOSS)
    loss_fn = get_loss(loss_name)
    model, shapes, make_params = build_model(config, num_classes, init=init,
                                             resume_meta=resume.meta if resume else None)
    check_patch_loss(config)
    if tc.get("patch_loss", 0.0) > 0:
        if not model.config.patch_classes:
            raise ConfigError(f"train.patch_loss={tc.patch_loss} trains a per-patch readout "
                              "the model lacks; set model.patch_classes (the dataset's "
                              "classes + 1 for nothing)")
        if config.input.get("flip") or config.input.get("inception_crop"):
            raise ConfigError("train.patch_loss reads where things lie in the image as the "
                              "data gives it; set input.flip=False and "
                              "input.inception_crop=False")
        loss_fn = WithPatchLoss(loss_fn, tc.patch_loss, model.config.grid)
    tx, lr_fn = make_optimizer(config.optim, shapes, model.config.depth, tc.steps)
    place = Placement.of(mesh, shapes, tx, parallel.rules_from_config(config))
    ema = tc.ema_decay > 0
    # A resumed state is read now: a checkpoint that does not fit is refused before anything
    # is written. A new one (the initialisers' compile and run, the optimiser state's) is
    # built in a thread while the caller opens the data and compiles the step: XLA compiles
    # on one core.
    state = (restore_state(resume.ckpts, resume.step, shapes, tx, place, ema=ema,
                           config=config, meta=resume.meta) if resume
             else _in_thread(lambda: new_state(make_params(), tx, place, ema=ema)))
    splits = micro_batches(config, model.config, mesh)
    step_fn = make_train_step(model.graphdef, tx, place, accum_steps=splits,
                              compute_dtype=model.config.dtype, ema_decay=tc.ema_decay,
                              loss_fn=loss_fn)
    # Jitted: the first log's learning rate is one compile, where the schedule's operations
    # run eagerly would compile a program each.
    return TrainProgram(config=config, mesh=mesh, model=model, tx=tx, lr_fn=jax.jit(lr_fn),
                        place=place, loss_name=loss_name, loss_fn=loss_fn,
                        micro_batches=splits, step_fn=step_fn, shapes=shapes, built=state)


def _in_thread(fn) -> Future:
    """`fn()` running in a thread from now on; the future holds its value, or its error."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="vit-state-ahead")
    future = pool.submit(fn)
    pool.shutdown(wait=False)  # the thread ends once `fn` has run
    return future


def check_patch_loss(config, where: str = "train") -> None:
    """Refuses `train.patch_loss` beside a loss on prompts: a step that answers prompts never
    reads the per-patch readout, so the weight would do nothing."""
    tc = config.train
    if tc.get("patch_loss", 0.0) > 0 and tc.get("loss", DEFAULT_LOSS) in TEXT_LOSSES:
        raise ConfigError(f"{where}.patch_loss={tc.patch_loss} with {where}.loss={tc.loss}: a "
                          "step on prompts never reads the per-patch readout; set patch_loss "
                          "where the ViT learns its labels (a stage without prompts)")


def micro_batches(config, model_config, mesh) -> int:
    """How many micro-batches a step of `config` runs, one after the other, for one update:
    `train.accum_steps`, times the pieces each is split into for the CPU's cache
    (`cache_splits` of `train.micro_tokens`) where the step runs on one CPU device in float32
    or bfloat16. Several devices, GPUs, TPUs and float16 take the micro-batches whole."""
    tc = config.train
    one_cpu = (mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"
               and model_config.dtype in CACHE_SPLIT_DTYPES)
    if not one_cpu:
        return tc.accum_steps
    min_tokens = tc.get("micro_tokens", DEFAULTS["train.micro_tokens"].default)
    return tc.accum_steps * cache_splits(tc.batch_size // tc.accum_steps,
                                         model_config.num_tokens, min_tokens)


def eval_pieces(config, model_config, mesh, eval_batch: int) -> int:
    """Into how many pieces a validation batch is split for the CPU's cache: as the training
    step's micro-batches (`train.micro_tokens`), on one CPU device in float32 or bfloat16."""
    if not (mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"
            and model_config.dtype in CACHE_SPLIT_DTYPES):
        return 1
    return cache_splits(eval_batch, model_config.num_tokens,
                        config.train.get("micro_tokens", DEFAULTS["train.micro_tokens"].default))


def cache_splits(examples: int, tokens_per_example: int, min_tokens: int | None) -> int:
    """Into how many equal pieces `examples` split (1: none): the most that keep `min_tokens`
    image tokens or more in each. The activations of a few thousand tokens are streamed through
    memory by every elementwise pass and copy, while a piece's stay in cache; a batch already
    near `min_tokens` gains nothing from halving. 0 or None: never split."""
    if not min_tokens or tokens_per_example <= 0:
        return 1
    return max((k for k in range(1, examples + 1)
                if examples % k == 0 and examples // k * tokens_per_example >= min_tokens),
               default=1)


@dataclass
class TrainProgram:
    """A recipe's training step with the state it advances. `program(batch)` runs one step
    (compiling it first, if `compile` was not called) and returns its metrics, device arrays
    not waited for; `state` then holds the new parameters, optimiser state, EMA and step."""

    config: Any
    mesh: Any
    model: Model  # its config, preprocessing and graphdef
    tx: Any  # optax.GradientTransformation
    lr_fn: Any  # step -> learning rate
    place: Placement
    loss_name: str
    loss_fn: Any
    micro_batches: int  # `micro_batches(...)`: one update from their mean gradient
    step_fn: Any  # the jitted step (`vit.training.step.make_train_step`)
    shapes: Any  # the params as shape/dtype placeholders: what the step compiles for
    built: TrainState | Future  # the state, or the future of one still being built
    compiled: Any = None  # the step compiled for the batch `compile` was given
    compile_s: float | None = None

    @property
    def state(self) -> TrainState:
        """The training state, once built (a new one is built in a thread: this waits)."""
        if isinstance(self.built, Future):
            self.built = self.built.result()
        return self.built

    def wait(self) -> None:
        """Returns once the state is built, whether or not that failed: a process should not
        exit inside XLA. The failure is raised where the state is asked for."""
        if isinstance(self.built, Future):
            with contextlib.suppress(BaseException):
                self.built.exception()

    @property
    def tokenizer(self):
        """The data pipeline's prompt tokenizer for a loss that reads text, else None."""
        return prompt_tokenizer(self.model.config, self.loss_name)

    def args(self, batch: dict) -> tuple:
        """The step's arguments for `batch` from the current state."""
        s = self.state
        return s.params, s.opt_state, s.ema, batch, self.config.seed, s.step

    def abstract_args(self, batch: dict) -> tuple:
        """The step's arguments for `batch`, the state's as shape/sharding placeholders: what
        it compiles for without waiting for the state to be built."""
        if not isinstance(self.built, Future):
            return self.args(batch)
        place, ema = self.place, self.config.train.ema_decay > 0
        params = abstract(self.shapes, place.params)
        opt_state = abstract(jax.eval_shape(self.tx.init, self.shapes), place.opt_state)
        return (params, opt_state, abstract(self.shapes, place.ema) if ema else None, batch,
                self.config.seed, 0)

    def compile(self, batch: dict):
        """Compiles the step for `batch`'s shapes (a global batch, as `put` makes it);
        returns the compiled step, its seconds in `compile_s`."""
        start = time.perf_counter()
        self.compiled = self.step_fn.lower(*self.abstract_args(batch)).compile()
        self.compile_s = time.perf_counter() - start
        return self.compiled

    def __call__(self, batch: dict) -> dict:
        """One training step on `batch`: advances `state`; returns the step's metrics."""
        if self.compiled is None:
            self.compile(batch)
        state = self.state
        state.params, state.opt_state, state.ema, metrics = self.compiled(*self.args(batch))
        state.step += 1
        return metrics

    def put(self, host_batch: dict) -> dict:
        """This process's numpy batch as the step's global arrays, split over the mesh."""
        return device_mesh.to_global(host_batch, self.mesh)

    def batch(self, images: np.ndarray, labels: np.ndarray) -> dict:
        """A host batch, as the data pipeline yields one (`put` it), of NHWC float images
        (already normalised) and integer labels, with the targets the pipeline makes of them
        (one-hot, the recipe's label smoothing)."""
        from vit.data.transforms import one_hot

        if self.loss_name in TEXT_LOSSES:
            raise ConfigError(f"train.loss={self.loss_name}: batches with prompts come from the "
                              "data pipeline, not from images and labels")
        labels = np.asarray(labels).astype(np.int32)
        return {"image": np.asarray(images, np.float32), "label": labels,
                "target": one_hot(labels, self.model.config.num_classes,
                                  self.config.input.get("label_smoothing", 0.0))}

    def variant(self, **options) -> TrainProgram:
        """This program with its step built again with `options` of `make_train_step` over
        the recipe's (`accum_steps=1`: the batch whole, as the dry run counts its FLOPs;
        `trainable=`: a mask). It shares this program's state: run one of the two."""
        step_fn = make_train_step(self.model.graphdef, self.tx, self.place, **{
            "accum_steps": self.micro_batches, "compute_dtype": self.model.config.dtype,
            "ema_decay": self.config.train.ema_decay, "loss_fn": self.loss_fn, **options})
        return replace(self, step_fn=step_fn, compiled=None, compile_s=None,
                       micro_batches=options.get("accum_steps", self.micro_batches))


def prompt_tokenizer(model_config, loss_name: str):
    """The data pipeline's prompt tokenizer for a loss that reads text, else None."""
    from vit.models.text import tokenize

    if loss_name not in TEXT_LOSSES:
        return None
    if model_config.text is None:
        raise ConfigError(f"train.loss={loss_name!r} reads prompts, but the model has no text "
                          "path; set model.text (see configs/promptshapes.py)")
    return functools.partial(tokenize, max_len=model_config.text.max_len)
