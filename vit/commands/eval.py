"""`vit eval`: top-1 / top-5 / per-class accuracy, per-class precision / recall / F1, expected
calibration error, a confusion-matrix PNG and a reliability diagram; for a text
model, prompt-answer accuracy, the shuffled/null-prompt and blank-image controls, and the
held-out split.

    vit eval --workdir runs/demo [--split test] [--json]          # a training run's own data
    vit eval --checkpoint PATH --data NAME --split SPLIT [--json] # any checkpoint, any dataset
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vit.commands import inference_options
from vit.commands.checks import check_output_dir, require_positive
from vit.commands.eval_shared import batch_size, save_report, scorer
from vit.errors import ConfigError


def add_arguments(parser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help="a `vit train` workdir: its best (else latest) "
                                         "checkpoint, on its config's dataset")
    where.add_argument("--checkpoint", help="any checkpoint vit reads (needs --data)")
    parser.add_argument("--data", help="dataset: digits, tfds:NAME or an image folder")
    parser.add_argument("--data-dir", default=None, help="TFDS data_dir")
    parser.add_argument("--split", default=None,
                        help="split (default: the run's test split, else 'test')")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", default=None,
                        help="folder for confusion.png, reliability.png and eval.json "
                             "(default WORKDIR/eval_SPLIT, or ./eval_SPLIT)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    inference_options.add_arguments(parser)
    parser.add_argument("--heldout-split", default=None,
                        help="text models: also score this split (default: the run's "
                             "data.heldout_split, e.g. promptshapes' unseen colour-shape pairs)")


def run(args) -> int:
    inference_options.start(args)  # before anything compiles
    from vit.checkpoints import load_checkpoint
    from vit.data import open_source
    from vit.data.sources import labels_named
    from vit.inference.evaluate import confusion_png, display_name, reliability_png

    require_positive(args, "batch_size")
    if args.workdir:
        config = _workdir_config(args.workdir)
        name, data_dir = config.data.name, config.data.data_dir
        labels = config.data.get("labels")  # the labels the run trained on
        split = args.split or config.data.test_split or "test"
        out = check_output_dir(args.out or Path(args.workdir) / f"eval_{_safe(split)}",
                               "--out")  # before the evaluation, not after it
        loaded = load_checkpoint(args.workdir, named="--workdir",
                                 **inference_options.with_dtype(args, {}))
    else:
        if not args.data:
            raise ConfigError("--checkpoint needs --data NAME (digits, tfds:NAME or a folder)")
        name, data_dir, split = args.data, args.data_dir, args.split or "test"
        out = check_output_dir(args.out or f"eval_{_safe(split)}", "--out")
        loaded = load_checkpoint(args.checkpoint, **inference_options.with_dtype(args, {}))
        labels = labels_named(name, loaded.labels)  # the labels the checkpoint learned
    source = open_source(name, split, data_dir=data_dir, labels=labels)
    if loaded.config.text is not None:  # a text model answers prompts: score its answers
        heldout = args.heldout_split if args.heldout_split is not None else (
            config.data.get("heldout_split") if args.workdir else None)
        from vit.commands.eval_prompts import eval_prompts

        return eval_prompts(args, loaded, source, name, data_dir, split, heldout, out,
                            labels=labels)
    class_names = source.class_names
    if loaded.config.num_classes != len(class_names):
        raise ConfigError(f"the checkpoint has {loaded.config.num_classes} classes but "
                          f"{source.name} has {len(class_names)}; evaluate on its own dataset")
    if loaded.labels and list(loaded.labels) != list(class_names):
        print(f"warning: checkpoint labels {loaded.labels[:3]}... differ from the dataset's "
              f"{class_names[:3]}...; scoring by index", file=sys.stderr)
    shown = [display_name(c) for c in class_names]  # a folder name that is not UTF-8, too
    if _multi_label(args, source):
        return _eval_multilabel(args, loaded, source, split, out, shown)

    res = scorer(loaded, batch_size(args, source), "softmax_xent")(source)
    report = {"checkpoint": loaded.source, "data": source.name, "split": split,
              "accuracy": res["accuracy"], "top5_accuracy": res["top5_accuracy"],
              "num_examples": res["num_examples"], "loss": res["loss"],
              "per_class_accuracy": dict(zip(shown, res["per_class_accuracy"], strict=True)),
              "per_class": _per_class(shown, res),
              **{k: res[k] for k in ("macro_precision", "macro_recall", "macro_f1",
                                     "expected_calibration_error", "calibration")},
              "confusion_png": str(out / "confusion.png"),
              "reliability_png": str(out / "reliability.png")}
    figures = {"confusion.png": confusion_png(res["confusion"], class_names),
               "reliability.png": reliability_png(res["calibration"])}
    if save_report(args, out, report, figures, confusion=res["confusion"]):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} images")
    print(f"  top-1 accuracy {res['accuracy']:.4f}")
    print(f"  top-5 accuracy {res['top5_accuracy']:.4f}")
    print(f"  macro precision {res['macro_precision']:.4f}, recall {res['macro_recall']:.4f}, "
          f"F1 {res['macro_f1']:.4f}")
    print(f"  expected calibration error {res['expected_calibration_error']:.4f} "
          f"({res['calibration']['bins']} bins)")
    worst = sorted(report["per_class_accuracy"].items(), key=lambda kv: kv[1])[:5]
    print("  lowest per-class: " + ", ".join(f"{k} {v:.3f}" for k, v in worst))
    print(f"  confusion matrix {out / 'confusion.png'}, reliability diagram "
          f"{out / 'reliability.png'}, figures {out / 'eval.json'}")
    return 0


def _multi_label(args, source) -> bool:
    """Scored label by label when the data is multi-hot or the checkpoint records training with
    sigmoid_xent (as training's own validation scores it)."""
    from vit.inference.recorded_loss import recorded_loss

    if getattr(source, "multi_label", False):
        return True
    return recorded_loss(args.workdir or args.checkpoint)[0] == "sigmoid_xent"


def _eval_multilabel(args, loaded, source, split: str, out: Path, shown: list[str]) -> int:
    """Exact-match and per-label accuracy, each label's precision / recall / F1 at sigmoid 0.5
    (no confusion matrix or calibration: the labels do not compete)."""
    res = scorer(loaded, batch_size(args, source), "sigmoid_xent")(source)
    report = {"checkpoint": loaded.source, "data": source.name, "split": split,
              "task": "multi_label", "accuracy": res["accuracy"],
              "label_accuracy": res["label_accuracy"], "num_examples": res["num_examples"],
              "loss": res["loss"], "per_class": _per_class(shown, res),
              **{k: res[k] for k in ("macro_precision", "macro_recall", "macro_f1")}}
    if save_report(args, out, report):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} images, multi-label")
    print(f"  exact-match accuracy {res['accuracy']:.4f} (every label right)")
    print(f"  per-label accuracy {res['label_accuracy']:.4f}")
    print(f"  macro precision {res['macro_precision']:.4f}, recall {res['macro_recall']:.4f}, "
          f"F1 {res['macro_f1']:.4f}")
    worst = sorted(report["per_class"].items(), key=lambda kv: kv[1]["f1"])[:5]
    print("  lowest F1: " + ", ".join(f"{k} {v['f1']:.3f}" for k, v in worst))
    print(f"  figures {out / 'eval.json'}")
    return 0


def _per_class(shown: list[str], res: dict) -> dict:
    """{class: {precision, recall, f1, support}} in the dataset's class order."""
    keys = ("precision", "recall", "f1", "support")
    return {name: {k: res[k][i] for k in keys} for i, name in enumerate(shown)}


def _workdir_config(workdir):
    """The run's resolved recipe (`WORKDIR/config.json`), with the fields eval reads."""
    import ml_collections

    config_file = Path(workdir) / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{workdir}: no config.json; is it a `vit train` workdir?")
    try:
        config = ml_collections.ConfigDict(json.loads(config_file.read_text()))
        _ = config.data.name, config.data.data_dir, config.data.test_split  # all present
    except (ValueError, AttributeError, KeyError, TypeError) as err:
        raise ConfigError(f"{config_file}: not a readable `vit train` config ({err}); rerun "
                          "`vit train` into a new workdir, or use --checkpoint and --data") \
            from None
    return config


def _safe(split: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in split)
