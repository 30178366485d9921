"""Input pipelines on grain: seeded global shuffle, parallel decode, batches, a per-host shard.

The training pipeline is a grain `MapDataset` (random access all the way down), so its position
is one number: the iterator's `get_state()` is `{"next_index": n}` and is saved with every
checkpoint; `set_state` puts a resumed run on exactly the batch it would have seen. Random
augmentations draw from generators grain seeds with (pipeline seed, element index), so they
replay exactly too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import grain
import numpy as np
from PIL import Image

from vit.data import randaugment as RA
from vit.data import transforms as T
from vit.errors import ConfigError
from vit.preprocess import Preprocessing, normalize


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training-time augmentation; each field off by default."""

    inception_crop: bool = False  # random-resized crop (else resize / centre-crop as eval)
    crop_area: tuple[float, float] = (0.05, 1.0)
    flip: bool = False
    shift: float = 0.0  # random affine, for tiny images: pixels
    rotate: float = 0.0  # degrees
    scale: float = 0.0  # log-zoom range
    mixup: float = 0.0  # Beta alpha; 0 = off
    cutmix: float = 0.0
    label_smoothing: float = 0.0
    randaugment: str = ""  # 'N,M' (vit.data.randaugment); '' = off
    random_erasing: float = 0.0  # the chance of a noise box on each image; 0 = off

    def __post_init__(self):
        RA.parse(self.randaugment)  # a bad spec stops the run before any data is read
        p = self.random_erasing
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ConfigError(f"input.random_erasing={p!r}: give the chance of erasing a box of "
                              "each training image, from 0 (off) to 1; 0.25 is usual")

    def rand_augment(self, pre: Preprocessing) -> RA.RandAugment | None:
        """The RandAugment this asks for, filling with `pre`'s mean colour (the model's 0)."""
        spec = RA.parse(self.randaugment)
        if spec is None or spec[0] == 0:
            return None
        mean = pre.mean * 3 if len(pre.mean) == 1 else pre.mean
        return RA.RandAugment(*spec, fill=tuple(min(255, round(255 * m)) for m in mean))


# A prompt tokenizer, `texts -> (tokens [n, len] int32, mask [n, len] bool)`; the caller (train,
# eval) passes the model's, so data never depends on the model package.
Tokenizer = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]


def _fields(element: dict, image: np.ndarray, tokenize: Tokenizer | None) -> dict:
    """The element's image and label, plus its prompt as tokens and its answer when the task
    reads text (`tokenize` given). Other fields (strings, ids) stay behind: they do not batch."""
    out = {"image": image, "label": element["label"]}
    if tokenize is not None:
        tokens, mask = tokenize([element["prompt"]])
        out.update(text=tokens[0], text_mask=mask[0], answer=np.int32(element["answer"]))
    return out


# The per-example random-erasing draw, carried from `TrainTransform` to `BatchTransform`
# (which erases after normalising, as timm does): [top, left, h, w, noise seed], h = 0 for none.
ERASE = "_erase"


class TrainTransform(grain.transforms.RandomMap):
    """Per example: crop (or resize), flip, RandAugment, and the random-erasing draw."""

    def __init__(self, pre: Preprocessing, aug: Augment, tokenize: Tokenizer | None = None):
        self.pre, self.aug, self.tokenize = pre, aug, tokenize
        self.randaug = aug.rand_augment(pre)

    def random_map(self, element: dict, rng: np.random.Generator) -> dict:
        image, pre, aug = element["image"], self.pre, self.aug
        if aug.inception_crop:
            image = T.inception_crop(image, rng, pre.size, aug.crop_area, resample=pre.resample)
        else:
            image = T.center_crop(image, pre.size, pre.crop_pct, pre.resample)
        if aug.flip:
            image = T.flip(image, rng)
        if self.randaug is not None:
            image = self.randaug(image, rng)
        out = _fields(element, image, self.tokenize)
        if aug.random_erasing > 0:
            box = RA.erase_box(rng, *image.shape[:2]) if rng.random() < aug.random_erasing else None
            out[ERASE] = np.array([*(box or (0, 0, 0, 0)), rng.integers(2**31)], np.int64)
        return out


