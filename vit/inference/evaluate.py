"""Evaluation: top-1 / top-5 / per-class accuracy, per-class precision / recall / F1, loss,
expected calibration error and the confusion matrix for classifiers; exact-match accuracy for
multi-label heads; answer accuracy for prompt heads."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator

import jax
import numpy as np
from flax import nnx

from vit import device_mesh
from vit.cpu.xla_options import inference_options, jit_options
from vit.data import eval_batches
from vit.data.transforms import one_hot

# The model inputs of a batch: the images, and the prompts when the task reads text.
INPUTS = ("image", "text", "text_mask")


def make_logits_fn(graphdef, mesh, params_sharding=None, dtype=None, pieces: int = 1):
    """A jitted `(params, inputs) -> float32 logits`, batch split over the mesh, logits
    replicated; `inputs` holds `image`, and `text`/`text_mask` for a prompt head.
    `params_sharding` is the training state's (default: replicated); `dtype` the model's
    compute dtype (its compile options, `vit.cpu.xla_options.inference_options`). `pieces > 1`
    runs each batch as that many equal pieces one after the other (a batch of thousands of
    tokens is faster on a CPU in cache-sized pieces: `vit.training.program.cache_splits`)."""
    rep, sharded = device_mesh.replicated(mesh), device_mesh.batch_sharded(mesh)

    def forward(params, inputs):
        return nnx.merge(graphdef, params)(inputs["image"], text=inputs.get("text"),
                                           text_mask=inputs.get("text_mask"))

    def logits(params, inputs):
        params = device_mesh.gathered_for_use(params, mesh)
        if pieces == 1:
            return forward(params, inputs)
        split = jax.tree.map(lambda x: x.reshape((pieces, -1) + x.shape[1:]), inputs)
        out = jax.lax.map(lambda piece: forward(params, piece), split)
        return out.reshape((-1,) + out.shape[2:])

    return jax.jit(logits, in_shardings=(params_sharding or rep, sharded), out_shardings=rep,
                   **jit_options(inference_options(dtype)))


def model_inputs(batch: dict) -> dict:
    """What of a batch the model reads (`INPUTS`)."""
    return {k: batch[k] for k in INPUTS if k in batch}


class CompiledAhead:
    """A jitted function whose compile for one call begins now, in a thread: a training run
    compiles its evaluation forward while it compiles and runs its steps (XLA compiles on
    one core), and its first validation waits only for what is left. `make_args` gives that
    call's arguments (abstract ones suffice). jax keeps the executable it compiled, and a call
    of `jitted` with the same shapes, dtypes and shardings runs it; any other call compiles as
    usual, and so does every call if the compile ahead failed (the failure is then raised
    where the caller handles it)."""

    def __init__(self, jitted, make_args: Callable[[], tuple]):
        self._jitted = jitted
        self._thread = threading.Thread(target=self._compile, args=(make_args,),
                                        name="vit-compile-ahead", daemon=True)
        self._thread.start()

    def _compile(self, make_args) -> None:
        with contextlib.suppress(Exception):  # the first call compiles, and fails, in the caller
            self._jitted.lower(*make_args()).compile()

    def __call__(self, *args):
        self._thread.join()  # a call meanwhile would compile the same program a second time
        return self._jitted(*args)

    def wait(self) -> None:
        """Returns once the compile has ended: a process should not exit inside XLA."""
        self._thread.join()


@functools.cache
def _gather(mesh):
    """Arrays replicated to every process: one program per mesh, compiled once."""
    return jax.jit(lambda x: x, out_shardings=device_mesh.replicated(mesh))


def sharded_eval_batches(source, pre, *, batch_size: int, num_threads: int = 2,
                         tokenize=None) -> Iterator[dict]:
    """This process's shard of `source` in padded batches of `batch_size` (its share of the
    global batch), then all-padding batches, so that every process runs the same number of
    steps whatever the size of its shard: none waits forever in a collective."""
    count, index = jax.process_count(), jax.process_index()
    kwargs = dict(batch_size=batch_size, num_threads=num_threads, tokenize=tokenize,
                  shard_count=count)
    largest_shard = math.ceil(len(source) / count)
    steps = math.ceil(largest_shard / batch_size)
    template = None
    for template in eval_batches(source, pre, shard_index=index, **kwargs):
        steps -= 1
        yield template
    if steps > 0 and template is None:  # an empty shard: shapes from another's first batch
        template = next(eval_batches(source, pre, shard_index=0, **kwargs))
    for _ in range(steps):
        yield {k: np.zeros_like(v) for k, v in template.items()}


def _outputs(logits_fn, params, batches: Iterable[dict], mesh):
    """(logits, batch) of each global batch (every process's rows) without the padding rows.
    Every process gets the same arrays, so every process computes the same figures. One batch
    is in flight while the host reads back the one before and prepares the next."""
    gather = _gather(mesh)

    def dispatched(batch):
        batch = device_mesh.to_global(batch, mesh)
        logits = logits_fn(params, model_inputs(batch))
        # The labels, answers and mask of every process; the inputs stay where they are.
        return logits, gather({k: v for k, v in batch.items() if k not in INPUTS})

    def read(logits, batch):
        batch = jax.tree.map(np.asarray, batch)
        keep = batch["mask"] > 0
        return np.asarray(logits, np.float32)[keep], {k: v[keep] for k, v in batch.items()}

    previous = None
    for batch in batches:
        current = dispatched(batch)
        if previous is not None:
            yield read(*previous)
        previous = current
    if previous is not None:
        yield read(*previous)


def evaluate_task(task: str, logits_fn, params, batches: Iterable[dict], num_classes: int,
                  mesh) -> dict:
    """`task` is the training loss's: softmax_xent (classes), sigmoid_xent (multi-label) or
    prompt_xent (prompt answers). Every result has `accuracy`, `loss` and `num_examples`."""
    if task == "sigmoid_xent":
        return evaluate_multilabel(logits_fn, params, batches, mesh, num_classes)
    if task == "prompt_xent":
        return evaluate_prompts(logits_fn, params, batches, mesh)
    return evaluate(logits_fn, params, batches, num_classes, mesh)


def evaluate_multilabel(logits_fn, params, batches: Iterable[dict], mesh,
                        num_classes: int | None = None) -> dict:
    """Exact-match accuracy (every label right), per-label accuracy, summed sigmoid loss, and
    each label's precision / recall / F1 (a label is predicted where its logit is over 0, its
    sigmoid over 0.5) with their macro means.
    A dataset with one class per image (integer labels, as big_vision trains ImageNet with
    `sigmoid_xent`) is scored against their one-hot form, as the training step is."""
    exact = label_hits = labels_seen = 0
    loss_sum, n = 0.0, 0
    counts = np.zeros((3, num_classes or 0), np.int64)  # right, predicted, true per label
    for logits, batch in _outputs(logits_fn, params, batches, mesh):
        labels = batch["label"]
        if labels.ndim == 1:  # class indices: the training pipeline's one-hot form
            labels = one_hot(labels, num_classes or logits.shape[-1])
        target = labels > 0.5
        hits = (logits > 0) == target
        if counts.shape[1] != logits.shape[-1]:  # the class count from the logits
            counts = np.zeros((3, logits.shape[-1]), np.int64)
        counts += np.stack([((logits > 0) & target).sum(0), (logits > 0).sum(0), target.sum(0)])
        exact += int(hits.all(-1).sum())
        label_hits, labels_seen = label_hits + int(hits.sum()), labels_seen + hits.size
        loss_sum += _sigmoid_xent(logits, target)
        n += len(logits)
    per_label = _precision_recall_f1(*counts.astype(np.float64))
    return {"accuracy": exact / max(n, 1), "label_accuracy": label_hits / max(labels_seen, 1),
            "loss": loss_sum / max(n, 1), "num_examples": n, **per_label}


def evaluate_prompts(logits_fn, params, batches: Iterable[dict], mesh) -> dict:
    """Accuracy of the prompt head's yes/no answers, and its sigmoid loss."""
    hits, loss_sum, n = 0, 0.0, 0
    for logits, batch in _outputs(logits_fn, params, batches, mesh):
        answer = batch["answer"].astype(np.float32)
        hits += int(((logits > 0) == (answer > 0.5)).sum())
        loss_sum += _sigmoid_xent(logits, answer)
        n += len(logits)
    return {"accuracy": hits / max(n, 1), "loss": loss_sum / max(n, 1), "num_examples": n}


