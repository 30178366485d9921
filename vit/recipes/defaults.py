"""Every recipe key, its default and what it means: the one list the loader, its checks and
`--set` read. A recipe (`configs/*.py`) sets only what differs from these.

The defaults are a fine-tuning run in the style of big_vision's transfer recipe: SGD with
momentum, a cosine schedule, inception crop and flips at 224 px, from `--init CHECKPOINT`.
A number whose sense has limits states them (`Range`), a name its choices; `load_config`
refuses a value outside them, naming the key, so nothing trains to nonsense or fails later.
The `model` section holds `name` and any `ViTConfig` field (vit/models/config.py, whose own
defaults apply to the fields a recipe leaves out); `stages` (vit/training/stages.py) has no
defaults. Standard library only.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """The values a number may take: finite, between `low` and `high` (None: no bound), each
    bound included unless open; `whole` for counts."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False

    def __contains__(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not math.isfinite(value) or (self.whole and value != int(value)):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open
                                     else value <= self.high)

    def __str__(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        if self.low is not None and self.high is not None:
            if self.whole:
                return f"{kind} from {self.low} to {self.high}"
            return (f"in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{kind} {'above' if self.low_open else 'of'} {self.low}" + (
                "" if self.low_open else " or more")
        return kind


AT_LEAST_0 = Range(0)
UNIT = Range(0, 1, high_open=True)  # [0, 1): decays and momenta


@dataclass(frozen=True)
class Key:
    default: Any
    meaning: str
    # What `--set` expects where the default does not say (None, a pair, a list of pairs);
    # otherwise the default's own type.
    type: Any = None
    range: Range | None = None  # a number's limits
    choices: tuple[str, ...] | None = None  # a name's choices


DEFAULTS: dict[str, Key] = {
    "seed": Key(0, "seeds the initial weights, dropout and the data order",
                # Traced as an int32 by the training step.
                range=Range(0, 2**31 - 1, whole=True)),
    "init": Key("", "a pretrained checkpoint to start from ('' for none; --init wins)"),

    "data.name": Key("", "the dataset: digits, promptshapes, fashion_mnist, mnist_5k, "
                         "'tfds:NAME' or a folder of class folders (required)"),
    "data.data_dir": Key(None, "where TFDS's prepared sets, or fashion_mnist's or mnist_5k's "
                               "files, are (None: the default place)",
                         str | None),
    "data.train_split": Key("train", "the split trained on (TFDS slicing such as "
                                     "'train[:90%]' works)"),
    "data.val_split": Key("validation", "the split validated on, which picks the best "
                                        "checkpoint ('' for none)", str | None),
    "data.test_split": Key("test", "the split `vit eval --workdir` reports"),
    "data.heldout_split": Key(None, "a further split `vit eval --workdir` reports, e.g. "
                                    "prompts about unseen pairs", str | None),
    "data.labels": Key(None, "promptshapes only: 'pairs' (each colour x shape drawn; None) or "
                             "'attributes' (colours and shapes apart)", str | None),
    "data.strict": Key(False, "an unreadable image stops the run (else it is skipped with a "
                              "warning)"),
    "data.num_threads": Key(4, "threads decoding images (0: the main thread)"),

    "model.name": Key("B/16", "the variant: 'B/16', 'Ti/16', 'vit_b16', ...; further keys "
                              "are ViTConfig fields"),

    "input.image_size": Key(224, "the side of the square image the model sees, in pixels"),
    "input.resample": Key("bilinear", "the resize filter"),
    "input.crop_pct": Key(None, "evaluation's centre crop (None: resize, no crop)",
                          float | None),
    "input.mean": Key(None, "per-channel normalisation mean (None: the checkpoint's, else "
                            "0.5 for [-1, 1])", list[float] | None),
    "input.std": Key(None, "per-channel normalisation std (None as for mean)",
                     list[float] | None),
    "input.inception_crop": Key(True, "train on random-resized crops (else the evaluation "
                                      "resize)"),
    "input.crop_area": Key((0.05, 1.0), "the area range of the inception crop",
                           tuple[float, float]),
    "input.flip": Key(True, "random horizontal flips"),
    "input.shift": Key(0.0, "random shifts of up to this many pixels (for tiny images)",
                       range=AT_LEAST_0),
    "input.rotate": Key(0.0, "random rotations of up to this many degrees", range=AT_LEAST_0),
    "input.scale": Key(0.0, "random zoom over this log-scale range", range=AT_LEAST_0),
    "input.mixup": Key(0.0, "mixup's Beta alpha (0: off)", range=AT_LEAST_0),
    "input.cutmix": Key(0.0, "cutmix's Beta alpha (0: off)", range=AT_LEAST_0),
    "input.label_smoothing": Key(0.0, "label smoothing (0.1 is usual)", range=UNIT),
    "input.randaugment": Key("", "RandAugment as 'N,M': N random operations of magnitude M "
                                 "(0 to 30) on each training image ('' for none)"),
    "input.random_erasing": Key(0.0, "the chance of erasing a random box of each training "
                                     "image (0: off; 0.25 is usual)", range=Range(0, 1)),
    "input.scene_jitter": Key(False, "fashion_scenes: each photo moved inside its cell and "
                                     "mirrored at random, every epoch"),

    "optim.name": Key("sgd", "sgd (with momentum) or adamw", choices=("sgd", "adamw")),
    "optim.lr": Key(0.01, "the peak learning rate", range=AT_LEAST_0),
    "optim.warmup_steps": Key(100, "steps of linear warmup from 0 to lr",
                              range=Range(0, whole=True)),
    "optim.schedule": Key("cosine", "the decay after warmup: cosine, linear or constant",
                          choices=("cosine", "linear", "constant")),
    "optim.weight_decay": Key(0.0, "adamw's decoupled weight decay", range=AT_LEAST_0),
    "optim.b1": Key(0.9, "adamw's first-moment decay", range=UNIT),
    "optim.b2": Key(0.999, "adamw's second-moment decay", range=UNIT),
    "optim.momentum": Key(0.9, "sgd's momentum", range=UNIT),
    "optim.clip_norm": Key(1.0, "clip gradients to this global norm (0: no clipping)",
                           range=AT_LEAST_0),
    "optim.layer_decay": Key(1.0, "layer-wise lr decay: block i gets lr * decay**(depth - i)",
                             range=Range(0, 1, low_open=True)),
    "optim.trainable": Key(".*", "regex of the parameter paths that train; others are frozen"),
    "optim.lr_mults": Key([], "[[regex, factor], ...]: the matching parameters' lr times "
                              "factor", list),
    "optim.no_decay": Key("", "regex of parameter paths spared weight decay ('' for none)"),

    "train.steps": Key(1000, "optimiser steps in all"),
    "train.batch_size": Key(64, "images per step, over all devices and hosts"),
    "train.accum_steps": Key(1, "micro-batches a step's batch is split into"),
    "train.micro_tokens": Key(1536, "one CPU device: a float32 or bfloat16 micro-batch runs in "
                                    "pieces of at least this many image tokens (0: whole)",
                              range=Range(0, whole=True)),
    "train.eval_every": Key(200, "validate every this many steps"),
    "train.checkpoint_every": Key(200, "save every this many steps"),
    "train.keep_checkpoints": Key(2, "the latest checkpoints kept (the best one is kept too)"),
    "train.log_every": Key(50, "write training metrics every this many steps"),
    "train.early_stop_patience": Key(0, "stop after this many validations without a better "
                                        "validation metric (0: never)",
                                     range=Range(0, whole=True)),
    "train.tensorboard": Key(True, "also write TensorBoard event files under WORKDIR/tb"),
    "train.ema_decay": Key(0.0, "decay of an exponential moving average of the weights (0: "
                                "none)", range=UNIT),
    "train.eval_batch_size": Key(128, "images per validation batch, over all devices"),
    "train.loss": Key("softmax_xent", "softmax_xent (one label), sigmoid_xent (multi-hot) or "
                                      "prompt_xent (answers to prompts)",
                      choices=("softmax_xent", "sigmoid_xent", "prompt_xent")),
    "train.patch_loss": Key(0.0, "weight of the per-patch readout's loss (model.patch_classes) "
                                 "against what lies on each patch",
                            range=Range(0)),

    "parallel.data": Key(-1, "the mesh's data axis (-1: the devices fsdp leaves)"),
    "parallel.fsdp": Key(1, "the mesh's fsdp axis: > 1 shards parameters and optimiser state"),
    "parallel.rules": Key(((".*", "auto"),), "(regex, spec) pairs sharding parameters: a "
                                             "PartitionSpec, 'auto' or 'replicated'",
                          tuple[tuple[str, Any], ...]),
}

# Sections a recipe may hold besides those above: stages (vit/training/stages.py).
EXTRA_SECTIONS = ("stages",)


def sections() -> dict[str, tuple[str, ...]]:
    """{section: its keys} for the sectioned keys; top-level keys under ''."""
    out: dict[str, list[str]] = {}
    for key in DEFAULTS:
        section, _, leaf = key.rpartition(".")
        out.setdefault(section, []).append(leaf)
    return {section: tuple(keys) for section, keys in out.items()}


def default_tree() -> dict[str, Any]:
    """The defaults as nested dicts, fresh copies (a recipe's changes never reach them)."""
    tree: dict[str, Any] = {}
    for key, entry in DEFAULTS.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(entry.default)
    return tree


def type_of(key: str) -> Any:
    """The type `--set KEY=...` expects for a key listed here, or None for any other key."""
    entry = DEFAULTS.get(key)
    if entry is None:
        return None
    if entry.type is not None:
        return entry.type
    return type(entry.default)
