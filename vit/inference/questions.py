"""Every question asked of every image: how a text model answers on a user's terms, not only on
the two prompts its evaluation split pairs with each image.

`ask_every_prompt` runs a model over images x prompts (each prompt encoded once per batch);
`question_figures` turns the probabilities into the report of `vit eval` on a text model:

- per group of questions (`seen` pairs, `heldout` pairs, `wording`: seen pairs in wordings
  training never used): balanced accuracy (the mean of the yes-recall and the no-recall, so a
  model that always says "no" scores 0.5 however rare "yes" is) and the ranking AUC (the
  chance that a true question scores above a false one; ties count a half);
- per group, the false-yes rate by what the scene shares with the question: `neither` its
  colour nor its shape, `colour_only`, `shape_only`, or `both_apart` (both, on different
  shapes);
- for questions naming never-drawn words (`never`) and prompts with no word the model was
  trained on (`unknown`), the yes-rate: both are "no" by the training rule.

Datasets with other kinds of "no" (a class asked in the wrong region, one item of two) give
their own `shares` values; each gets its false-yes rate in place of `SHARES`. With `kinds[q]` (the
kind of each question: class, region, ...) each pair group is also broken down by kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SHARES = ("neither", "colour_only", "shape_only", "both_apart")
PAIR_GROUPS = ("seen", "heldout", "wording")
RULE_GROUPS = ("never", "unknown")  # always "no": reported as a yes-rate
_NOT_A_SHARE = ("present", "never", "unknown")


def balanced_accuracy(truth: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """The mean of the recall of the "yes" answers and of the "no" answers."""
    truth, said = np.asarray(truth, bool), np.asarray(probs) > threshold
    recalls = [np.mean(said[truth]) if truth.any() else np.nan,
               np.mean(~said[~truth]) if (~truth).any() else np.nan]
    return float(np.nanmean(recalls))


def ranking_auc(truth: np.ndarray, scores: np.ndarray) -> float | None:
    """Area under the ROC curve: P(score of a true question > score of a false one), ties a
    half (the Mann-Whitney U statistic over average ranks). None without both answers."""
    truth, scores = np.asarray(truth, bool).ravel(), np.asarray(scores, np.float64).ravel()
    pos, neg = int(truth.sum()), int((~truth).sum())
    if not pos or not neg:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties: each run of equal scores shares the mean of its positions
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    for lo, hi in zip(starts, ends, strict=True):
        ranks[order[lo:hi]] = (lo + hi + 1) / 2
    return float((ranks[truth].sum() - pos * (pos + 1) / 2) / (pos * neg))


def question_figures(probs: np.ndarray, truth: np.ndarray, groups: Sequence[str],
                     shares: np.ndarray, threshold: float = 0.5,
                     kinds: Sequence[str] | None = None) -> dict:
    """`probs`, `truth` `[images, questions]`; `groups[q]` one of `PAIR_GROUPS` or
    `RULE_GROUPS`; `shares [images, questions]`: "present", one of `SHARES` or a dataset's own
    kind of "no" (anything for `RULE_GROUPS`); `kinds[q]`, optional, the kind of question."""
    probs, truth = np.asarray(probs, np.float64), np.asarray(truth, bool)
    groups, shares = np.asarray(groups), np.asarray(shares)
    said = probs > threshold
    out = {"images": int(probs.shape[0]), "threshold": threshold}
    for group in PAIR_GROUPS:
        cols = groups == group
        if cols.any():
            out[group] = _group(truth[:, cols], probs[:, cols], shares[:, cols], threshold)
            if kinds is not None:
                kind_of = np.asarray(kinds)[cols]
                out[group]["by_kind"] = {
                    k: _group(truth[:, cols][:, kind_of == k], probs[:, cols][:, kind_of == k],
                              shares[:, cols][:, kind_of == k], threshold)
                    for k in dict.fromkeys(kind_of.tolist())}
    for group in RULE_GROUPS:
        cols = groups == group
        if cols.any():
            out[group] = {"questions": int(cols.sum()),
                          "yes_rate": float(np.mean(said[:, cols]))}
    return out


def _group(t: np.ndarray, p: np.ndarray, sh: np.ndarray, threshold: float) -> dict:
    """Balanced accuracy, AUC, recalls and false-yes by share of one set of questions."""
    said = p > threshold
    found = {str(k) for k in np.unique(sh)} - set(_NOT_A_SHARE)
    own = sorted(found) if found - set(SHARES) else []
    return {
        "questions": int(t.shape[1]),
        "balanced_accuracy": balanced_accuracy(t, p, threshold),
        "auc": ranking_auc(t, p),
        "yes_recall": float(np.mean(said[t])) if t.any() else None,
        "no_recall": float(np.mean(~said[~t])) if (~t).any() else None,
        "false_yes": {k: (float(np.mean(said[sh == k])) if (sh == k).any() else None)
                      for k in (own or SHARES)},
    }


def ask_every_prompt(model, images: np.ndarray, text: np.ndarray, mask: np.ndarray,
                     batch_size: int = 50) -> np.ndarray:
    """`[images, prompts]` probabilities: every image (preprocessed, NHWC float) against every
    prompt (`text [P, T]`, `mask [P, T]`), one compiled forward at a fixed batch size."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, images, text, mask):
        return jax.nn.sigmoid(nnx.merge(graphdef, state).answer_prompts(images, text, mask))

    n = len(images)
    batch_size = max(1, min(batch_size, n))
    text, mask = jnp.asarray(text), jnp.asarray(mask)
    out = []
    for start in range(0, n, batch_size):
        chunk = np.asarray(images[start:start + batch_size], np.float32)
        pad = batch_size - len(chunk)
        if pad:  # the last batch padded to the same size: one compile
            chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
        probs = np.asarray(forward(state, jnp.asarray(chunk), text, mask))
        out.append(probs[:batch_size - pad])
    return np.concatenate(out)