def evaluate(logits_fn, params, batches: Iterable[dict], num_classes: int, mesh) -> dict:
    """Runs `logits_fn` over padded batches (`mask` 0 on padding); returns the figures:
    accuracy, top-5, loss, per-class accuracy and the confusion matrix (training's validation
    reads these), plus per-class precision / recall / F1 with their macro means and the
    calibration of the top-1 softmax confidence (`calibration`, `expected_calibration_error`)."""
    confusion = np.zeros((num_classes, num_classes), np.int64)
    top5_hits, loss_sum, n = 0, 0.0, 0
    k = min(5, num_classes)
    bins = CalibrationBins()
    for logits, batch in _outputs(logits_fn, params, batches, mesh):
        labels = batch["label"].astype(np.int64)
        predicted = logits.argmax(-1)
        np.add.at(confusion, (labels, predicted), 1)
        topk = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
        top5_hits += int((topk == labels[:, None]).any(-1).sum())
        loss_sum += _softmax_xent(logits, labels)
        bins.add(_softmax(logits).max(-1), predicted == labels)
        n += len(labels)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(1), 1)
    calibration = bins.summary()
    return {"accuracy": float(confusion.diagonal().sum() / max(n, 1)),
            "top5_accuracy": top5_hits / max(n, 1), "loss": loss_sum / max(n, 1),
            "num_examples": n, "per_class_accuracy": per_class.tolist(),
            "confusion": confusion.tolist(), **precision_recall_f1(confusion),
            "expected_calibration_error": calibration["ece"], "calibration": calibration}


