"""`vit eval`: top-1 / top-5 / per-class accuracy and a confusion-matrix PNG; for a text
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
from vit.commands.checks import check_output_dir, require_positive, write_outputs
from vit.errors import ConfigError, DataError


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
                        help="folder for confusion.png and eval.json "
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
    from vit.inference.evaluate import confusion_png, display_name

    require_positive(args, "batch_size")
    if args.workdir:
        config = _workdir_config(args.workdir)
        name, data_dir = config.data.name, config.data.data_dir
        split = args.split or config.data.test_split or "test"
        out = check_output_dir(args.out or Path(args.workdir) / f"eval_{_safe(split)}",
                               "--out")  # before the evaluation, not after it
        loaded = load_checkpoint(args.workdir, **inference_options.with_dtype(args, {}))
    else:
        if not args.data:
            raise ConfigError("--checkpoint needs --data NAME (digits, tfds:NAME or a folder)")
        name, data_dir, split = args.data, args.data_dir, args.split or "test"
        out = check_output_dir(args.out or f"eval_{_safe(split)}", "--out")
        loaded = load_checkpoint(args.checkpoint, **inference_options.with_dtype(args, {}))
    source = open_source(name, split, data_dir=data_dir)
    if loaded.config.text is not None:  # a text model answers prompts: score its answers
        heldout = args.heldout_split if args.heldout_split is not None else (
            config.data.get("heldout_split") if args.workdir else None)
        return _eval_prompts(args, loaded, source, name, data_dir, split, heldout, out)
    class_names = source.class_names
    if loaded.config.num_classes != len(class_names):
        raise ConfigError(f"the checkpoint has {loaded.config.num_classes} classes but "
                          f"{source.name} has {len(class_names)}; evaluate on its own dataset")
    if loaded.labels and list(loaded.labels) != list(class_names):
        print(f"warning: checkpoint labels {loaded.labels[:3]}... differ from the dataset's "
              f"{class_names[:3]}...; scoring by index", file=sys.stderr)

    res = _scorer(loaded, _batch(args, source), "softmax_xent")(source)
    shown = [display_name(c) for c in class_names]  # a folder name that is not UTF-8, too
    report = {"checkpoint": loaded.source, "data": source.name, "split": split,
              "accuracy": res["accuracy"], "top5_accuracy": res["top5_accuracy"],
              "num_examples": res["num_examples"], "loss": res["loss"],
              "per_class_accuracy": dict(zip(shown, res["per_class_accuracy"], strict=True)),
              "confusion_png": str(out / "confusion.png")}
    png = confusion_png(res["confusion"], class_names)
    if _save_report(args, out, report, {"confusion.png": png}, confusion=res["confusion"]):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} images")
    print(f"  top-1 accuracy {res['accuracy']:.4f}")
    print(f"  top-5 accuracy {res['top5_accuracy']:.4f}")
    worst = sorted(report["per_class_accuracy"].items(), key=lambda kv: kv[1])[:5]
    print("  lowest per-class: " + ", ".join(f"{k} {v:.3f}" for k, v in worst))
    print(f"  confusion matrix {out / 'confusion.png'}, figures {out / 'eval.json'}")
    return 0


def _eval_prompts(args, loaded, source, name, data_dir, split, heldout, out) -> int:
    """A text model: answer accuracy on the split, the same examples under each control
    (shuffled prompt, null prompt, blank image), and on the held-out split when there is one."""
    import functools

    from vit.data import open_source
    from vit.data.prompt_controls import CONTROLS, PromptControl
    from vit.models.text import tokenize

    if len(source) and "prompt" not in source[0]:  # before the model is built
        raise DataError(f"{source.name} has no prompts, and {loaded.source} is a text model "
                        "that answers them; evaluate it on a dataset with prompts, e.g. "
                        "--data promptshapes")
    score = _scorer(loaded, _batch(args, source), "prompt_xent",
                    tokenize=functools.partial(tokenize, max_len=loaded.config.text.max_len))
    res = score(source)
    report = {"checkpoint": loaded.source, "data": source.name, "split": split,
              "accuracy": res["accuracy"], "loss": res["loss"],
              "num_examples": res["num_examples"],
              "controls": {kind: score(PromptControl(source, kind))["accuracy"]
                           for kind in CONTROLS}}
    if heldout:
        report["heldout_split"] = heldout
        report["heldout_accuracy"] = score(open_source(name, heldout,
                                                       data_dir=data_dir))["accuracy"]
    if _save_report(args, out, report):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} (image, prompt) examples")
    print(f"  answer accuracy {res['accuracy']:.4f}")
    print("  controls (chance is 0.5): " + ", ".join(
        f"{k} {v:.4f}" for k, v in report["controls"].items()))
    if heldout:
        print(f"  held-out ({heldout}) accuracy {report['heldout_accuracy']:.4f}")
    print(f"  figures {out / 'eval.json'}")
    return 0


def _scorer(loaded, batch_size: int, task: str, tokenize=None):
    """`score(source) -> figures` (`vit.inference.evaluate.evaluate_task`'s) for the loaded
    checkpoint's model, run on every local device with batches padded to fit them."""
    from flax import nnx

    from vit import device_mesh
    from vit.data import eval_batches
    from vit.inference.evaluate import evaluate_task, make_logits_fn
    from vit.inference.memory import check_fits

    check_fits(loaded.config, batch_size, lower=("--batch-size",))  # before the model is built
    graphdef, params = nnx.split(loaded.build_model(), nnx.Param)
    mesh = device_mesh.local_mesh()
    logits_fn = make_logits_fn(graphdef, mesh)
    host_batch = device_mesh.eval_host_batch_size(batch_size, mesh)
    num_classes = loaded.config.num_classes

    def score(source) -> dict:
        batches = eval_batches(source, loaded.preprocessing, batch_size=host_batch,
                               tokenize=tokenize)
        return evaluate_task(task, logits_fn, params, batches, num_classes, mesh)

    return score


def _batch(args, source) -> int:
    """`--batch-size`, no larger than the examples there are: a batch is padded to its size,
    so `--batch-size 100000000` would otherwise allocate that many images."""
    return max(1, min(args.batch_size, len(source)))


def _save_report(args, out: Path, report: dict, files: dict | None = None, **more) -> bool:
    """Writes `OUT/eval.json` (the report and `more`) and `files`, whole or not at all; with
    `--json` prints the report too and returns True: the command has nothing more to print."""
    text = json.dumps({**report, **more}, indent=2)
    write_outputs(out, {**(files or {}), "eval.json": text.encode()})
    if args.json:
        print(json.dumps(report))
    return args.json


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
