"""Datasets (bundled digits, image folders, TFDS), transforms and grain input pipelines."""

from vit.data.pipeline import Augment, eval_batches, train_iterator
from vit.data.sources import open_source

__all__ = ["Augment", "eval_batches", "open_source", "train_iterator"]
