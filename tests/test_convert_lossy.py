"""`vit convert --lossy`: conversions a user can force, every change listed; the default still
refuses and names the flag."""

import dataclasses

import numpy as np
import pytest

from vit.checkpoints import flatten, load_checkpoint, save_checkpoint
from vit.errors import CheckpointError

# Compiles whole models or imports torch: with the slow set.
pytestmark = pytest.mark.slow


@pytest.fixture
def timm_crop(tmp_path, make_tiny):
    """A timm folder whose eval transform crops (crop_pct 1, crop_mode center), as timm's hub
    configs say."""
    tiny = make_tiny(seed=1)
    tiny.preprocessing = dataclasses.replace(tiny.preprocessing, crop_pct=1.0,
                                             resample="bicubic")
    folder = tmp_path / "timm"
    save_checkpoint(tiny, folder, "timm")
    return folder


def test_timm_crop_to_hf_is_refused_naming_lossy_then_forced(tmp_path, timm_crop, run_vit,
                                                              file_tree):
    before = file_tree(tmp_path)
    code, err = run_vit(["convert", timm_crop, tmp_path / "hf", "--format", "hf"])
    assert code == 2 and len(err) == 1, err
    assert "cannot hold preprocessing crop_pct 1" in err[0] and "--lossy" in err[0]
    assert file_tree(tmp_path) == before  # nothing written

    code, err = run_vit(["convert", timm_crop, tmp_path / "hf", "--format", "hf", "--lossy"])
    assert code == 0, err
    changes = [line for line in err if "--lossy:" in line]
    assert changes == ["vit convert: --lossy: preprocessing 'shorter side to 8, centre crop 8x8 "
                       "(timm crop_pct 1, crop_mode center)' becomes 'resize to 8x8' "
                       "(ViTImageProcessor resizes without a crop)"]
    src, out = load_checkpoint(timm_crop), load_checkpoint(tmp_path / "hf")
    assert out.preprocessing == dataclasses.replace(src.preprocessing, crop_pct=None)
    fs, fo = flatten(src.params), flatten(out.params)
    assert all(np.array_equal(fs[k], fo[k]) for k in fs) and fs.keys() == fo.keys()


def test_transformers_loads_the_lossy_hf_folder(tmp_path, timm_crop):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jax.numpy as jnp

    notes = save_checkpoint(load_checkpoint(timm_crop), tmp_path / "hf", "hf", lossy=True)
    assert any(n.startswith("--lossy: preprocessing 'shorter side to 8") for n in notes)
    model = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = np.random.RandomState(2).randn(3, 8, 8, 3).astype(np.float32)  # preprocessed, NHWC
    with torch.no_grad():
        theirs = model(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2))).logits.numpy()
    ours = np.asarray(load_checkpoint(timm_crop).build_model()(jnp.asarray(x)))
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    assert model.config.id2label[0] == "digit0"


def test_what_lossy_cannot_approximate_is_still_refused(tmp_path, make_tiny):
    gap = make_tiny(classifier="gap")
    gap.preprocessing = dataclasses.replace(gap.preprocessing, crop_pct=0.9)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(gap, tmp_path / "a", "hf")
    assert "--lossy would approximate some of these, but not a 'gap' head" in str(err.value)
    with pytest.raises(CheckpointError, match="cannot hold a 'gap' head") as err:
        save_checkpoint(gap, tmp_path / "a", "hf", lossy=True)
    assert "crop_pct" not in str(err.value)  # that one was approximated
    assert not (tmp_path / "a").exists()


def test_hf_eps_to_timm_and_npz_list_each_change(tmp_path, make_tiny, run_vit):
    hf_like = make_tiny(layer_norm_eps=1e-12, act_layer="gelu", labels=None)
    save_checkpoint(hf_like, tmp_path / "hf", "hf")
    code, err = run_vit(["convert", tmp_path / "hf", tmp_path / "timm", "--format", "timm"])
    assert code == 2 and "LayerNorm eps 1e-12" in err[0] and "pass --lossy" in err[0]
    code, err = run_vit(["convert", tmp_path / "hf", tmp_path / "timm", "--format", "timm",
                         "--lossy"])
    assert code == 0, err
    assert ("vit convert: --lossy: LayerNorm eps 1e-12 becomes 1e-06 (timm's ViT architectures "
            "use 1e-6 or 1e-5)") in err
    assert load_checkpoint(tmp_path / "timm").config.layer_norm_eps == 1e-6
    code, err = run_vit(["convert", tmp_path / "hf", tmp_path / "m.npz", "--lossy"])
    assert code == 0, err
    lossy = [line for line in err if "--lossy:" in line]
    assert len(lossy) == 2 and "exact GELU becomes its tanh approximation" in lossy[0]
    assert load_checkpoint(tmp_path / "m.npz").config.act_layer == "gelu_tanh"


def test_layer_scale_and_sincos_become_what_the_formats_hold(tmp_path, make_tiny):
    """Exact rewrites under --lossy: layer scale folded into the layer before it (Hugging
    Face), fixed sin-cos position embeddings stored as learned ones (timm): the same logits."""
    import jax.numpy as jnp

    x = jnp.asarray(np.random.RandomState(3).randn(2, 8, 8, 3).astype(np.float32))
    for fields, fmt, words in (({"layer_scale": 0.5}, "hf", "layer scale is folded"),
                               ({"posemb": "sincos2d"}, "timm", "sin-cos position embeddings")):
        src = make_tiny(**fields)
        if "layer_scale" in fields:  # gammas that are not all one value
            for block in src.params["blocks"].values():
                for ls in ("ls1", "ls2"):
                    block[ls]["gamma"] = np.linspace(0.1, 2, 32, dtype=np.float32)
        with pytest.raises(CheckpointError, match="pass --lossy"):
            save_checkpoint(src, tmp_path / fmt, fmt)
        notes = save_checkpoint(src, tmp_path / fmt, fmt, lossy=True)
        assert any(words in n for n in notes), notes
        back = load_checkpoint(tmp_path / fmt)
        assert back.config.layer_scale is None and back.config.posemb == "learn"
        np.testing.assert_allclose(np.asarray(back.build_model()(x)),
                                   np.asarray(src.build_model()(x)), atol=1e-5)


def test_lossy_changes_only_what_the_chosen_format_cannot_hold(tmp_path, make_tiny):
    """A crop that a Hugging Face processor can say (timm's squash: resize both sides, then
    crop, as DeiT's processor does) is kept under --lossy, not turned into a plain resize."""
    tiny = make_tiny(layer_norm_eps=1e-12, act_layer="gelu", seed=2)
    tiny.preprocessing = dataclasses.replace(tiny.preprocessing, crop_pct=0.8,
                                             crop_mode="squash", resample="bicubic")
    notes = save_checkpoint(tiny, tmp_path / "hf", "hf", lossy=True)
    assert not [n for n in notes if n.startswith("--lossy:")], notes
    back = load_checkpoint(tmp_path / "hf").preprocessing
    assert back.describe_geometry() == "resize to 10x10, centre crop 8x8 (transformers)"
    assert tiny.preprocessing.describe_geometry().startswith("resize to 10x10, centre crop 8x8")
