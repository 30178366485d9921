"""Input pipelines on grain: seeded global shuffle, parallel decode, batches, a per-host shard.

The training pipeline is a grain `MapDataset` (random access all the way down), so its position
is one number: the iterator's `get_state()` is `{"next_index": n}` and is saved with every
checkpoint; `set_state` puts a resumed run on exactly the batch it would have seen. Random
augmentations draw from generators grain seeds with (pipeline seed, batch index), so they
replay exactly too.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grain
import numpy as np
from PIL import Image

from vit.data import randaugment as RA
from vit.data import transforms as T
from vit.data.sources import ArraySource, FolderSource
from vit.errors import ConfigError, DataError
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
    scene_jitter: bool = False  # the source's own `jitter` (fashion_scenes: photos moved)

    def __post_init__(self):
        RA.parse(self.randaugment)  # a bad spec is one line here, before any training step
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
    if "where" in element:  # what lies on each part of the image (`train.patch_loss`)
        out["where"] = element["where"]
    if tokenize is not None:
        tokens, mask = tokenize([element["prompt"]])
        out.update(text=tokens[0], text_mask=mask[0], answer=np.int32(element["answer"]))
    return out


# The per-example random-erasing draw, carried from `TrainTransform` to `BatchTransform`
# (which erases after normalising, as timm does): [top, left, h, w, noise seed], h = 0 for none.
ERASE = "_erase"


class TrainTransform(grain.transforms.RandomMap):
    """Per example: crop (or resize), flip, RandAugment, and the random-erasing draw."""

    def __init__(self, pre: Preprocessing, aug: Augment, tokenize: Tokenizer | None = None,
                 jitter: Callable | None = None):
        self.pre, self.aug, self.tokenize, self.jitter = pre, aug, tokenize, jitter
        self.randaug = aug.rand_augment(pre)

    def random_map(self, element: dict, rng: np.random.Generator) -> dict:
        if self.jitter is not None:  # the scene rearranged first: the crop sees the new one
            element = self.jitter(element, rng)
        image, pre, aug = element["image"], self.pre, self.aug
        if aug.inception_crop:
            image = T.inception_crop(image, rng, pre.size, aug.crop_area, resample=pre.resample)
        else:
            image = T.center_crop(image, pre)
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
        image = normalize(image, self.pre.mean, self.pre.std, self.pre.rescale_factor)
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


# What the batches made ahead may hold in memory, and the most of them.
PREFETCH_BYTES = 256 * 2**20
PREFETCH_MAX = 64


def read_options(num_threads: int, batch_size: int = 1, size: tuple[int, int] = (224, 224)
                 ) -> grain.ReadOptions:
    """Each thread assembles whole batches; the buffer counts batches, ready or in the making.
    At least two per thread keeps every thread busy while the consumer takes one; small batches
    (digits) get a deeper buffer, up to `PREFETCH_BYTES` of float32 images, which rides out a
    busy CPU. Counted in images, it would hold that many batches of 224 px floats: gigabytes."""
    batch_bytes = batch_size * size[0] * size[1] * 3 * 4
    depth = min(PREFETCH_MAX, max(2, 2 * num_threads, PREFETCH_BYTES // max(batch_bytes, 1)))
    return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=depth)


def shard_of(dataset: grain.MapDataset, index: int, count: int) -> grain.MapDataset:
    return dataset[index::count] if count > 1 else dataset


class EpochBatches:
    """The shuffled order as batches of indices: batch `b` holds the examples at positions
    `b * size ...` of the endless stream of epochs, each epoch a fresh permutation of `indices`
    drawn from (seed, epoch). One numpy permutation per epoch, where grain's per-element shuffle
    costs about 0.1 ms an example (more than a small model's step on an accelerator)."""

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int):
        self.indices, self.batch_size, self.seed = np.asarray(indices), batch_size, seed
        self._orders: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # grain's threads ask for batches at once

    def __len__(self) -> int:
        return sys.maxsize // self.batch_size  # endless, as grain's repeat(None)

    def order(self, epoch: int) -> np.ndarray:
        with self._lock:
            order = self._orders.get(epoch)
            if order is None:
                order = self.indices[np.random.default_rng([self.seed, epoch]).permutation(
                    len(self.indices))]
                if len(self._orders) >= 4:  # threads work on neighbouring epochs at most
                    del self._orders[min(self._orders)]
                self._orders[epoch] = order
            return order

    def __getitem__(self, b: int) -> dict:
        position = int(b) * self.batch_size + np.arange(self.batch_size)
        epoch, at = np.divmod(position, len(self.indices))
        index = np.empty(self.batch_size, np.int64)
        for e in np.unique(epoch):
            index[epoch == e] = self.order(int(e))[at[epoch == e]]
        return {"index": index, "position": position}


class ReadArrays(grain.transforms.Map):
    """The fast path for in-memory images that need no per-example work (the bundled digits'
    recipe): one fancy index per batch, the batch `TrainTransform` would have made of them."""

    def __init__(self, source: ArraySource):
        self.source = source

    def map(self, batch: dict) -> dict:
        index = batch["index"]
        return {"image": self.source.images[index],
                "label": np.asarray(self.source.labels[index], np.int64)}


