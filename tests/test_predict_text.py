"""`vit predict` with a text model: --prompt, --zero-shot, --text-embeddings, and their errors.

Every probability is checked against the model applied directly, one image and one prompt at a
time, so the batched, padded, jitted and prefix-sharing path has an independent reference.
"""

import json
import re

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

import vit
from vit.checkpoints import load_checkpoint, save_orbax
from vit.cli import main
from vit.commands.predict import _line
from vit.images import open_image
from vit.models.text import tokenize

pytestmark = pytest.mark.timeout(300)

SIZES = dict(num_classes=3, image_size=32, depth=2, width=64, num_heads=4, mlp_dim=128)
TEXT = dict(width=32, depth=1, num_heads=2, mlp_dim=64)
EMBED_DIM = 8
PROMPTS = ["is there a red triangle?", "a blue circle", ""]
NAMES = ["cat", "dog", "red triangle", "blue circle", "tree"]


def _save(path, text_config):
    model = vit.create_model("Ti/16", **SIZES, text=text_config, rngs=nnx.Rngs(0))
    for block in model.xattn:  # gates start at 0 (text ignored); open them so text matters
        block.attn_gate[...] = 0.8
    model.prompt_head.out.kernel[...] *= 10  # spread the match logits apart
    if model.similarity is not None:
        model.similarity.bias[...] = 0.0  # SigLIP's -10 init puts every prob near 0
    save_orbax(path, model)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tiny_files):
    d = tmp_path_factory.mktemp("ckpts")
    return {"text": _save(d / "text", vit.TextConfig(**TEXT, similarity_dim=16)),
            "emb": _save(d / "emb", vit.TextConfig(**TEXT, source="embeddings",
                                                   embed_dim=EMBED_DIM)),
            "plain": tiny_files["orbax"]}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    rng = np.random.RandomState(0)
    for name, shape in [("a.png", (40, 50, 3)), ("b.png", (32, 32, 3)), ("c.png", (20, 35, 3))]:
        Image.fromarray(rng.randint(0, 255, shape, np.uint8)).save(d / name)
    (d / "d_bad.png").write_text("not an image")
    return d


GOOD = ["a.png", "b.png", "c.png"]


def _rows(out):
    rows = [json.loads(line) for line in out.splitlines()]
    return {r["image"].rsplit("/", 1)[-1]: r for r in rows}


def _reference(ckpt):
    loaded = load_checkpoint(ckpt)
    return loaded, loaded.build_model()


def _prompt_probs(model, x, text, mask):
    """One prompt at a time, straight through the model."""
    return [float(jax.nn.sigmoid(model(x[None], text=text[p][None], text_mask=mask[p][None]))[0])
            for p in range(len(text))]


@pytest.mark.slow
def test_prompts_json_match_reference(ckpts, images, capsys):
    argv = ["predict", str(images), "--checkpoint", str(ckpts["text"]), "--json",
            "--batch-size", "2"]  # 3 good images: one full batch, one padded
    for p in PROMPTS:
        argv += ["--prompt", p]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = _rows(out)
    assert sorted(rows) == sorted([*GOOD, "d_bad.png"])
    assert set(rows["d_bad.png"]) == {"image", "error"} and rows["d_bad.png"]["error"]

    loaded, model = _reference(ckpts["text"])
    tokens, mask = tokenize(PROMPTS, loaded.config.text.max_len)
    for name in GOOD:
        row = rows[name]
        assert set(row) == {"image", "prompts"}
        assert all(set(p) == {"text", "prob"} for p in row["prompts"])
        assert [p["text"] for p in row["prompts"]] == PROMPTS
        x = loaded.preprocessing(open_image(row["image"]))
        expect = _prompt_probs(model, x, tokens, mask)
        got = [p["prob"] for p in row["prompts"]]
        np.testing.assert_allclose(got, expect, atol=1e-5)
        assert np.ptp(expect) > 1e-3  # the prompts really differ, far beyond the tolerance
    assert "3 images scored, 1 failed" in err


@pytest.mark.filterwarnings("ignore:the classification head is all zeros")
def test_predictor_prompt_mode_compiles_once(ckpts, images):
    from vit.images import list_images
    from vit.inference.predictor import Predictor, load_pretrained

    model, preprocess, _ = load_pretrained(ckpts["text"])
    predictor = Predictor(model, preprocess, prompts=["a", "bb"], batch_size=2)
    rows = list(predictor.predict_files(list_images([images])))  # full + padded batch
    assert [("error" in r) for r in rows] == [False, False, False, True]
    assert [p["text"] for p in rows[0]["prompts"]] == ["a", "bb"]
    # one ahead-of-time compile serves the full and the padded batch; jit never traced again
    assert predictor._compiled is not None and predictor._forward._cache_size() == 0


def test_prompt_human_output_and_truncation_warning(ckpts, images, capsys):
    long = "x" * 100  # over the default max_len of 32 tokens
    code = main(["predict", str(images / "a.png"), "--checkpoint", str(ckpts["text"]),
                 "--prompt", long, "--prompt", ""])
    out, err = capsys.readouterr()
    assert code == 0, err
    warns = [line for line in err.splitlines() if line.startswith("vit predict: warning:")]
    assert len(warns) == 1 and "truncated" in warns[0] and "Warning" not in err
    path, scores = out.strip().split(": ", 1)
    assert path == str(images / "a.png")
    assert re.fullmatch(rf'"{long}" [01]\.\d\d, "" [01]\.\d\d', scores), scores
    assert _line({"image": "p.png", "prompts": [{"text": 'say "hi"', "prob": 0.931},
                                                {"text": "b", "prob": 0.04}]}) \
        == 'p.png: "say \\"hi\\"" 0.93, "b" 0.04'


