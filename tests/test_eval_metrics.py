"""`vit eval`'s classifier figures beyond accuracy: per-class precision / recall / F1 against
scikit-learn, expected calibration error against a plain numpy formula, the reliability
diagram."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from vit import device_mesh
from vit.cli import main
from vit.inference.evaluate import evaluate

pytestmark = pytest.mark.timeout(300)


def _score(logits, labels, num_classes, batch=7):
    """`evaluate` over fake batches of these logits (padding rows masked out), no model."""
    mesh = device_mesh.make_mesh(1)
    batches, rows = [], len(labels)
    for start in range(0, rows, batch):
        part = np.zeros((batch, num_classes), np.float32)
        lab = np.zeros(batch, np.int32)
        mask = np.zeros(batch, np.float32)
        n = min(batch, rows - start)
        part[:n], lab[:n], mask[:n] = logits[start:start + n], labels[start:start + n], 1
        part[n:] = 1e3  # padding rows that would wreck every figure if they were counted
        batches.append({"image": part, "label": lab, "mask": mask})

    def logits_fn(params, inputs):
        return inputs["image"]  # the "images" are the logits themselves

    return evaluate(logits_fn, None, batches, num_classes, mesh)


def numpy_ece(logits, labels, bins=15):
    """Guo et al.'s ECE: equal-width bins (lo, hi] of the top-1 softmax confidence, the
    count-weighted mean of |accuracy - mean confidence|."""
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, right = p.max(1), p.argmax(1) == labels
    edges = np.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            ece += inside.mean() * abs(right[inside].mean() - conf[inside].mean())
    return ece


def test_precision_recall_f1_and_ece_match_the_references():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.RandomState(0)
    n, c = 200, 6
    labels = rng.randint(0, c - 1, n)  # class 5 never occurs: recall 0/0, sklearn's 0
    logits = (rng.randn(n, c) * 2).astype(np.float32)
    logits[np.arange(n), labels] += 1.5  # better than chance, not perfect
    res = _score(logits, labels, c)

    want_p, want_r, want_f, want_s = sklearn_metrics.precision_recall_fscore_support(
        labels, logits.argmax(1), labels=list(range(c)), zero_division=0)
    np.testing.assert_allclose(res["precision"], want_p, atol=1e-12)
    np.testing.assert_allclose(res["recall"], want_r, atol=1e-12)
    np.testing.assert_allclose(res["f1"], want_f, atol=1e-12)
    assert res["support"] == want_s.tolist()
    macro = sklearn_metrics.precision_recall_fscore_support(
        labels, logits.argmax(1), labels=list(range(c)), average="macro", zero_division=0)
    assert (res["macro_precision"], res["macro_recall"], res["macro_f1"]) == pytest.approx(
        macro[:3], abs=1e-12)
    assert 0.3 < res["accuracy"] < 0.95  # a case where the figures are not trivial

    assert res["expected_calibration_error"] == pytest.approx(numpy_ece(logits, labels),
                                                              abs=1e-6)  # float32 softmax
    cal = res["calibration"]
    assert cal["bins"] == 15 and sum(cal["count"]) == n
    # The existing keys training's validation reads are still there.
    assert {"accuracy", "top5_accuracy", "loss", "num_examples", "per_class_accuracy",
            "confusion"} <= set(res)


def test_an_over_confident_model_has_a_large_ece_and_a_calibrated_one_a_small_one():
    rng = np.random.RandomState(1)
    n, c = 400, 4
    labels = rng.randint(0, c, n)
    # Over-confident: a logit margin of 8 (top-1 probability ~0.999) on a class that is right
    # only half the time.
    guess = np.where(rng.rand(n) < 0.5, labels, (labels + 1) % c)
    sure = np.zeros((n, c), np.float32)
    sure[np.arange(n), guess] = 8.0
    bold = _score(sure, labels, c)
    assert bold["accuracy"] == pytest.approx(0.5, abs=0.07)
    assert bold["expected_calibration_error"] > 0.2  # about 0.5
    # Calibrated: every answer drawn from the model's own probabilities.
    logits = rng.randn(n * 10, c).astype(np.float32)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    drawn = np.array([rng.choice(c, p=row) for row in p])
    assert _score(logits, drawn, c)["expected_calibration_error"] < 0.05


@pytest.mark.slow
def test_vit_eval_writes_the_reliability_diagram_and_names_it(tiny_files, tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(["eval", "--checkpoint", str(tiny_files["orbax"]), "--data", "digits",
                 "--split", "test", "--out", str(out), "--json", "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reliability_png"] == str(out / "reliability.png")
    png = Image.open(io.BytesIO((out / "reliability.png").read_bytes()))
    assert png.format == "PNG" and png.size[0] > 100
    first = next(iter(report["per_class"].values()))
    assert len(report["per_class"]) == 10 and set(first) == {"precision", "recall", "f1", "support"}
    assert sum(v["support"] for v in report["per_class"].values()) == report["num_examples"]
    assert 0 <= report["expected_calibration_error"] <= 1
    assert json.loads((out / "eval.json").read_text())["macro_f1"] == report["macro_f1"]

    assert main(["eval", "--checkpoint", str(tiny_files["orbax"]), "--data", "digits",
                 "--split", "test", "--out", str(tmp_path / "ev2"), "--no-cache"]) == 0
    printed = capsys.readouterr().out
    assert "expected calibration error" in printed and "macro precision" in printed
    assert str(tmp_path / "ev2" / "reliability.png") in printed


def test_multilabel_precision_recall_f1_match_sklearn_and_the_old_keys_stay():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    from vit.inference.evaluate import evaluate_task

    rng = np.random.RandomState(2)
    n, c = 60, 5
    target = (rng.rand(n, c) < 0.4).astype(np.float32)
    target[:, 4] = 0  # a label never present: recall 0/0, sklearn's 0
    logits = (rng.randn(n, c) + 2.0 * (target - 0.5)).astype(np.float32)
    batch = {"image": logits, "label": target, "mask": np.ones(n, np.float32)}
    res = evaluate_task("sigmoid_xent", lambda params, inputs: inputs["image"], None, [batch], c,
                        device_mesh.make_mesh(1))
    want = sklearn_metrics.precision_recall_fscore_support(
        target.astype(int), (logits > 0).astype(int), zero_division=0)
    for key, values in zip(("precision", "recall", "f1"), want[:3], strict=False):
        np.testing.assert_allclose(res[key], values, atol=1e-12)
    assert res["support"] == want[3].tolist()
    macro = sklearn_metrics.precision_recall_fscore_support(
        target.astype(int), (logits > 0).astype(int), average="macro", zero_division=0)
    assert res["macro_f1"] == pytest.approx(macro[2], abs=1e-12)
    assert res["accuracy"] == pytest.approx(np.mean(((logits > 0) == (target > 0.5)).all(1)))
    assert {"accuracy", "label_accuracy", "loss", "num_examples"} <= set(res)


@pytest.mark.parametrize("task", ["softmax_xent", "sigmoid_xent", "prompt_xent"])
def test_the_loss_is_optax_mean_over_the_real_rows(task):
    """Each task's loss, the mean over the rows that are not padding, against optax's losses
    (large logits too, where a naive formula overflows)."""
    import optax

    from vit.inference.evaluate import evaluate_task

    rng = np.random.RandomState(3)
    n, c = 50, 4
    logits = (rng.randn(n, c) * 30).astype(np.float32)
    mask = (np.arange(n) < 43).astype(np.float32)  # the last rows padding
    if task == "softmax_xent":
        label = rng.randint(0, c, n)
        want = optax.softmax_cross_entropy_with_integer_labels(logits, label)
    elif task == "sigmoid_xent":
        label = (rng.rand(n, c) < 0.5).astype(np.float32)
        want = optax.sigmoid_binary_cross_entropy(logits, label).sum(-1)
    else:
        logits, label = logits[:, 0], (rng.rand(n) < 0.5).astype(np.float32)
        want = optax.sigmoid_binary_cross_entropy(logits, label)
    batch = {"image": logits, "label": label, "answer": label, "mask": mask}
    res = evaluate_task(task, lambda params, inputs: inputs["image"], None, [batch], c,
                        device_mesh.make_mesh(1))
    assert res["num_examples"] == 43
    assert res["loss"] == pytest.approx(float(np.asarray(want)[:43].mean()), rel=1e-5)


def test_vit_eval_scores_a_sigmoid_trained_workdir_label_by_label(make_tiny, tmp_path, capsys):
    """A workdir recording train.loss=sigmoid_xent on multi-hot promptshapes: the labels are
    scored one by one (a softmax confusion matrix of multi-hot labels has no meaning)."""
    from vit.checkpoints import save_checkpoint
    from vit.data import open_source

    names = open_source("promptshapes", "test").class_names
    loaded = make_tiny(image_size=64, patch_size=16, num_classes=len(names), labels=names)
    work = tmp_path / "run"
    save_checkpoint(loaded, work / "checkpoints" / "1", "orbax")
    (work / "config.json").write_text(json.dumps({
        "data": {"name": "promptshapes", "data_dir": None, "test_split": "test"},
        "train": {"loss": "sigmoid_xent"}}))
    assert main(["eval", "--workdir", str(work), "--out", str(tmp_path / "ev"), "--json",
                 "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "multi_label" and len(report["per_class"]) == len(names)
    assert 0 <= report["accuracy"] <= report["label_accuracy"] <= 1
    assert sum(v["support"] for v in report["per_class"].values()) > report["num_examples"]


def test_the_reliability_legend_shows_the_colours_the_bars_are_drawn_in():
    """Each legend swatch has its bars' face colour and alpha, and the gap bars are opaque and
    above the accuracy bars, so over a bar (an underconfident bin) and over the white (an
    overconfident one) they show the swatch's colour, not a blend."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from vit.inference.evaluate import reliability_figure

    calibration = {"bins": 4, "ece": 0.1, "count": [0, 5, 10, 20],
                   "accuracy": [None, 0.5, 0.55, 0.95],  # underconfident, then over
                   "confidence": [None, 0.35, 0.65, 0.9]}
    fig = reliability_figure(calibration)
    try:
        top = fig.axes[0]
        bars = {c.get_label(): list(c) for c in top.containers if not c.get_label().startswith("_")}
        assert set(bars) == {"accuracy", "gap to confidence"}
        legend = top.get_legend()
        swatches = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles,
                            strict=True))
        for label, patches in bars.items():
            swatch = swatches[label]
            for patch in patches:
                assert patch.get_facecolor() == swatch.get_facecolor(), label
                assert patch.get_alpha() == swatch.get_alpha(), label
        gap = bars["gap to confidence"]
        assert len(gap) == 3 and all(to_rgba(p.get_facecolor())[3] == 1.0 for p in gap)
        assert all(p.get_alpha() in (None, 1.0) for p in gap)
        assert min(p.zorder for p in gap) > max(p.zorder for p in bars["accuracy"])
    finally:
        plt.close(fig)
