"""Conversions are lossless or refused: for every pair of formats, what is read back has the same
tensors, the same whole `ViTConfig`, the same preprocessing and the same labels; a format that
cannot hold a property of the model refuses, naming it, and writes nothing.

What each format holds is stated here, in the tables below, not taken from the writers. The one
thing a file does not carry is how its reader's library resizes position embeddings (vit_jax:
linear, timm and Hugging Face: bicubic): it follows the format, and the conversion says so.
"""

import re

import numpy as np
import pytest

import vit
from vit.checkpoints import (
    LoadedCheckpoint,
    expected_shapes,
    flatten,
    load_checkpoint,
    nest,
    save_checkpoint,
)
from vit.cli import main
from vit.errors import CheckpointError
from vit.preprocess import Preprocessing

pytestmark = pytest.mark.timeout(300)

FORMATS = ("npz", "hf", "timm", "orbax")
# The position-embedding resize each non-orbax format implies (orbax keeps the config's own).
RESIZE = {"npz": "linear", "hf": "bicubic", "timm": "bicubic_antialias"}
INCEPTION = Preprocessing(size=(32, 32), resample="bilinear", crop_pct=None,
                          mean=(0.5,) * 3, std=(0.5,) * 3)
BASE = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, image_size=32,
            num_classes=5, act_layer="gelu_tanh", layer_norm_eps=1e-6)


def model(config=None, preprocessing=INCEPTION, labels=None, seed=7) -> LoadedCheckpoint:
    cfg = vit.variant_config("Ti/16", **{**BASE, **(config or {})})
    rng = np.random.RandomState(seed)
    params = nest({path: rng.randn(*shape).astype(np.float32)
                   for path, shape in expected_shapes(cfg).items()})
    return LoadedCheckpoint(cfg, params, preprocessing, labels)


def dst_path(tmp_path, fmt, name):
    return tmp_path / (f"{name}.npz" if fmt == "npz" else name)


def assert_same_model(got: LoadedCheckpoint, want: LoadedCheckpoint, resize: str):
    fa, fb = flatten(want.params), flatten(got.params)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert np.asarray(fb[k]).dtype == np.float32
        assert np.array_equal(np.asarray(fa[k]), np.asarray(fb[k])), k
    assert got.config == want.config.replace(posemb_resize=resize)
    assert got.preprocessing == want.preprocessing
    assert got.labels == want.labels


