"""Checkpoints and text conditioning: plain ViT files (every format) into a text model, text
checkpoints into a plain model, orbax round trips of text models, and what cannot hold one."""

import jax
import numpy as np
import pytest
from flax import nnx

import vit
from vit.checkpoints import (
    TEXT_SUBTREES,
    LoadedCheckpoint,
    expected_shapes,
    flatten,
    load_checkpoint,
    save_checkpoint,
)
from vit.errors import CheckpointError
from vit.models.config import TextConfig
from vit.models.vit import VisionTransformer
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(600)

TEXT = TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64, max_len=16)
LABELS = ["cat", "dog", "fish", "bird", "frog", "deer", "ship", "car", "truck", "horse"]
INIT_NOTE = "text-conditioning weights initialised fresh (text_path, xattn, prompt_head)"
DROP_NOTE = ("text-conditioning weights dropped (text_path, xattn, prompt_head{}): this model "
             "has no text path")


def with_text(plain, text, seed=0):
    """A text model of the plain model's architecture (the shared tiny ViT), fresh weights."""
    model = vit.create_model(plain.config.replace(text=text), rngs=nnx.Rngs(seed))
    # The head is zero at init: randomise it so equal class logits compare something.
    model.head.kernel[...] = jax.random.normal(jax.random.key(7), model.head.kernel.shape)
    model.head.bias[...] = jax.random.normal(jax.random.key(8), model.head.bias.shape)
    return model


def images(n=2, seed=0):
    return np.random.RandomState(seed).randn(n, 8, 8, 3).astype(np.float32)


def params_of(model) -> dict:
    return {k: np.asarray(v) for k, v in flatten(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
            .items()}


def assert_equal_trees(a: dict, b: dict):
    fa, fb = flatten(a), flatten(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert np.array_equal(np.asarray(fa[k]), np.asarray(fb[k])), k


def text_part(params: dict) -> dict:
    return {k: v for k, v in params.items() if k in TEXT_SUBTREES}


@pytest.fixture(scope="module")
def plain(make_tiny):
    """The shared tiny ViT (tests/conftest.py); `tiny_files` holds it in every format we read,
    written by our writers as a user would convert it, and as a workdir."""
    return make_tiny().build_model()


@pytest.mark.parametrize("fmt", ["npz", "hf", "timm", "orbax", "workdir"])
@pytest.mark.slow
def test_plain_checkpoint_loads_into_a_text_model(plain, tiny_files, fmt):
    file = load_checkpoint(tiny_files[fmt])
    loaded = load_checkpoint(tiny_files[fmt], text=TEXT)
    assert loaded.config == file.config.replace(text=TEXT)
    # Image weights: exactly the file's. Text weights: a fresh Rngs(0) init of the new model.
    assert_equal_trees({k: v for k, v in loaded.params.items() if k not in TEXT_SUBTREES},
                       file.params)
    assert set(text_part(loaded.params)) == {"text_path", "xattn", "prompt_head"}
    fresh = nnx.to_pure_dict(nnx.state(VisionTransformer(loaded.config, rngs=nnx.Rngs(0)),
                                       nnx.Param))
    assert_equal_trees(text_part(loaded.params), text_part(fresh))
    notes = [w for w in loaded.warnings if "text-conditioning" in w]
    assert len(notes) == 1 and notes[0].startswith(INIT_NOTE), loaded.warnings
    assert "class logits are the checkpoint's" in notes[0]

    model = loaded.build_model()
    x = images()
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(plain(x)), rtol=1e-5, atol=1e-5)
    tokens, mask = vit.tokenize(["a cat", "", "a fish on a dog"], TEXT.max_len)
    prompt = np.asarray(model(x, text=np.stack([tokens] * 2), text_mask=np.stack([mask] * 2)))
    assert prompt.shape == (2, 3) and np.isfinite(prompt).all()


@pytest.mark.slow
def test_similarity_head_is_initialised_too(tiny_files):
    text = TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64, max_len=16, similarity_dim=8)
    loaded = load_checkpoint(tiny_files["orbax"], text=text)
    assert "similarity" in loaded.params
    notes = [w for w in loaded.warnings if "text-conditioning" in w]
    assert len(notes) == 1
    assert notes[0].startswith(INIT_NOTE[:-1] + ", similarity)")
    assert "prompt and similarity logits mean nothing" in notes[0]
    model = loaded.build_model()
    assert model.image_embedding(images()).shape == (2, 8)