# The losses of the logits read back, summed in numpy: eager jax ops here would dispatch (and,
# the first time, compile) a program per operation per batch.
def _softmax_xent(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-log_p[np.arange(len(labels)), labels].sum())


def _sigmoid_xent(logits: np.ndarray, target: np.ndarray) -> float:
    z = logits.astype(np.float64)
    return float((np.logaddexp(0.0, z) - z * target).sum())  # softplus(z) - t z


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def precision_recall_f1(confusion) -> dict:
    """Per-class precision, recall, F1 and support from a confusion matrix (rows true, columns
    predicted), and their unweighted means over every class. A class never predicted has
    precision 0, one never present recall 0 (scikit-learn's `zero_division=0`)."""
    confusion = np.asarray(confusion, np.float64)
    return _precision_recall_f1(confusion.diagonal(), confusion.sum(0), confusion.sum(1))


def _precision_recall_f1(hits, predicted, support) -> dict:
    """Per-class figures from the counts of right predictions, of predictions and of true
    examples of each class."""
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros_like(hits), where=support > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros_like(hits), where=both > 0)
    return {"precision": precision.tolist(), "recall": recall.tolist(), "f1": f1.tolist(),
            "support": support.astype(np.int64).tolist(),
            "macro_precision": float(precision.mean()), "macro_recall": float(recall.mean()),
            "macro_f1": float(f1.mean())}


class CalibrationBins:
    """Top-1 confidence against accuracy in equal-width bins over [0, 1] (15, as Guo et al.
    2017 and most reports use): bin b holds confidences in (b/B, (b+1)/B], the first also 0.
    Expected calibration error is the count-weighted mean of |accuracy - confidence| per bin."""

    def __init__(self, num_bins: int = 15):
        self.num_bins = num_bins
        self.count = np.zeros(num_bins, np.int64)
        self.confidence = np.zeros(num_bins, np.float64)  # sums, divided in `summary`
        self.correct = np.zeros(num_bins, np.float64)

    def add(self, confidence, correct) -> None:
        confidence = np.asarray(confidence, np.float64)
        inner_edges = np.linspace(0, 1, self.num_bins + 1)[1:-1]
        b = np.searchsorted(inner_edges, confidence, side="left")  # edge e goes below e
        np.add.at(self.count, b, 1)
        np.add.at(self.confidence, b, confidence)
        np.add.at(self.correct, b, np.asarray(correct, np.float64))

    def summary(self) -> dict:
        seen = self.count > 0
        denom = np.maximum(self.count, 1)
        accuracy, confidence = self.correct / denom, self.confidence / denom
        gap = np.abs(accuracy - confidence) * self.count
        return {"bins": self.num_bins, "ece": float(gap.sum() / max(self.count.sum(), 1)),
                "count": self.count.tolist(),
                "accuracy": [float(a) if s else None for a, s in zip(accuracy, seen, strict=True)],
                "confidence": [float(c) if s else None
                               for c, s in zip(confidence, seen, strict=True)]}