@pytest.mark.slow
def test_zero_shot_top_k_matches_similarity(ckpts, images, tmp_path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(NAMES) + "\n\n")
    code = main(["predict", *(str(images / n) for n in GOOD), "--checkpoint",
                 str(ckpts["text"]), "--zero-shot", str(names), "--template", "a photo of a {}",
                 "--top-k", "3", "--json", "--batch-size", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = _rows(out)

    loaded, model = _reference(ckpts["text"])
    tokens, mask = tokenize([f"a photo of a {n}" for n in NAMES], loaded.config.text.max_len)
    txt = model.text_embedding(tokens, mask)
    for name in GOOD:
        row = rows[name]
        assert set(row) == {"image", "top_k"} and len(row["top_k"]) == 3
        assert all(set(t) == {"index", "label", "prob"} for t in row["top_k"])
        x = loaded.preprocessing(open_image(row["image"]))[None]
        img = model.image_embedding(x)
        sim = np.asarray(jax.nn.sigmoid(model.similarity.logits(img, txt)))[0]
        expect = np.argsort(-sim)[:3]
        assert [t["index"] for t in row["top_k"]] == expect.tolist()
        assert [t["label"] for t in row["top_k"]] == [NAMES[i] for i in expect]
        np.testing.assert_allclose([t["prob"] for t in row["top_k"]], sim[expect], atol=1e-5)
        assert np.ptp(sim) > 1e-3


def _embeddings(rng, prompts=2, length=5, dim=EMBED_DIM):
    tokens = rng.randn(prompts, length, dim).astype(np.float32)
    mask = np.arange(length)[None] < np.array([length, 2])[:prompts, None]
    return tokens, mask


@pytest.mark.slow
def test_text_embeddings_match_reference(ckpts, images, tmp_path, capsys):
    tokens, mask = _embeddings(np.random.RandomState(3))
    np.savez(tmp_path / "e.npz", tokens=tokens, mask=mask)
    code = main(["predict", *(str(images / n) for n in GOOD), "--checkpoint", str(ckpts["emb"]),
                 "--text-embeddings", str(tmp_path / "e.npz"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = _rows(out)
    loaded, model = _reference(ckpts["emb"])
    for name in GOOD:
        row = rows[name]
        assert [p["text"] for p in row["prompts"]] == ["embedding 0", "embedding 1"]
        x = loaded.preprocessing(open_image(row["image"]))
        expect = _prompt_probs(model, x, tokens, mask)
        np.testing.assert_allclose([p["prob"] for p in row["prompts"]], expect, atol=1e-5)
        assert np.ptp(expect) > 1e-3

    from vit.inference.prompts import load_text_embeddings  # optional texts label the prompts

    np.savez(tmp_path / "t.npz", tokens=tokens, mask=mask, texts=np.array(["a cat", "a dog"]))
    assert load_text_embeddings(loaded.config, tmp_path / "t.npz").labels == ["a cat", "a dog"]


def _error(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, err
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err
    return errors[0]


def test_bad_inputs_are_one_line_exit_2(ckpts, images, tmp_path, capsys):
    img = str(images / "a.png")
    rng = np.random.RandomState(4)
    tokens, mask = _embeddings(rng)
    bad = {
        "wide": dict(tokens=rng.randn(2, 5, EMBED_DIM + 1).astype(np.float32), mask=mask),
        "mask_shape": dict(tokens=tokens, mask=mask[:, :4]),
        "holes": dict(tokens=tokens, mask=np.array([[True, False, True, False, False]] * 2)),
        "pickled": dict(tokens=tokens, mask=mask, texts=np.array(["a", None], dtype=object)),
        "good": dict(tokens=tokens, mask=mask),
    }
    for name, arrays in bad.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "names.txt").write_text("cat\ndog\n")

    def predict(ckpt, *args):
        return _error(["predict", img, "--checkpoint", str(ckpts[ckpt]), *args], capsys)

    line = predict("plain", "--prompt", "a cat")
    assert "--prompt" in line and "no text path" in line
    line = predict("emb", "--prompt", "a cat")
    assert "--prompt" in line and "embeddings from an outside text model" in line
    assert "--text-embeddings" in line
    line = predict("text", "--prompt", "a cat", "--zero-shot", str(tmp_path / "names.txt"))
    assert "--prompt and --zero-shot" in line
    line = predict("emb", "--zero-shot", str(tmp_path / "names.txt"))
    assert "--zero-shot" in line and "no similarity head" in line
    line = predict("text", "--zero-shot", str(tmp_path / "empty.txt"))
    assert "empty.txt" in line and "no names" in line
    line = predict("text", "--prompt", "a cat", "--template", "a {}")
    assert "--template" in line
    line = predict("text", "--text-embeddings", str(tmp_path / "good.npz"))
    assert "good.npz" in line and "reads text itself" in line
    line = predict("emb", "--text-embeddings", str(tmp_path / "wide.npz"))
    assert "wide.npz" in line and f"[2, 5, {EMBED_DIM + 1}]" in line
    assert f"[P, T, {EMBED_DIM}]" in line
    line = predict("emb", "--text-embeddings", str(tmp_path / "mask_shape.npz"))
    assert "mask_shape.npz" in line and "[2, 4]" in line and "wanted [2, 5] bool" in line
    line = predict("emb", "--text-embeddings", str(tmp_path / "holes.npz"))
    assert "holes.npz" in line and "left-aligned" in line
    line = predict("emb", "--text-embeddings", str(tmp_path / "pickled.npz"))
    assert "pickled.npz" in line and "not a readable" in line
    line = predict("emb", "--text-embeddings", str(tmp_path / "absent.npz"))
    assert "absent.npz" in line and "no such file" in line
