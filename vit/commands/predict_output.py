"""How `vit predict` prints its results: lines for people (`text`), JSON Lines (`jsonl`, also
`--json`) or CSV (`csv`: a header row, then one row per image, or per image and prompt).

CSV columns, by what the model answers:
- classes and zero-shot names: `image`, then `top1_label, top1_prob, top1_index` ... up to
  `--top-k`, then `error`;
- prompts: `image, prompt, prob, error`, a row per image and prompt;
- multi-label: `image, labels` (every label at or above the threshold, highest first, joined by
  "; "), a `prob:LABEL` column per label in class order, then `error`.
An image that cannot be read is a row with its `error` and the other cells empty. Quoting is the
csv module's, so a path holding commas, quotes or newlines reads back whole.
"""

from __future__ import annotations

import csv
import json
import sys

FORMATS = ("text", "jsonl", "csv")


class ResultWriter:
    """Writes each result dict of `Predictor.predict_files` to `stream` in `fmt`."""

    def __init__(self, fmt: str, predictor, stream=None):
        self.fmt, self.stream = fmt, stream or sys.stdout
        self.mode, self.threshold = predictor.mode, predictor.threshold
        self._csv = None
        self._names = label_names(predictor) if self.mode == "multi_label" else []
        if fmt == "csv":
            self._csv = csv.writer(self.stream, lineterminator="\n")
            self._header = _csv_header(predictor)
            self._csv.writerow(self._header)
            self.stream.flush()

    def write(self, result: dict) -> None:
        if self.fmt == "jsonl":
            print(json.dumps(result), file=self.stream, flush=True)
        elif self.fmt == "csv":
            self._csv.writerows(self._csv_rows(result))
            self.stream.flush()
        else:
            print(text_line(result, self.threshold, self._names), file=self.stream)

    def _csv_rows(self, result: dict) -> list[list]:
        width = len(self._header)
        if "error" in result:
            return [[result["image"]] + [""] * (width - 2) + [result["error"]]]
        if "prompts" in result:
            return [[result["image"], p["text"], _prob(p["prob"]), ""]
                    for p in result["prompts"]]
        if "labels" in result:
            found = "; ".join(_name(t) for t in result["labels"])
            return [[result["image"], found, *map(_prob, result["probs"]), ""]]
        cells = [result["image"]]
        for t in result["top_k"]:
            cells += [t["label"] if t["label"] is not None else "", _prob(t["prob"]), t["index"]]
        return [cells + [""] * (width - 1 - len(cells)) + [""]]


def text_line(result: dict, threshold: float | None = None, names=()) -> str:
    """One result as a line for people; `names` are the class names a multi-label result with
    no label over `threshold` shows its highest one by."""
    if "error" in result:
        return f"{result['image']}: error: {result['error']}"
    if "prompts" in result:  # json.dumps quotes (and escapes) the prompt unambiguously
        scores = ", ".join(f"{json.dumps(p['text'], ensure_ascii=False)} {p['prob']:.2f}"
                           + (f" (no by rule: {', '.join(p['never_seen'])} never seen)"
                              if p.get("never_seen") else "")
                           for p in result["prompts"])
        return f"{result['image']}: {scores}"
    if "labels" in result:
        if result["labels"]:
            found = ", ".join(f"{_name(t)} {t['prob']:.3f}" for t in result["labels"])
            many = len(result["labels"])
            return (f"{result['image']}: {found} ({many} label{'s' * (many != 1)} at or "
                    f"above {threshold:g})")
        best = max(range(len(result["probs"])), key=result["probs"].__getitem__)
        name = names[best] if best < len(names) else f"#{best}"
        return (f"{result['image']}: no label at or above {threshold:g} (highest: {name} "
                f"{result['probs'][best]:.3f})")
    tops = ", ".join(f"{_name(t)} ({t['prob']:.3f})" for t in result["top_k"])
    return f"{result['image']}: {tops}"


def _name(t: dict) -> str:
    return t["label"] if t["label"] is not None else f"#{t['index']}"


def _prob(p: float) -> str:
    return repr(float(p))  # every digit the float has: nothing lost on the way to a table


def _csv_header(predictor) -> list[str]:
    if predictor.mode == "prompts":
        return ["image", "prompt", "prob", "error"]
    if predictor.mode == "multi_label":
        return ["image", "labels", *(f"prob:{n}" for n in label_names(predictor)), "error"]
    cells = ["image"]
    for r in range(1, predictor.top_k + 1):
        cells += [f"top{r}_label", f"top{r}_prob", f"top{r}_index"]
    return cells + ["error"]


def label_names(predictor) -> list[str]:
    """The class names to show, `#i` where the checkpoint names none."""
    count = len(predictor.labels) if predictor.labels else predictor.num_classes
    return [predictor.labels[i] if predictor.labels else f"#{i}" for i in range(count)]
