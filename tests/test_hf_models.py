"""Hugging Face model types beyond ViT (DeiT, DINOv2, CLIP, SigLIP, BEiT, data2vec-vision), each
checked against transformers itself: every case of `tests/hf_coverage.py` is built tiny from its
config class with every parameter perturbed, saved with `save_pretrained` (and its image
processor), read by `load_checkpoint` within 1e-5 of transformers' forward (probabilities, or
the pooled / projected features of a backbone), on prepared arrays and through both libraries'
preprocessing of a photo-like image; then written back, opened by transformers (no array missing
or left over) and the same again, and read back bit-identical. Damaged files are refused naming
the arrays; the coverage table in docs/checkpoints.md is what the sweep makes of the cases.
"""

import json

import numpy as np
import pytest
from hf_coverage import (
    BEGIN,
    CASES,
    DOC,
    END,
    TOLERANCE,
    ours,
    output_of,
    quiet,
    reference,
    render,
    save_case,
    sweep,
)
from PIL import Image

from vit.checkpoints import flatten, load_checkpoint, resolve, save_checkpoint
from vit.errors import CheckpointError

pytestmark = pytest.mark.timeout(600)
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
quiet()

READ = [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else [])
        for c in CASES if c.refused is None]
REFUSED = [pytest.param(c, id=c.id) for c in CASES if c.refused is not None]
# What the reader must say it skipped, by case.
SKIPPED = {"clip": "post_layernorm", "clip-model": "text tower", "siglip": "attention-pooling head",
           "siglip-model": "text tower", "dinov2-swiglu": "position embeddings resized"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """case id -> (folder, transformers model): each case saved once for this module."""
    cache = {}

    def get(c):
        if c.id not in cache:
            folder = tmp_path_factory.mktemp(c.id)
            cache[c.id] = folder, save_case(c, folder)[0]
        return cache[c.id]

    return get


def photo(width=45, height=37, seed=0) -> Image.Image:
    """A smooth, non-square RGB image with some noise: resizing has something to do."""
    yy, xx = np.mgrid[:height, :width]
    rng = np.random.RandomState(seed)
    rgb = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 127 / (width + height)], -1)
    rgb = np.clip(rgb + rng.randn(height, width, 3) * 20, 0, 255).astype(np.uint8)
    return Image.fromarray(rgb)


def assert_close(got, want, what):
    diff = float(np.abs(got - want).max())
    assert diff <= TOLERANCE, f"{what}: {diff:.2e} from transformers'"
    assert float(want.std(-1).min()) > 1e-3, f"{what}: transformers' output is uniform"


