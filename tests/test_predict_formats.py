"""`vit predict --format csv` (read back with csv.reader) and multi-label prediction (each
label's own sigmoid, every label over `--threshold`) for a model trained with `sigmoid_xent`."""

import csv
import io
import json

import numpy as np
import pytest
from PIL import Image

from vit.checkpoints import save_checkpoint
from vit.cli import main
from vit.images import open_image

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    rng = np.random.RandomState(3)
    for name in ["plain.png", 'comma, and "quote".png', "b.png"]:
        Image.fromarray(rng.randint(0, 255, (20, 24, 3), np.uint8)).save(d / name)
    (d / "z_bad.png").write_text("not an image")
    return d


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def softmax(x):
    z = np.exp(x - x.max())
    return z / z.sum()


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# -- CSV ------------------------------------------------------------------------------------------
def test_csv_has_a_header_and_one_row_per_image_with_quoted_paths(tiny_files, images, capsys):
    ckpt = str(tiny_files["hf"])
    code, out, _ = run(["predict", str(images), "--checkpoint", ckpt, "--format", "csv",
                        "--top-k", "3", "--no-cache"], capsys)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    header, body = rows[0], rows[1:]
    assert header == ["image", "top1_label", "top1_prob", "top1_index", "top2_label", "top2_prob",
                      "top2_index", "top3_label", "top3_prob", "top3_index", "error"]
    assert all(len(r) == len(header) for r in body)
    by_name = {r[0].rsplit("/", 1)[-1]: dict(zip(header, r, strict=True)) for r in body}
    assert sorted(by_name) == sorted(p.name for p in images.iterdir())  # the comma path whole
    assert by_name["z_bad.png"]["error"] and by_name["z_bad.png"]["top1_label"] == ""

    from vit.checkpoints import load_checkpoint

    loaded = load_checkpoint(ckpt)
    model = loaded.build_model()
    for name in ['comma, and "quote".png', "plain.png"]:
        row = by_name[name]
        x = loaded.preprocessing(open_image(row["image"]))[None]
        probs = softmax(np.asarray(model(x))[0])
        top = np.argsort(-probs)[:3]
        assert [int(row[f"top{r}_index"]) for r in (1, 2, 3)] == top.tolist()
        assert [row[f"top{r}_label"] for r in (1, 2, 3)] == [f"digit{i}" for i in top]
        np.testing.assert_allclose([float(row[f"top{r}_prob"]) for r in (1, 2, 3)], probs[top],
                                   atol=1e-5)
        assert row["error"] == ""


def test_json_and_format_disagreeing_is_one_line_exit_2(tiny_files, images, capsys):
    code, _, err = run(["predict", str(images / "plain.png"), "--checkpoint",
                        str(tiny_files["hf"]), "--json", "--format", "csv"], capsys)
    assert code == 2 and len(err) == 1 and "--json and --format csv disagree" in err[0]
    # --json and --format jsonl say the same thing
    code, out, _ = run(["predict", str(images / "plain.png"), "--checkpoint",
                        str(tiny_files["hf"]), "--json", "--format", "jsonl", "--no-cache"],
                       capsys)
    assert code == 0 and set(json.loads(out)) == {"image", "top_k"}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    from flax import nnx

    import vit
    from vit.checkpoints.orbax_io import save_orbax

    model = vit.create_model("Ti/16", num_classes=3, image_size=16, depth=2, width=32,
                             num_heads=2, mlp_dim=64, patch_size=8, attention_impl="xla",
                             text=vit.TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64),
                             rngs=nnx.Rngs(0))
    for block in model.xattn:  # open the gates, so the prompt changes the answer
        block.attn_gate[...] = 0.8
    path = tmp_path_factory.mktemp("text") / "text"
    save_orbax(path, model)
    return path