def test_build_model_and_load_params_fit_text_weights(plain, tiny_files):
    """A config edited after loading: build_model fits the weights to it, with a warning."""
    file = load_checkpoint(tiny_files["orbax"])
    edited = LoadedCheckpoint(file.config.replace(text=TEXT), file.params, file.preprocessing)
    model = edited.build_model(nnx.Rngs(3))  # the model's own init supplies the text weights
    assert len(edited.warnings) == 1 and edited.warnings[0].startswith(INIT_NOTE)
    own = nnx.to_pure_dict(nnx.state(VisionTransformer(edited.config, rngs=nnx.Rngs(3)),
                                     nnx.Param))
    assert_equal_trees(text_part(edited.params), text_part(own))
    np.testing.assert_allclose(np.asarray(model(images())), np.asarray(plain(images())),
                               rtol=1e-5, atol=1e-5)
    # load_params into a built text model: its own text weights stay, the image ones arrive.
    target = VisionTransformer(file.config.replace(text=TEXT), rngs=nnx.Rngs(5))
    before = params_of(target)
    notes = vit.checkpoints.load_params(target, file.params)
    assert len(notes) == 1 and notes[0].startswith(INIT_NOTE)
    after, image = params_of(target), flatten(file.params)
    for k, v in after.items():
        assert np.array_equal(v, before[k] if k[0] in TEXT_SUBTREES else image[k]), k


# -- text checkpoints: orbax round trips, into a plain model, refused elsewhere -----------------
@pytest.fixture(scope="module")
def text_model(plain):
    text = TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64, max_len=16, similarity_dim=8)
    model = with_text(plain, text)
    for block in model.xattn:  # open the gates: the text must change the image tokens
        block.attn_gate[...] = 0.7
        block.mlp_gate[...] = -0.4
    return model