@pytest.mark.parametrize("c", READ)
def test_reads_as_transformers_computes_and_writes_back(tmp_path, saved, c):
    folder, model = saved(c)
    loaded = load_checkpoint(folder)
    assert resolve.detect(folder / "model.safetensors")[0] == "hf"
    if c.id in SKIPPED:
        assert any(SKIPPED[c.id] in w for w in loaded.warnings), loaded.warnings
    probs = output_of(c.cls) == "probs"
    x = np.random.RandomState(1).randn(2, *loaded.preprocessing.size, 3).astype(np.float32)
    want = reference(model, x)
    assert_close(ours(loaded, x, probs), want, "prepared arrays")
    # Each library's own preprocessing of the same image.
    image = photo()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    theirs = processor(images=image, return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    mine = loaded.preprocessing(image)[None]
    assert_close(ours(loaded, mine, probs), reference(model, theirs), "a photo")

    out = tmp_path / "out"
    save_checkpoint(loaded, out, "hf")
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    back, info = getattr(transformers, arch).from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert_close(reference(back.eval(), x), want, f"written back, opened as {arch}")
    if probs:
        auto = transformers.AutoModelForImageClassification.from_pretrained(out).eval()
        assert_close(reference(auto, x), want, "written back, AutoModelForImageClassification")
        assert auto.config.id2label[1] == "class 1"
    again = load_checkpoint(out)
    assert again.config == loaded.config and again.preprocessing == loaded.preprocessing
    assert again.labels == loaded.labels
    ours_before, ours_after = flatten(loaded.params), flatten(again.params)
    assert ours_before.keys() == ours_after.keys()
    assert all(np.array_equal(ours_before[k], ours_after[k]) for k in ours_before)


@pytest.mark.parametrize("c", REFUSED)
def test_what_is_not_read_is_refused_in_one_line(saved, c):
    folder, _ = saved(c)
    with pytest.raises(CheckpointError, match=c.refused) as err:
        load_checkpoint(folder)
    assert "\n" not in str(err.value)


def _damaged(folder, tmp_path, change):
    """A copy of `folder` whose arrays `change(arrays)` altered."""
    import shutil

    from safetensors.numpy import load_file, save_file

    dst = tmp_path / "damaged"
    shutil.copytree(folder, dst)
    arrays = load_file(str(dst / "model.safetensors"))
    change(arrays)
    save_file(arrays, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("c", [p for p in READ if not p.marks])
def test_damaged_files_are_refused_naming_the_arrays(tmp_path, saved, c):
    folder, _ = saved(c)
    from safetensors.numpy import load_file

    keys = sorted(load_file(str(folder / "model.safetensors")))
    victim = [k for k in keys if ".1." in k and "norm" in k][-1]  # a norm of the second layer
    with pytest.raises(CheckpointError, match=f"expected keys missing: {victim}"):
        load_checkpoint(_damaged(folder, tmp_path / "missing", lambda a: a.pop(victim)))
    with pytest.raises(CheckpointError, match="no place for: extra.weight"):
        load_checkpoint(_damaged(folder, tmp_path / "extra", lambda a: a.update(
            {"extra.weight": np.zeros(3, np.float32)})))
    renamed = victim.replace("norm", "nrom")
    with pytest.raises(CheckpointError, match=f"{victim} .the file has {renamed} instead"):
        load_checkpoint(_damaged(folder, tmp_path / "renamed", lambda a: a.update(
            {renamed: a.pop(victim)})))


def test_a_model_no_hf_class_holds_is_refused_naming_the_nearest(tmp_path, saved):
    import dataclasses

    deit = load_checkpoint(saved(next(c for c in CASES if c.id == "deit-teacher"))[0])
    gamma = {"gamma": np.full(deit.config.width, 0.5, np.float32)}
    blocks = {i: {**b, "ls1": gamma, "ls2": gamma} for i, b in deit.params["blocks"].items()}
    scaled = dataclasses.replace(deit, config=deit.config.replace(layer_scale=0.5),
                                 params={**deit.params, "blocks": blocks})
    with pytest.raises(CheckpointError, match="cannot hold layer scale.*model_type deit"):
        save_checkpoint(scaled, tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("file,fields,words", [
    ("config.json", {"use_shared_relative_position_bias": True}, "together"),
    ("preprocessor_config.json", {"size": {"height": 40, "width": 40}},
     "processor gives 40x40 images"),
])
def test_beit_settings_that_are_not_reproduced_are_refused(tmp_path, saved, file, fields, words):
    import shutil

    folder = tmp_path / "beit"
    shutil.copytree(saved(next(c for c in CASES if c.id == "beit"))[0], folder)
    path = folder / file
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(folder)


def test_the_coverage_table_is_current(saved):
    """docs/checkpoints.md's table is what `python tests/hf_coverage.py` writes."""
    doc = DOC.read_text()
    assert BEGIN in doc and END in doc, f"{DOC}: no {BEGIN} markers"
    expected = render(doc, sweep(folder_of=lambda c: saved(c)[0]))
    assert doc == expected, ("the Hugging Face coverage table is out of date: run "
                             "`.venv/bin/python tests/hf_coverage.py`")