class EvalTransform(grain.transforms.Map):
    """The `Preprocessing` itself, so eval sees exactly what `vit predict` feeds the model."""

    def __init__(self, pre: Preprocessing, tokenize: Tokenizer | None = None):
        self.pre, self.tokenize = pre, tokenize

    def map(self, element: dict) -> dict:
        return _fields(element, self.pre(Image.fromarray(element["image"])), self.tokenize)


class BatchTransform(grain.transforms.RandomMap):
    """uint8 batch -> {"image", "label", "target", ...}: affine jitter (vectorised),
    normalisation, random erasing (each example's own draw), one-hot targets, smoothed and
    mixed. Multi-hot labels (`[batch, classes]`, multi-label data) are their own targets. Text
    fields pass through."""

    def __init__(self, pre: Preprocessing, num_classes: int, aug: Augment):
        self.pre, self.num_classes, self.aug = pre, num_classes, aug

    def random_map(self, batch: dict, rng: np.random.Generator) -> dict:
        aug, image = self.aug, batch["image"]
        if aug.shift or aug.rotate or aug.scale:
            image = T.random_affine(image, rng, shift=aug.shift, rotate=aug.rotate,
                                    scale=aug.scale)
        image = normalize(image, self.pre.mean, self.pre.std)
        batch = dict(batch)
        for i, (top, left, h, w, seed) in enumerate(batch.pop(ERASE, ())):
            if h > 0:
                RA.erase(image[i], (top, left, h, w), seed)
        if batch["label"].ndim == 2:
            target = batch["label"].astype(np.float32)
        else:
            target = T.one_hot(batch["label"], self.num_classes, aug.label_smoothing)
        image, target = T.mixup_cutmix(image, target, rng, mixup=aug.mixup, cutmix=aug.cutmix)
        return {**batch, "image": image, "target": target}


def shard_of(dataset: grain.MapDataset, index: int, count: int) -> grain.MapDataset:
    return dataset[index::count] if count > 1 else dataset


def train_iterator(source, pre: Preprocessing, aug: Augment, *, batch_size: int, seed: int,
                   num_classes: int, shard_index: int = 0, shard_count: int = 1,
                   num_threads: int = 2, tokenize: Tokenizer | None = None
                   ) -> grain.DatasetIterator:
    """An endless iterator of this host's training batches; checkpoint it with `get_state()`.

    `batch_size` is the per-host batch. With `tokenize`, batches also carry the prompts
    (`text`, `text_mask`) and their `answer`s.
    """
    ds = shard_of(grain.MapDataset.source(source).seed(seed), shard_index, shard_count)
    ds = (ds.shuffle().repeat(None).random_map(TrainTransform(pre, aug, tokenize))
          .batch(batch_size, drop_remainder=True)
          .random_map(BatchTransform(pre, num_classes, aug)))
    read = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4 * batch_size)
    return iter(ds.to_iter_dataset(read))


def eval_batches(source, pre: Preprocessing, *, batch_size: int, shard_index: int = 0,
                 shard_count: int = 1, num_threads: int = 2, tokenize: Tokenizer | None = None
                 ) -> Iterator[dict[str, Any]]:
    """One pass in order; the last batch is padded to `batch_size`, with `mask` 0 on padding."""
    ds = shard_of(grain.MapDataset.source(source), shard_index, shard_count)
    ds = ds.map(EvalTransform(pre, tokenize)).batch(batch_size, drop_remainder=False)
    read = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4 * batch_size)
    for batch in ds.to_iter_dataset(read):
        n = len(batch["label"])
        pad = batch_size - n
        out = {k: np.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for k, v in batch.items()}
        yield {**out, "mask": np.pad(np.ones(n, np.float32), (0, pad))}