# -- every pair of formats, with a model all four hold -----------------------------------------
@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same model written in each format (by our writers) and read back."""
    folder = tmp_path_factory.mktemp("sources")
    src = model()
    out = {}
    for fmt in FORMATS:
        path = dst_path(folder, fmt, fmt)
        save_checkpoint(src, path, fmt)
        out[fmt] = load_checkpoint(path)
    return src, out


@pytest.mark.parametrize("src_fmt", FORMATS)
@pytest.mark.parametrize("dst_fmt", FORMATS)
def test_every_pair_of_formats_round_trips(tmp_path, sources, src_fmt, dst_fmt):
    original, read = sources
    loaded = read[src_fmt]
    first = RESIZE.get(src_fmt, original.config.posemb_resize)
    assert_same_model(loaded, original, first)
    notes = save_checkpoint(loaded, dst_path(tmp_path, dst_fmt, "out"), dst_fmt)
    back = load_checkpoint(dst_path(tmp_path, dst_fmt, "out"))
    resize = RESIZE.get(dst_fmt, first)
    assert_same_model(back, original, resize)
    said = any("resize" in n and resize in n for n in notes)
    assert said == (resize != first), notes  # a changed convention is always said


# -- models that only some formats hold: kept there, refused (naming why) elsewhere ------------
TIMM_PRE = Preprocessing(size=(32, 32), resample="bicubic", crop_pct=0.9,
                         mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
# name: (model, {format: words its refusal must contain}); formats not named hold the model.
CASES = {
    "gap_with_class_token": (dict(classifier="gap"),
                             {"npz": "'gap' head with a class token", "hf": "'gap' head"}),
    # Hugging Face: a SiglipForImageClassification (the mean of every token, none a class token)
    "gap_no_class_token": (dict(classifier="gap", class_token=False), {}),
    "map_qk_norm": (dict(classifier="map", class_token=False, qk_norm=True),
                    {"npz": "'map' head", "hf": "'map' head"}),
    "map_with_class_token": (dict(classifier="map"), {"npz": "'map' head", "hf": "'map' head"}),
    "registers_layer_scale": (dict(num_registers=4, layer_scale=0.1),
                              {"npz": "4 register tokens", "hf": "layer scale"}),
    "no_qkv_bias": (dict(qkv_bias=False), {}),
    "exact_gelu_eps_1e-12": (dict(act_layer="gelu", layer_norm_eps=1e-12),
                             {"npz": "exact GELU", "timm": "LayerNorm eps 1e-12"}),
    "sincos": (dict(posemb="sincos2d"),
               {"npz": "sin-cos position embeddings at image size (32, 32)",
                "hf": "sincos2d position embeddings", "timm": "sincos2d position embeddings"}),
    "pre_logits": (dict(representation_size=16),
                   {"hf": "pre-logits layer", "timm": "pre-logits"}),
    "non_square_grid": (dict(image_size=(32, 48)), {"npz": "non-square patch grid"}),
}


def _case(name):
    config, refusals = CASES[name]
    return model(config), refusals


@pytest.mark.parametrize("name", list(CASES))
def test_each_format_holds_the_model_or_refuses_it(tmp_path, name):
    src, refusals = _case(name)
    for fmt in FORMATS:
        dst = dst_path(tmp_path, fmt, fmt)
        if fmt in refusals:
            with pytest.raises(CheckpointError, match=re.escape(refusals[fmt])):
                save_checkpoint(src, dst, fmt)
            assert not dst.exists() and not list(tmp_path.glob(f".{dst.name}*"))
            continue
        save_checkpoint(src, dst, fmt)
        assert_same_model(load_checkpoint(dst), src, RESIZE.get(fmt, "bicubic"))


@pytest.mark.parametrize("fmt,words", [
    ("npz", "preprocessing (bicubic resize to 32x32, crop_pct 0.9"),
    ("hf", "crop_pct 0.9"), ("timm", None), ("orbax", None)])
def test_preprocessing_is_kept_or_refused(tmp_path, fmt, words):
    src = model(dict(act_layer="gelu"), preprocessing=TIMM_PRE) if fmt != "npz" else model(
        preprocessing=TIMM_PRE)
    dst = dst_path(tmp_path, fmt, "out")
    if words:
        with pytest.raises(CheckpointError, match=re.escape(words)):
            save_checkpoint(src, dst, fmt)
        return
    save_checkpoint(src, dst, fmt)
    assert_same_model(load_checkpoint(dst), src, RESIZE.get(fmt, "bicubic"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_labels_are_kept_or_refused(tmp_path, fmt):
    src = model(labels=[f"kind {i}" for i in range(5)])
    dst = dst_path(tmp_path, fmt, "out")
    if fmt == "npz":
        with pytest.raises(CheckpointError, match="class names"):
            save_checkpoint(src, dst, fmt)
        return
    save_checkpoint(src, dst, fmt)
    assert load_checkpoint(dst).labels == src.labels


@pytest.mark.parametrize("fmt", FORMATS)
def test_run_settings_are_kept_by_orbax_and_timm_else_said(tmp_path, fmt):
    src = model(dict(dynamic_image_size=True))
    dst = dst_path(tmp_path, fmt, "out")
    notes = save_checkpoint(src, dst, fmt)
    back = load_checkpoint(dst)
    kept = fmt in ("orbax", "timm")
    assert back.config.dynamic_image_size is kept
    assert any("dynamic_image_size=True" in n for n in notes) is not kept


# -- the command: reads its output back, refuses with one line and writes nothing --------------
def test_cli_convert_output_reads_back_the_same(tmp_path, capsys):
    src = model(dict(classifier="map", class_token=False, num_registers=2),
                preprocessing=TIMM_PRE, labels=list("abcde"))
    save_checkpoint(src, tmp_path / "src", "orbax")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "timm"), "--format",
                 "timm"]) == 0
    assert_same_model(load_checkpoint(tmp_path / "timm"), src, RESIZE["timm"])
    assert main(["convert", str(tmp_path / "timm"), str(tmp_path / "back"), "--format",
                 "orbax"]) == 0
    assert_same_model(load_checkpoint(tmp_path / "back"), src, RESIZE["timm"])


@pytest.mark.parametrize("argv,words", [
    (["{src}", "{tmp}/out.npz"], "a vit_jax npz cannot hold a 'gap' head with a class token"),
    (["{src}", "{tmp}/out", "--format", "hf"], "cannot hold a 'gap' head"),
    (["{src}", "{tmp}/model.safetensors"], "bare .safetensors file"),
    (["{src}", "{tmp}/model.safetensors", "--format", "timm"], "--format timm"),
    (["{src}", "{src}", "--format", "orbax"], "already exists"),
    (["{src}", "{tmp}/afile/out", "--format", "timm"], "is a file, not a folder"),
])
def test_cli_convert_refuses_with_one_line(tmp_path, capsys, argv, words):
    src = model(dict(classifier="gap"))
    save_checkpoint(src, tmp_path / "src", "orbax")
    (tmp_path / "afile").write_text("x")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = [a.format(src=tmp_path / "src", tmp=tmp_path) for a in argv]
    assert main(["convert", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vit convert: error: ") and words in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing half-written
