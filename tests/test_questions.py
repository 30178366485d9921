"""Every question asked of every image: the figures against scikit-learn's on hand-built models
whose answers are known, and each prompt encoded once per batch."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

import vit
from vit.commands.eval_prompts import every_question
from vit.data import promptshapes as ps
from vit.inference.questions import balanced_accuracy, question_figures, ranking_auc
from vit.models import text as text_lib

N = 40  # test scenes


def test_balanced_accuracy_and_auc_match_sklearn():
    rng = np.random.default_rng(0)
    truth = rng.random(300) < 0.2  # rare "yes": plain accuracy would flatter "always no"
    scores = np.round(rng.random(300) + 0.5 * truth, 1)  # rounded: many ties
    assert balanced_accuracy(truth, scores) == pytest.approx(
        balanced_accuracy_score(truth, scores > 0.5))
    assert ranking_auc(truth, scores) == pytest.approx(roc_auc_score(truth, scores))
    assert balanced_accuracy(truth, np.zeros(300)) == 0.5  # always "no"
    assert ranking_auc(truth, -scores) == pytest.approx(1 - roc_auc_score(truth, scores))
    assert ranking_auc(np.ones(5, bool), np.arange(5)) is None


class LookupModel(nnx.Module):
    """A hand-built "model": image i (its index written in pixel [0, 0, 0]) answers prompt j with
    the probability `table[i, j]`, whatever the text says."""

    def __init__(self, table: np.ndarray):
        self.table = nnx.Variable(jnp.asarray(table, jnp.float32))

    def answer_prompts(self, images, text, mask):
        rows = jnp.round(images[:, 0, 0, 0]).astype(jnp.int32)
        p = jnp.clip(self.table[...][rows], 1e-6, 1 - 1e-6)
        assert text.shape[0] == self.table.shape[1]  # every prompt, once
        return jnp.log(p) - jnp.log1p(-p)


def _fake_run(table, data):
    """`every_question` over `data` with the lookup model standing in for a checkpoint."""
    indexed = np.array(data.images)
    indexed[:, 0, 0, 0] = np.arange(len(indexed))
    loaded = types.SimpleNamespace(
        config=types.SimpleNamespace(text=vit.TextConfig(max_len=48)),
        preprocessing=lambda image: np.asarray(image, np.float32),
        build_model=lambda: LookupModel(table))
    source = types.SimpleNamespace(name="promptshapes",
                                   data=types.SimpleNamespace(images=indexed, labels=data.labels))
    source.question_grid = lambda: ps.DATASET.question_grid(source.data)
    return every_question(loaded, source)


def test_figures_of_a_model_that_reads_only_the_colour():
    """Says yes (0.9) when the question's colour is anywhere in the scene, else 0.1 (0.2 for
    never-drawn words): every figure is known from the scene's pairs alone."""
    data = ps.generate("test", N, seed=1)
    grid = ps.grid_questions()
    table = np.zeros((N, len(grid)))
    truth = np.zeros((N, len(grid)), bool)
    for i, row in enumerate(data.labels):
        present = {ps.PAIRS[k] for k in np.flatnonzero(row)}
        for j, q in enumerate(grid):
            if q["pair"] is None:
                table[i, j] = 0.2 if j % 3 else 0.7  # a third of never-drawn questions: yes
                continue
            table[i, j] = 0.9 if any(c == q["pair"][0] for c, _ in present) else 0.1
            truth[i, j] = q["pair"] in present
    figures = _fake_run(table, data)
    assert figures["images"] == N
    for group in ("seen", "heldout", "wording"):
        cols = [j for j, q in enumerate(grid) if q["group"] == group]
        t, p = truth[:, cols].ravel(), table[:, cols].ravel()
        g = figures[group]
        assert g["questions"] == len(cols)
        assert g["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(t, p > 0.5))
        assert g["auc"] == pytest.approx(roc_auc_score(t, p))
        assert g["yes_recall"] == 1.0  # a present pair's colour is present
        # a colour reader says yes exactly when the scene shares the colour
        assert g["false_yes"] == {"neither": 0.0, "colour_only": 1.0, "shape_only": 0.0,
                                  "both_apart": 1.0}
    never = [j for j, q in enumerate(grid) if q["group"] == "never"]
    assert figures["never"]["yes_rate"] == pytest.approx(np.mean(table[:, never] > 0.5))
    assert figures["never"]["questions"] == len(never)


def test_figures_of_a_perfect_and_a_backwards_model():
    data = ps.generate("test", N, seed=2)
    grid = ps.grid_questions()
    truth = np.array([[q["pair"] is not None and bool(row[ps.PAIRS.index(q["pair"])])
                       for q in grid] for row in data.labels])
    perfect = _fake_run(np.where(truth, 0.8, 0.3), data)
    backwards = _fake_run(np.where(truth, 0.3, 0.8), data)
    for group in ("seen", "heldout", "wording"):
        assert perfect[group]["balanced_accuracy"] == 1.0 and perfect[group]["auc"] == 1.0
        assert backwards[group]["balanced_accuracy"] == 0.0 and backwards[group]["auc"] == 0.0
        assert set(perfect[group]["false_yes"].values()) == {0.0}
    assert perfect["never"]["yes_rate"] == 0.0 and backwards["never"]["yes_rate"] == 1.0
    # the figures for each share of a "no" come from the right questions: by hand
    g = question_figures(np.array([[0.9, 0.9, 0.1, 0.9]]), np.array([[True, False, False, False]]),
                         ["seen"] * 4, np.array([["present", "neither", "neither", "shape_only"]]))
    assert g["seen"]["false_yes"] == {"neither": 0.5, "colour_only": None, "shape_only": 1.0,
                                      "both_apart": None}
    assert g["seen"]["balanced_accuracy"] == pytest.approx((1.0 + 1 / 3) / 2)


def _text_model():
    model = vit.create_model(
        "Ti/16", num_classes=0, image_size=32, width=64, depth=3, num_heads=2, mlp_dim=64,
        text=vit.TextConfig(xattn_start=1, width=32, depth=1, num_heads=2, mlp_dim=32,
                            max_len=24), rngs=nnx.Rngs(3))
    for block in model.xattn:  # open the gates: the text changes the answer
        block.attn_gate.value = jnp.float32(0.7)
        block.mlp_gate.value = jnp.float32(-0.4)
    return model


PROMPTS = ["is there a red cross?", "", "Blue", "is there a green square"]


@pytest.mark.slow
def test_each_prompt_is_encoded_once_per_batch_and_answers_equal_per_image_encoding(monkeypatch):
    model = _text_model()
    images = jax.random.normal(jax.random.key(1), (5, 32, 32, 3))
    tokens, mask = vit.tokenize(PROMPTS, 24)
    per_image = model(images, text=jnp.broadcast_to(tokens, (5, *tokens.shape)),
                      text_mask=jnp.broadcast_to(mask, (5, *mask.shape)))
    rows = []
    encode = text_lib.ByteTextEncoder.__call__

    def counting(self, tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return encode(self, tokens, *args, **kwargs)

    monkeypatch.setattr(text_lib.ByteTextEncoder, "__call__", counting)
    shared = model.answer_prompts(images, jnp.asarray(tokens), jnp.asarray(mask))
    assert rows == [len(PROMPTS)]  # 4 prompts encoded, not 5 x 4
    np.testing.assert_allclose(shared, per_image, rtol=1e-5, atol=1e-5)
    # and the forward of `vit predict --prompt`
    from vit.inference.prompts import encode_prompts, prompts_forward

    prompts = encode_prompts(model.config, PROMPTS)
    graphdef, state = nnx.split(model)
    rows.clear()
    forward, extra = prompts_forward(lambda s: nnx.merge(graphdef, s), prompts)
    (probs,) = forward(state, images, *extra)
    assert rows == [len(PROMPTS)]
    np.testing.assert_allclose(probs, jax.nn.sigmoid(per_image), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_case_never_matters_to_the_byte_encoder():
    model = _text_model()
    images = jax.random.normal(jax.random.key(2), (2, 32, 32, 3))
    tokens, mask = vit.tokenize(["is there a red cross?", "IS There A Red CROSS?",
                                 "is there a bed cross?"], 24)
    logits = np.asarray(model.answer_prompts(images, jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(logits[:, 0], logits[:, 1], rtol=1e-6, atol=1e-6)
    assert np.abs(logits[:, 0] - logits[:, 2]).max() > 1e-4  # a different word does matter