class ExampleBatch(grain.transforms.RandomMap):
    """One batch of `EpochBatches` indices through `TrainTransform` example by example, each
    example drawing from the batch's generator in turn, then stacked. grain sees one element a
    batch: its per-element shuffle and bookkeeping cost more than a small image's own work."""

    def __init__(self, source, transform: TrainTransform):
        self.source, self.transform = source, transform

    def random_map(self, batch: dict, rng: np.random.Generator) -> dict:
        examples = [self.transform.random_map(self.source[int(i)], rng) for i in batch["index"]]
        return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def _no_example_work(source, pre: Preprocessing, aug: Augment, tokenize) -> bool:
    """True when every example would leave `TrainTransform` as it came in."""
    return (isinstance(source, ArraySource) and tokenize is None and not aug.inception_crop
            and not aug.flip and aug.rand_augment(pre) is None and aug.random_erasing == 0
            and pre.crop_pct is None and tuple(source.images.shape[1:3]) == pre.size
            and source.images.dtype == np.uint8 and source.images.ndim == 4)


def _as_is_for_eval(source, pre: Preprocessing, tokenize) -> bool:
    """True when `pre` would hand back every image of `source` at its size, unresampled and
    uncropped (in-memory RGB of `pre.size`), so an eval batch is its images normalised."""
    if not (isinstance(source, ArraySource) and tokenize is None and len(source)
            and source.images.dtype == np.uint8 and source.images.ndim == 4
            and source.images.shape[3] == 3):
        return False
    h, w = source.images.shape[1:3]
    return pre.geometry((w, h))[:2] == ((w, h), (0, 0, w, h))


def decode_side(pre: Preprocessing, aug: Augment) -> int:
    """The shorter side a training image needs so that its crop is never enlarged: the smallest
    inception crop (area `crop_area[0]`, aspect 4:3) still covers `pre.size` pixel for pixel."""
    side = max(pre.size)
    if aug.inception_crop:
        return math.ceil(side * math.sqrt((4 / 3) / aug.crop_area[0]))
    if pre.crop_pct:
        return math.ceil(side / pre.crop_pct)
    return max(side, pre.shortest_edge or 0, *(pre.resize_to or ()))


def train_iterator(source, pre: Preprocessing, aug: Augment, *, batch_size: int, seed: int,
                   num_classes: int, shard_index: int = 0, shard_count: int = 1,
                   num_threads: int = 2, tokenize: Tokenizer | None = None
                   ) -> grain.DatasetIterator:
    """An endless iterator of this host's training batches; checkpoint it with `get_state()`.

    `batch_size` is the per-host batch. With `tokenize`, batches also carry the prompts
    (`text`, `text_mask`) and their `answer`s. Each host shuffles its own shard
    (`shard_index::shard_count` of the examples), every epoch in a new order; grain's threads
    make whole batches ahead of the consumer. The order is `EpochBatches`'; in-memory images
    that need no per-example work (the digits recipe) are read a batch at a time
    (`ReadArrays`), the rest go example by example through `TrainTransform` (`ExampleBatch`).
    """
    jitter = getattr(source, "jitter", None) if aug.scene_jitter else None
    if aug.scene_jitter and jitter is None:
        raise ConfigError(f"input.scene_jitter: {getattr(source, 'name', 'this dataset')} does "
                          "not say where the things in its images lie (fashion_scenes does); "
                          "set it to false")
    indices = np.arange(len(source))[shard_index::shard_count]
    if not len(indices):
        raise DataError(f"{getattr(source, 'name', 'the dataset')}: no training examples for "
                        f"host {shard_index} of {shard_count}; add images")
    ds = grain.MapDataset.source(EpochBatches(indices, batch_size, seed)).seed(seed)
    if _no_example_work(source, pre, aug, tokenize):  # never a source with `jitter`
        ds = ds.map(ReadArrays(source))
    else:
        if isinstance(source, FolderSource):  # JPEGs decoded no larger than the crops need
            source = source.decoding_at_least(decode_side(pre, aug))
        ds = ds.random_map(ExampleBatch(source, TrainTransform(pre, aug, tokenize, jitter)))
    ds = ds.random_map(BatchTransform(pre, num_classes, aug))
    it = iter(ds.to_iter_dataset(read_options(num_threads, batch_size, pre.size)))
    it.start_prefetch()  # decoding starts now, while the caller compiles its step
    return it


def eval_batches(source, pre: Preprocessing, *, batch_size: int, shard_index: int = 0,
                 shard_count: int = 1, num_threads: int = 2, tokenize: Tokenizer | None = None
                 ) -> Iterator[dict[str, Any]]:
    """One pass in order; the last batch is padded to `batch_size`, with `mask` 0 on padding.
    In-memory images that the preprocessing leaves at their size (`_as_is_for_eval`) are
    normalised a batch at a time, the same arithmetic `EvalTransform` does per example."""
    if _as_is_for_eval(source, pre, tokenize):
        index = np.arange(len(source))[shard_index::shard_count]
        batches = ({"image": normalize(source.images[i], pre.mean, pre.std, pre.rescale_factor),
                    "label": np.asarray(source.labels[i], np.int64)}
                   for i in np.array_split(index, range(batch_size, len(index), batch_size))
                   if len(i))
    else:
        ds = shard_of(grain.MapDataset.source(source), shard_index, shard_count)
        ds = ds.map(EvalTransform(pre, tokenize)).batch(batch_size, drop_remainder=False)
        batches = ds.to_iter_dataset(read_options(num_threads, batch_size, pre.size))
    for batch in batches:
        n = len(batch["label"])
        pad = batch_size - n
        out = {k: np.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for k, v in batch.items()}
        yield {**out, "mask": np.pad(np.ones(n, np.float32), (0, pad))}