def display_name(name) -> str:
    """A class name as text to show: a folder name that is not UTF-8 reaches us with surrogate
    escapes, which no font draws and no UTF-8 file holds; each bad byte shows as `\\xff`, so
    two such names stay apart."""
    return str(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def confusion_png(confusion, class_names: list[str]) -> bytes:
    """The confusion matrix (row-normalised colour, counts written in) as PNG bytes: made
    whole before anything is written, so its size is known and no half image is left."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confusion = np.asarray(confusion)
    n = len(class_names)
    # "$" would start matplotlib's math text: a folder named "a$b$" is shown as it is.
    names = [display_name(c).replace("$", r"\$") for c in class_names]
    size = min(4 + 0.35 * n, 20)
    fig, ax = plt.subplots(figsize=(size, size))
    rows = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), names, rotation=90)
        ax.set_yticks(range(n), names)
        for i in range(n):
            for j in range(n):
                if confusion[i, j]:
                    ax.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if rows[i, j] > 0.5 else "black")
    ax.set(xlabel="predicted", ylabel="true", title="confusion matrix (row-normalised colour)")
    return _png(fig)



def reliability_png(calibration: dict) -> bytes:
    """The reliability diagram of `calibration` (`CalibrationBins.summary`) as PNG bytes
    (`reliability_figure`)."""
    return _png(reliability_figure(calibration))


# The gap between a bin's accuracy and its confidence: opaque and drawn over the accuracy bars,
# so it shows the legend's colour over a bar and over the white alike (a translucent red turned
# dark slate over the blue bars, unlike its pink swatch).
GAP_COLOUR, GAP_EDGE = "#f4a9a8", "tab:red"


def reliability_figure(calibration: dict):
    """The reliability diagram of `calibration`: each bin's accuracy (blue, outlined in black)
    against its mean confidence (the gap between them shaded), the diagonal a perfectly
    calibrated model would follow, the expected calibration error in the title and the share
    of examples per bin below. The caller closes the figure."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_bins, count = calibration["bins"], np.asarray(calibration["count"])
    edges = np.linspace(0, 1, num_bins + 1)
    centres, width = (edges[:-1] + edges[1:]) / 2, 1 / num_bins
    accuracy = np.array([a if a is not None else 0.0 for a in calibration["accuracy"]])
    confidence = np.array([c if c is not None else 0.0 for c in calibration["confidence"]])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.bar(centres, accuracy, width=width, edgecolor="black", color="tab:blue", zorder=1,
            label="accuracy")
    seen = count > 0
    top.bar(centres[seen], confidence[seen] - accuracy[seen], bottom=accuracy[seen],
            width=width, edgecolor=GAP_EDGE, color=GAP_COLOUR, zorder=2,
            label="gap to confidence")
    # The accuracy's outline again, over the gap: where the model is underconfident the gap
    # covers the bar's top, and the outline still marks the accuracy.
    top.bar(centres, accuracy, width=width, edgecolor="black", fill=False, zorder=3)
    top.plot([0, 1], [0, 1], "k--", linewidth=1, zorder=4, label="perfect calibration")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy",
            title=f"reliability ({num_bins} bins), ECE {calibration['ece']:.4f}")
    top.legend(loc="upper left", fontsize=8)
    share = count / max(count.sum(), 1)
    bottom.bar(centres, share, width=width, edgecolor="black", color="grey")
    bottom.set(xlim=(0, 1), xlabel="top-1 confidence", ylabel="share of examples")
    return fig


def _png(fig) -> bytes:
    """The figure as PNG bytes; the figure is closed either way."""
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = io.BytesIO()
    try:
        fig.savefig(out, format="png", dpi=100)
    finally:
        plt.close(fig)
    return out.getvalue()