@pytest.mark.slow
def test_csv_in_prompt_mode_is_a_row_per_image_and_prompt(text_model, images, capsys):
    prompts = ["is there a red, square thing?", 'say "hi"']
    argv = ["predict", str(images), "--checkpoint", str(text_model), "--prompt", prompts[0],
            "--prompt", prompts[1], "--no-cache"]
    code, out, _ = run([*argv, "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["image", "prompt", "prob", "error"]
    code, js, _ = run([*argv, "--json"], capsys)
    want = [json.loads(line) for line in js.splitlines()]
    expect = []
    for r in want:
        if "error" in r:
            expect.append((r["image"], "", "", "error"))
        else:
            expect += [(r["image"], p["text"], p["prob"], "") for p in r["prompts"]]
    got = rows[1:]
    assert len(got) == 3 * 2 + 1  # three readable images x two prompts, and the bad one
    for g, (image, text, prob, error) in zip(got, expect, strict=True):
        assert g[0] == image and g[1] == text
        if error:
            assert g[3] and g[2] == ""
        else:
            assert float(g[2]) == pytest.approx(prob, abs=1e-7) and g[3] == ""


# -- multi-label ----------------------------------------------------------------------------------
BIAS = np.array([2.0, -1.0, 0.3, -3.0], np.float32)  # sigmoid: 0.881, 0.269, 0.574, 0.047
NAMES = ["white circle", "red cross", "blue, square", "green triangle"]


@pytest.fixture(scope="module")
def multilabel(tmp_path_factory, make_tiny):
    """Two `vit train`-style workdirs recording train.loss=sigmoid_xent: `fixed`, a head whose
    kernel is zero (the logits are its bias whatever the image), and `varied`, a random head."""
    root = tmp_path_factory.mktemp("multilabel")
    out = {}
    for name in ("fixed", "varied"):
        loaded = make_tiny(seed=4, num_classes=4, labels=NAMES)
        if name == "fixed":
            loaded.params["head"]["kernel"] = np.zeros_like(loaded.params["head"]["kernel"])
            loaded.params["head"]["bias"] = BIAS.copy()
        save_checkpoint(loaded, root / name / "checkpoints" / "1", "orbax")
        (root / name / "config.json").write_text(json.dumps({"train": {"loss": "sigmoid_xent"}}))
        out[name] = root / name
    return out


def test_multilabel_reports_each_labels_sigmoid_and_every_label_over_the_threshold(
        multilabel, images, capsys):
    img = str(images / "plain.png")
    code, out, _ = run(["predict", img, "--checkpoint", str(multilabel["fixed"]), "--json",
                        "--no-cache"], capsys)
    assert code == 0
    row = json.loads(out)
    np.testing.assert_allclose(row["probs"], sigmoid(BIAS), atol=1e-6)
    assert [t["label"] for t in row["labels"]] == ["white circle", "blue, square"]  # >= 0.5
    np.testing.assert_allclose([t["prob"] for t in row["labels"]], sigmoid(BIAS[[0, 2]]),
                               atol=1e-6)
    assert "top_k" not in row

    code, out, _ = run(["predict", img, "--checkpoint", str(multilabel["fixed"]),
                        "--threshold", "0.2", "--no-cache"], capsys)
    assert code == 0
    assert out.strip() == (f"{img}: white circle 0.881, blue, square 0.574, red cross 0.269 "
                           "(3 labels at or above 0.2)")
    code, out, _ = run(["predict", img, "--checkpoint", str(multilabel["fixed"]),
                        "--threshold", "0.95", "--no-cache"], capsys)
    assert out.strip() == f"{img}: no label at or above 0.95 (highest: white circle 0.881)"


def test_multilabel_matches_numpy_sigmoid_of_the_models_logits_in_csv(multilabel, images,
                                                                      capsys):
    from vit.checkpoints import load_checkpoint

    ckpt = multilabel["varied"] / "checkpoints" / "1"  # a step inside the workdir
    code, out, _ = run(["predict", str(images), "--checkpoint", str(ckpt), "--format", "csv",
                        "--threshold", "0.4", "--no-cache"], capsys)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["image", "labels", *(f"prob:{n}" for n in NAMES), "error"]
    loaded = load_checkpoint(ckpt)
    model = loaded.build_model()
    seen = set()
    for row in rows[1:]:
        if row[-1]:
            assert row[0].endswith("z_bad.png")
            continue
        x = loaded.preprocessing(open_image(row[0]))[None]
        want = sigmoid(np.asarray(model(x), np.float64)[0])
        np.testing.assert_allclose([float(v) for v in row[2:6]], want, atol=1e-6)
        above = [NAMES[i] for i in np.argsort(-want) if want[i] >= 0.4]
        assert row[1] == "; ".join(above)
        seen.add(tuple(np.round(want, 3)))
    assert len(rows) == 5 and len(seen) == 3  # images differ: not a constant answer


def test_a_prepared_softmax_entry_is_not_used_for_a_multilabel_run(multilabel, images,
                                                                     tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    img = str(images / "plain.png")
    ckpt = str(multilabel["fixed"])
    code, out, err = run(["predict", img, "--checkpoint", ckpt, "--json", "--no-multi-label"],
                         capsys)
    assert code == 0 and "top_k" in json.loads(out)  # softmax top-k, stored as prepared
    assert list((tmp_path / "cache" / "prepared").iterdir())
    code, out, err = run(["predict", img, "--checkpoint", ckpt, "--json"], capsys)
    assert code == 0 and not any("prepared:" in line for line in err)
    np.testing.assert_allclose(json.loads(out)["probs"], sigmoid(BIAS), atol=1e-6)


def test_recorded_losses_and_the_flags_that_override_them(multilabel, tiny_files, images,
                                                         tmp_path, capsys):
    img = str(images / "plain.png")
    # Nothing recorded (an npz): softmax, unless --multi-label says otherwise.
    code, _, err = run(["predict", img, "--checkpoint", str(tiny_files["npz"]), "--threshold",
                        "0.3", "--no-cache"], capsys)
    assert code == 2 and len(err) == 1 and "records no training loss" in err[0]
    assert "--multi-label" in err[0]
    code, out, _ = run(["predict", img, "--checkpoint", str(tiny_files["npz"]), "--json",
                        "--multi-label", "--threshold", "0.3", "--no-cache"], capsys)
    assert code == 0 and len(json.loads(out)["probs"]) == 10
    # A softmax_xent workdir: --threshold is refused, naming the record.
    code, _, err = run(["predict", img, "--checkpoint", str(tiny_files["workdir"]),
                        "--threshold", "0.3", "--no-cache"], capsys)
    assert code == 2 and len(err) == 1 and "records softmax_xent" in err[0]
    code, _, err = run(["predict", img, "--checkpoint", str(multilabel["fixed"]),
                        "--threshold", "1.5"], capsys)
    assert code == 2 and len(err) == 1 and "--threshold 1.5" in err[0]
    # A Hugging Face folder says it through problem_type.
    hf = tmp_path / "hf"
    import shutil

    shutil.copytree(tiny_files["hf"], hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config,
                                                "problem_type": "multi_label_classification"}))
    code, out, _ = run(["predict", img, "--checkpoint", str(hf), "--json", "--no-cache"], capsys)
    assert code == 0 and len(json.loads(out)["probs"]) == 10


class _OneImage:
    """What `_print_results` asks of a predictor: one classified image, the bar advanced."""

    mode, threshold = "classes", None

    def predict_files(self, paths, progress=None):
        for path in paths:
            progress.update(1)
            yield {"image": str(path), "top_k": [{"index": 0, "label": "cat", "prob": 0.9}]}


@pytest.mark.parametrize("terminal", [False, True])
def test_the_progress_bar_is_drawn_on_a_terminal_only(terminal, capsys, monkeypatch):
    """Redirected (a file, a pipe), stderr holds the results' summary and no bar redraws; on a
    terminal the bar is drawn."""
    import sys

    from vit.commands.predict import _print_results

    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    _print_results("jsonl", _OneImage(), ["a.png", "b.png"])
    out, err = capsys.readouterr()
    assert [json.loads(line)["image"] for line in out.splitlines()] == ["a.png", "b.png"]
    drawn = "2/2" in err
    assert drawn == terminal, err
    if not terminal:
        assert err.splitlines() == [err.strip()] and err.startswith("vit predict: 2 images"), err
