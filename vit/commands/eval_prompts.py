"""`vit eval` on a text model: prompt-answer accuracy, the shuffled/null-prompt and
blank-image controls, the held-out split, and on a prompt dataset with a question grid
(`promptshapes`, `fashion_scenes`) every question asked of every test image
(`vit.inference.questions`)."""

from __future__ import annotations

from vit.commands.eval_shared import batch_size, save_report, scorer
from vit.errors import DataError


def eval_prompts(args, loaded, source, name, data_dir, split, heldout, out, *,
                 labels: str | None = None) -> int:
    """A text model: answer accuracy on the split, the same examples under each control
    (shuffled prompt, null prompt, blank image), and on the held-out split when there is one
    (opened with the same `labels`, the recipe's `data.labels`)."""
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
        report["heldout_accuracy"] = score(open_source(name, heldout, data_dir=data_dir,
                                                       labels=labels))["accuracy"]
    if hasattr(source, "question_grid"):
        report["questions"] = every_question(loaded, source)
    if save_report(args, out, report):
        return 0
    print(f"{loaded.source} on {source.name}: {res['num_examples']} (image, prompt) examples")
    print(f"  answer accuracy {res['accuracy']:.4f}")
    print("  controls (chance is 0.5): " + ", ".join(
        f"{k} {v:.4f}" for k, v in report["controls"].items()))
    if heldout:
        print(f"  held-out ({heldout}) accuracy {report['heldout_accuracy']:.4f}")
    if "questions" in report:
        print_questions(report["questions"])
    print(f"  figures {out / 'eval.json'}")
    return 0


def every_question(loaded, source) -> dict:
    """Every question of the source's grid (for promptshapes every colour x shape question, the
    evaluation-only wordings, never-drawn words and prompts of unknown words) asked of every
    image of the split."""
    import numpy as np
    from PIL import Image

    from vit.inference.prompts import encode_prompts
    from vit.inference.questions import ask_every_prompt, question_figures

    grid, shares = source.question_grid()
    images = np.stack([loaded.preprocessing(Image.fromarray(im)) for im in source.data.images])
    prompts = encode_prompts(loaded.config, [q["prompt"] for q in grid])
    probs = ask_every_prompt(loaded.build_model(), images, prompts.text, prompts.mask)
    kinds = [q["kind"] for q in grid] if all("kind" in q for q in grid) else None
    return question_figures(probs, shares == "present", [q["group"] for q in grid], shares,
                            kinds=kinds)


def print_questions(figures: dict) -> None:
    print(f"  every question asked of each of {figures['images']} images:")
    for group in ("seen", "heldout", "wording"):
        g = figures.get(group)
        if g:
            auc = "n/a" if g["auc"] is None else f"{g['auc']:.4f}"
            false_yes = ", ".join(f"{k} {v:.3f}" for k, v in g["false_yes"].items()
                                  if v is not None)
            print(f"    {group:8s} balanced accuracy {g['balanced_accuracy']:.4f}, AUC {auc}; "
                  f"false yes: {false_yes}")
    if "never" in figures:
        print(f"    never-drawn words: yes-rate {figures['never']['yes_rate']:.4f}")
    if "unknown" in figures:
        print(f"    prompts of no word seen in training: yes-rate "
              f"{figures['unknown']['yes_rate']:.4f}")