@pytest.fixture(scope="module")
def text_orbax(text_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "orbax"
    pre = Preprocessing(size=(8, 8), resample="bilinear", crop_pct=None, mean=(0.1, 0.2, 0.3),
                        std=(0.4, 0.5, 0.6))
    assert save_checkpoint(text_model, path, "orbax", preprocessing=pre, labels=LABELS) == []
    return path, pre


@pytest.mark.slow
def test_text_model_round_trips_through_orbax(text_model, text_orbax):
    path, pre = text_orbax
    back = load_checkpoint(path)
    assert back.config == text_model.config and back.config.text == text_model.config.text
    assert back.preprocessing == pre and back.labels == LABELS and back.warnings == []
    assert_equal_trees(back.params, nnx.to_pure_dict(nnx.state(text_model, nnx.Param)))
    model, x = back.build_model(), images()
    tokens, mask = vit.tokenize(["a cat", "a dog"], 16)
    np.testing.assert_array_equal(np.asarray(model(x, text=tokens, text_mask=mask)),
                                  np.asarray(text_model(x, text=tokens, text_mask=mask)))
    # The same override as the file's is no change at all.
    again = load_checkpoint(path, text=text_model.config.text)
    assert again.warnings == [] and again.config == back.config


@pytest.mark.slow
def test_embeddings_text_model_round_trips_through_orbax(plain, tmp_path):
    text = TextConfig(source="embeddings", embed_dim=24, width=32, depth=1, num_heads=2,
                      mlp_dim=64, max_len=8)
    model = with_text(plain, text)
    save_checkpoint(model, tmp_path / "emb", "orbax", labels=LABELS)
    back = load_checkpoint(tmp_path / "emb")
    assert back.config == model.config and back.config.text.source == "embeddings"
    assert "encoder" not in back.params["text_path"]  # no byte encoder: supplied embeddings
    assert_equal_trees(back.params, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    emb = np.random.RandomState(1).randn(2, 8, 24).astype(np.float32)
    mask = np.arange(8)[None, :] < np.array([[3], [8]])
    np.testing.assert_array_equal(np.asarray(back.build_model()(images(), text=emb,
                                                                 text_mask=mask)),
                                  np.asarray(model(images(), text=emb, text_mask=mask)))


def test_text_checkpoint_into_a_plain_model_drops_the_text_weights(text_model, text_orbax):
    path, _ = text_orbax
    loaded = load_checkpoint(path, text=None)
    assert loaded.config == text_model.config.replace(text=None)
    assert loaded.warnings == [DROP_NOTE.format(", similarity")]
    own = params_of(text_model)
    assert flatten(loaded.params).keys() == expected_shapes(loaded.config).keys()
    for k, v in flatten(loaded.params).items():
        assert np.array_equal(v, own[k]), k
    model, x = loaded.build_model(), images()
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(text_model(x)), rtol=1e-5,
                               atol=1e-5)
    # A text model without a similarity head drops only that.
    no_sim = load_checkpoint(path, text=TEXT)
    assert no_sim.warnings == ["text-conditioning weights dropped (similarity): this model has "
                               "no similarity head (text.similarity_dim is 0)"]


@pytest.mark.parametrize("fmt,words", [("npz", "a vit_jax npz"),
                                       ("hf", "a Hugging Face ViT folder"),
                                       ("timm", "timm's ViT")])
def test_convert_refuses_formats_without_text(text_orbax, tmp_path, capsys, fmt, words):
    from vit.cli import main

    path, _ = text_orbax
    assert main(["convert", str(path), str(tmp_path / "out"), "--format", fmt]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"vit convert: error: {words} cannot hold text conditioning")
    assert "--format orbax" in err
    assert not (tmp_path / "out").exists()  # refused before anything is written
    with pytest.raises(CheckpointError, match="cannot hold text conditioning"):
        save_checkpoint(load_checkpoint(path), tmp_path / "lib", fmt)


def test_convert_to_orbax_keeps_the_text_model(text_model, text_orbax, tmp_path, capsys):
    from vit.cli import main

    path, pre = text_orbax
    assert main(["convert", str(path), str(tmp_path / "copy"), "--format", "orbax"]) == 0
    back = load_checkpoint(tmp_path / "copy")
    assert back.config == text_model.config and back.preprocessing == pre
    assert back.labels == LABELS
    assert_equal_trees(back.params, nnx.to_pure_dict(nnx.state(text_model, nnx.Param)))


# -- vit train --init: adapt_params both ways ---------------------------------------------------
def abstract_template(config):
    model = nnx.eval_shape(lambda: VisionTransformer(config, rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_adapt_params_plain_into_text_and_back(plain, text_model):
    from vit.checkpoints.fit import adapt_params

    src = nnx.to_pure_dict(nnx.state(plain, nnx.Param))
    src = jax.tree.map(np.asarray, src)
    dst_cfg = plain.config.replace(text=TEXT)
    notes = []
    out = adapt_params(src, plain.config, dst_cfg, dst_template=abstract_template(dst_cfg),
                       seed=2, notes=notes)
    assert len(notes) == 1 and notes[0].startswith(INIT_NOTE)
    assert_equal_trees({k: v for k, v in out.items() if k not in TEXT_SUBTREES}, src)
    fresh = nnx.to_pure_dict(nnx.state(VisionTransformer(dst_cfg, rngs=nnx.Rngs(2)), nnx.Param))
    assert_equal_trees(text_part(out), text_part(fresh))
    # A template with values (fresh params) supplies them directly.
    out = adapt_params(src, plain.config, dst_cfg, dst_template=jax.tree.map(np.asarray, fresh),
                       notes=[])
    assert_equal_trees(text_part(out), text_part(fresh))

    # The other way: a text checkpoint into a plain recipe keeps exactly the image weights.
    src = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(text_model, nnx.Param)))
    dst_cfg = text_model.config.replace(text=None)
    with pytest.warns(UserWarning, match=r"dropped \(text_path, xattn, prompt_head, similarity"):
        out = adapt_params(src, text_model.config, dst_cfg,
                           dst_template=abstract_template(dst_cfg))
    assert_equal_trees(out, {k: v for k, v in src.items() if k not in TEXT_SUBTREES})


@pytest.mark.slow
def test_patch_head_text_model_round_trips_through_orbax(plain, tmp_path):
    text = TextConfig(width=32, depth=1, num_heads=2, mlp_dim=64, max_len=16, head="patches")
    model = with_text(plain, text)
    for block in model.xattn:
        block.attn_gate[...] = 0.7
    model.prompt_head.log_temperature[...] = -0.3  # not the init: the file must carry it
    path = tmp_path / "orbax"
    assert save_checkpoint(model, path, "orbax") == []
    back = load_checkpoint(path)
    assert back.config.text.head == "patches" and back.warnings == []
    assert_equal_trees(back.params, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    assert float(back.params["prompt_head"]["log_temperature"]) == pytest.approx(-0.3)
    tokens, mask = vit.tokenize(["a cat", "a dog"], 16)
    np.testing.assert_array_equal(np.asarray(back.build_model()(images(), text=tokens,
                                                                text_mask=mask)),
                                  np.asarray(model(images(), text=tokens, text_mask=mask)))
