"""`vit eval` on a text model: prompt-answer accuracy, the shuffled/null-prompt and
blank-image controls, and the held-out split."""

from __future__ import annotations

from vit.commands.eval_shared import batch_size, save_report, scorer
from vit.errors import DataError


def eval_prompts(args, loaded, source, name, data_dir, split, heldout, out) -> int:
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
    score = scorer(loaded, batch_size(args, source), "prompt_xent",
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
    if save_report(args, out, report):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} (image, prompt) examples")
    print(f"  answer accuracy {res['accuracy']:.4f}")
    print("  controls (chance is 0.5): " + ", ".join(
        f"{k} {v:.4f}" for k, v in report["controls"].items()))
    if heldout:
        print(f"  held-out ({heldout}) accuracy {report['heldout_accuracy']:.4f}")
    print(f"  figures {out / 'eval.json'}")
    return 0
