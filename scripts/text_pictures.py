"""docs/img/text_fashion_scenes.png and docs/img/text_relevancy.png, from the runs the text
records train (`python -m benchmarks text` and `python -m benchmarks text --config
fashion_scenes --record fashion_scenes`: runs/bench_promptshapes, runs/bench_fashion_scenes).

    python scripts/text_pictures.py
"""

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vit.checkpoints import load_checkpoint  # noqa: E402
from vit.data import open_source  # noqa: E402
from vit.data.fashion_scenes import CLASSES, REGIONS, question_text, truth  # noqa: E402
from vit.explanations import explain_prompt  # noqa: E402
from vit.models.text import tokenize  # noqa: E402


def prepared(image, pre):
    x = image.astype(np.float32) * pre.rescale_factor
    return jnp.asarray((x - np.array(pre.mean)) / np.array(pre.std))[None]


def scene_image(source, scene: int):
    return next(source[j] for j in range(len(source)) if source[j]["image_id"] == scene)["image"]


def yes_probs(loaded, model, image, prompts):
    tokens, mask = tokenize(prompts, model.config.text.max_len)
    logits = model.answer_prompts(prepared(image, loaded.preprocessing), jnp.asarray(tokens),
                                  jnp.asarray(mask))
    return np.asarray(jax.nn.sigmoid(logits))[0]


def answers_picture(loaded, model, source, path):
    """The first three test scenes, each asked a class, a class-in-region and a two-class
    question."""
    _, axes = plt.subplots(1, 3, figsize=(7.3, 3.1))
    for ax, i in zip(axes, range(3), strict=True):
        cells = source.data.scenes[i]
        present = [CLASSES[c] for c in cells if c >= 0]
        absent = [c for c in CLASSES if c not in present]
        region = next(r for r in REGIONS if truth(cells, "region", (present[0], r)))
        prompts = [question_text("class", absent[0]),
                   question_text("region", (present[0], region)),
                   question_text("both", (present[-1], absent[1]))]
        image = scene_image(source, i)
        probs = yes_probs(loaded, model, image, prompts)
        ax.imshow(image)
        ax.axis("off")
        ax.set_title("\n".join(f"{q} {'yes' if p > 0.5 else 'no'} ({p:.2f})"
                               for q, p in zip(prompts, probs, strict=True)),
                     fontsize=6.5, y=-0.32, loc="left")
    plt.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.2, wspace=0.03)
    plt.savefig(path, dpi=100)


def relevancy_picture(rows, path):
    """Per row a scene and the relevancy overlay of two questions about it."""
    _, axes = plt.subplots(len(rows), 3, figsize=(7.3, 6))
    for r, (loaded, model, source, scene, prompts) in enumerate(rows):
        image = scene_image(source, scene)
        axes[r, 0].imshow(image)
        axes[r, 0].set_title("the scene", fontsize=7, y=-0.12, loc="left")
        for c, prompt in enumerate(prompts, 1):
            ex = explain_prompt(model, prepared(image, loaded.preprocessing), prompt)
            heat = np.asarray(ex.maps[0])
            heat = (heat - heat.min()) / (np.ptp(heat) + 1e-9)
            h, w = image.shape[:2]
            axes[r, c].imshow(image)
            axes[r, c].imshow(heat, cmap="jet", alpha=0.5, interpolation="bilinear",
                              extent=(-0.5, w - 0.5, h - 0.5, -0.5))
            axes[r, c].set_title(f"{prompt}\np(yes) = {float(ex.probs[0]):.2f}", fontsize=7,
                                 y=-0.2, loc="left")
        for ax in axes[r]:
            ax.axis("off")
    plt.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.08, wspace=0.03, hspace=0.3)
    plt.savefig(path, dpi=100)


def main():
    scenes = load_checkpoint("runs/bench_fashion_scenes")
    scenes_model, scenes_test = scenes.build_model(), open_source("fashion_scenes", "test")
    shapes = load_checkpoint("runs/bench_promptshapes")
    answers_picture(scenes, scenes_model, scenes_test, "docs/img/text_fashion_scenes.png")
    # A seen question and a held-out one (promptshapes' blue circle, fashion_scenes' bag at
    # the top) of one test scene each.
    relevancy_picture([
        (shapes, shapes.build_model(), open_source("promptshapes", "test"), 0,
         ["is there a green triangle?", "is there a blue circle?"]),
        (scenes, scenes_model, scenes_test, 2, ["is there a boot?", "is there a bag at the top?"]),
    ], "docs/img/text_relevancy.png")


if __name__ == "__main__":
    main()
