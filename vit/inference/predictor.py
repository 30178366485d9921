"""Pretrained prediction: load any checkpoint, classify image files and folders (top-k), or, with
a text model, score prompts and zero-shot names against them.

`load_pretrained(path)` gives `(model, preprocess, labels)`; `Predictor` runs a jitted forward
at one fixed batch size (the last batch is padded, so nothing recompiles) while a thread pool
decodes the next batch. A file that cannot be read becomes `{"image", "error"}` and the rest
carry on. Its three modes share that machinery and differ only in the forward and the result:

- classes: softmax top-k of the class head, `{"image", "top_k": [{index, label, prob}]}`;
- multi-label (a head trained with `sigmoid_xent`): each label's own sigmoid, and every label
  at or above a threshold, `{"image", "labels": [{index, label, prob}], "probs": [...]}`;
- prompts: the sigmoid of each prompt's match logit, `{"image", "prompts": [{text, prob}]}`
  (a prompt naming a thing by a word the model never read, or with no word it read: prob 0 by
  rule, with `never_seen` and the model's own `model_prob`);
  every prompt of an image goes in one forward pass (the model shares the image prefix);
- zero-shot: names scored by the similarity head (sigmoid, as SigLIP), top-k as for classes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vit.cpu.xla_options import compile_for_inference
from vit.device_mesh import on_local_devices
from vit.errors import CheckpointError, DataError
from vit.images import open_image
from vit.inference.prompts import (
    Prompts,
    encode_prompts,
    prompts_forward,
    require_text,
    zero_shot_prompts,
)
from vit.ops.matmul import NARROW
from vit.preprocess import Preprocessing


def load_pretrained(path, *, image_size: int | None = None, labels=None, **overrides):
    """`(model, preprocess, labels)` from any checkpoint `vit.checkpoints` reads.

    `labels` is an optional file of display names (one per line); otherwise the checkpoint's
    own names (ImageNet-1k for 1000-class Google and timm weights), or None. Loader notices (such
    as an all-zero head) are issued as Python warnings.
    """
    from vit.checkpoints import load_checkpoint

    loaded = load_checkpoint(path, image_size=image_size, **overrides)
    for message in loaded.warnings:
        warnings.warn(message, stacklevel=2)
    names = loaded.labels
    if labels is not None:
        from vit.checkpoints.labels import read_labels
        names = read_labels(labels, loaded.config.num_classes)
    return loaded.build_model(), loaded.preprocessing, names


class Predictor:
    """Images -> top-k classes, prompt probabilities, or zero-shot top-k, one compiled forward.

    `prompts` (a `Prompts`, or a list of strings to tokenize) switches to prompt mode: every
    image is scored against every prompt. `multi_label` reads the class head as independent
    labels (a model trained with `sigmoid_xent`): each label's sigmoid, and those at or above
    `threshold`, highest first. `zero_shot` (a `Prompts` from `zero_shot_prompts`, or
    a list of names) switches to zero-shot top-k over those names; `labels` is then unused.
    """

    def __init__(self, model, preprocess: Preprocessing, labels: list[str] | None = None, *,
                 top_k: int = 5, batch_size: int = 32, workers: int | None = None,
                 prompts: Prompts | Sequence[str] | None = None,
                 zero_shot: Prompts | Sequence[str] | None = None,
                 multi_label: bool = False, threshold: float = 0.5):
        import jax
        from flax import nnx

        from vit.inference.weights import narrow_kernels

        cfg = model.config
        if prompts is not None and zero_shot is not None:
            raise DataError("give prompts or zero-shot names, not both")
        if prompts is not None and not isinstance(prompts, Prompts):
            prompts = encode_prompts(cfg, prompts)
        if zero_shot is not None and not isinstance(zero_shot, Prompts):
            zero_shot = zero_shot_prompts(cfg, zero_shot)
        self.preprocess, self.batch_size = preprocess, batch_size
        self.workers = workers or min(8, os.cpu_count() or 1)
        self.prompts, self.threshold, self.num_classes = prompts, threshold, cfg.num_classes
        self.dtype = str(cfg.dtype)
        graphdef, state = nnx.split(narrow_kernels(model))
        # The forwards take the parameter leaves as a flat list: a plain argument tree that
        # `jax.export` can serialize (vit.inference.prepared), whatever the model's own tree is.
        state, treedef = jax.tree.flatten(state)

        def merged(leaves):
            return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

        if prompts is not None:
            require_text(cfg, "prompts")
            self.mode, self.labels, self.top_k = "prompts", None, None
            forward, extra = prompts_forward(merged, prompts)
        elif zero_shot is not None:
            require_text(cfg, "--zero-shot", similarity=True)
            self.mode, self.labels = "zero_shot", zero_shot.labels
            self.top_k = min(top_k, len(zero_shot.labels))
            forward, extra = _zero_shot_forward(merged, state, zero_shot, self.top_k)
        else:
            if not cfg.num_classes:
                raise CheckpointError("this checkpoint has no classification head "
                                      "(num_classes=0); fine-tune it first "
                                      "(vit train --init CHECKPOINT)")
            if labels is not None and len(labels) != cfg.num_classes:
                raise DataError(f"{len(labels)} labels for {cfg.num_classes} classes; give one "
                                "name per class")
            self.labels = labels
            if multi_label:
                self.mode, self.top_k = "multi_label", None
                forward, extra = _sigmoid_forward(merged), ()
            else:
                self.mode, self.top_k = "classes", min(top_k, cfg.num_classes)
                forward, extra = _classes_forward(merged, self.top_k), ()
        # Every local device: the batch split over them (rounded up to fit), weights copied.
        self.batch_size, forward = on_local_devices(forward, batch_size, 2 + len(extra))
        self._state, self._forward, self._extra = state, forward, extra
        self._channels, self._compiled, self.exported = cfg.in_channels, None, None

    @classmethod
    def prepared(cls, leaves: list, exported, preprocess: Preprocessing,
                 labels: list[str] | None = None, *, workers: int | None = None) -> Predictor:
        """A classifier from `vit.inference.prepared`: the parameter leaves and the exported
        forward (softmax top-k at one batch size), with no model built or traced."""
        self = cls.__new__(cls)
        images = exported.in_avals[-1]
        self.preprocess, self.batch_size = preprocess, images.shape[0]
        self.workers = workers or min(8, os.cpu_count() or 1)
        self.prompts, self.mode, self.labels, self.threshold = None, "classes", labels, None
        self.num_classes = None  # a softmax top-k forward: the class count is not needed
        self.top_k = exported.out_avals[0].shape[-1]
        # Split over the local devices as it was exported (jax refuses any other device count).
        self._state, self._extra = leaves, ()
        # The compute dtype, for the compile options: narrow kernels are stored narrow.
        narrow = [str(leaf.dtype) for leaf in leaves if leaf.dtype in NARROW]
        self.dtype = narrow[0] if narrow else "float32"
        self._forward = on_local_devices(exported.call, self.batch_size, 2)[1]
        self._channels, self._compiled, self.exported = images.shape[-1], None, exported
        return self

    @property
    def leaves(self) -> list:
        """The parameter leaves the forward takes (what `vit.inference.prepared` stores)."""
        return self._state

    def compile(self, export: bool = False) -> None:
        """Compiles the forward for this batch size at the preprocessing's image size, now
        rather than inside the first batch, so start-up is timed apart from throughput. A
        persistent compilation cache (`vit.inference.compile_cache`) that holds it makes this
        a load.

        `export=True` (classifiers) first exports the forward with `jax.export` and compiles
        that, keeping it as `self.exported` for `vit.inference.prepared`: the same program a warm
        run compiles, so the persistent cache serves it. A forward that cannot be exported
        (a kernel outside jax's stable custom calls) is compiled as it is."""
        import jax

        if self._compiled is not None:
            return
        spec = jax.ShapeDtypeStruct((self.batch_size, *self.preprocess.size, self._channels),
                                    np.float32)
        forward = self._forward
        if export and self.exported is None and self.mode == "classes":
            from jax import export as jax_export

            try:
                self.exported = jax_export.export(forward)(self._state, spec)
                forward = on_local_devices(self.exported.call, self.batch_size, 2)[1]
            except Exception:  # noqa: BLE001 - anything export refuses: run unexported
                self.exported = None
        self._compiled = compile_for_inference(forward.lower(self._state, spec, *self._extra),
                                               self.dtype)

    def predict_arrays(self, images: np.ndarray):
        """`[n, h, w, c]` preprocessed images -> (probs, indices), each `[n, top_k]`; in prompt
        mode the probabilities `[n, prompts]`, in multi-label mode `[n, classes]`."""
        n = len(images)
        padded = np.zeros((self.batch_size, *images.shape[1:]), np.float32)
        padded[:n] = images
        if padded.shape[1:3] == self.preprocess.size:
            self.compile()
            forward = self._compiled
        else:  # arrays at another size (from Python): jit compiles for that shape
            forward = self._forward
        out = tuple(np.asarray(a)[:n] for a in forward(self._state, padded, *self._extra))
        return out[0] if self.mode in ("prompts", "multi_label") else out

    def _load(self, path: Path) -> np.ndarray | str:
        try:
            return self.preprocess(open_image(path))
        except DataError as err:
            return str(err)
        except (OSError, ValueError) as err:  # a decoder failing late, inside resize/convert
            return f"{path}: not a readable image ({err})"

    def predict_files(self, paths: list[Path], progress=None) -> Iterator[dict]:
        """One result dict per path, in order; `progress` (a tqdm bar) is advanced per image."""
        batches = [paths[i:i + self.batch_size] for i in range(0, len(paths), self.batch_size)]
        with ThreadPoolExecutor(self.workers) as pool:
            pending = list(pool.map(self._load, batches[0])) if batches else []
            for b, batch in enumerate(batches):
                loaded = pending
                if b + 1 < len(batches):  # decode the next batch while this one runs
                    upcoming = [pool.submit(self._load, p) for p in batches[b + 1]]
                good = [i for i, x in enumerate(loaded) if isinstance(x, np.ndarray)]
                results = {i: {"image": str(batch[i]), "error": loaded[i]}
                           for i in range(len(batch)) if i not in good}
                if good:
                    out = self.predict_arrays(np.stack([loaded[i] for i in good]))
                    for row, i in enumerate(good):
                        results[i] = {"image": str(batch[i]), **self._result(out, row)}
                yield from (results[i] for i in range(len(batch)))
                if progress is not None:
                    progress.update(len(batch))
                if b + 1 < len(batches):
                    pending = [f.result() for f in upcoming]

    def _answer(self, index: int, prob: float) -> dict:
        """Prompt `index`'s answer: the model's, or "no" by rule (prob 0, `never_seen` naming
        the words) when it names a thing by a word the model never read or holds no word
        the model read."""
        never_seen = self.prompts.ruled_no(index)
        if never_seen:
            return {"text": self.prompts.labels[index], "prob": 0.0,
                    "never_seen": list(never_seen), "model_prob": prob}
        return {"text": self.prompts.labels[index], "prob": prob}

    def _result(self, out, row: int) -> dict:
        if self.mode == "prompts":
            return {"prompts": [self._answer(i, float(p)) for i, p in enumerate(out[row])]}
        if self.mode == "multi_label":
            probs = out[row]
            above = [int(i) for i in np.argsort(-probs, kind="stable")
                     if probs[i] >= self.threshold]
            return {"labels": [{"index": i, "label": self.labels[i] if self.labels else None,
                                "prob": float(probs[i])} for i in above],
                    "probs": [float(p) for p in probs]}
        probs, idx = out
        return {"top_k": [{"index": int(i), "label": self.labels[int(i)] if self.labels else None,
                           "prob": float(p)} for p, i in zip(probs[row], idx[row], strict=True)]}


# The three forwards take the parameter leaves first (`merged(leaves)` is the model), then the
# images, then their mode's extra arguments.
def _classes_forward(merged, k: int):
    """Softmax top-k of the class head."""
    import jax

    @jax.jit
    def forward(state, images):
        logits = merged(state)(images)
        return jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)

    return forward


def _sigmoid_forward(merged):
    """Each label's own sigmoid of the class head (multi-label), every label."""
    import jax

    @jax.jit
    def forward(state, images):
        return (jax.nn.sigmoid(merged(state)(images).astype(np.float32)),)

    return forward


def _zero_shot_forward(merged, state, names: Prompts, k: int):
    """`(forward, (names' embeddings,))`: top-k of the similarity head's sigmoid."""
    import jax

    # The names' embeddings do not depend on the image: computed once, here.
    txt = jax.jit(lambda state, t, m: merged(state).text_embedding(t, m))(
        state, names.text, names.mask)

    @jax.jit
    def forward(state, images, txt):
        m = merged(state)
        logits = m.similarity.logits(m.image_embedding(images), txt)
        return jax.lax.top_k(jax.nn.sigmoid(logits), k)

    return forward, (txt,)
