"""Fitting a checkpoint to a config (`vit.checkpoints.fit`), and the pieces the readers share.

`load_checkpoint(path, **overrides)` and `vit train --init` fit through one function: the
tests build small checkpoints, fit them both ways and check what must hold (kept weights are
the file's bit for bit, a new head is zero, an error names the parameter and both shapes). The
torch-layout readers are checked against torch's own linear layer and convolution.
"""

import jax
import numpy as np
import pytest
from flax import nnx

import vit
from vit.checkpoints import adapt_params, flatten, load_checkpoint, save_orbax
from vit.checkpoints.named_arrays import NamedArrays
from vit.checkpoints.torch_tensors import patch_kernel_of, torch_readers, torch_writers
from vit.errors import CheckpointError

pytestmark = pytest.mark.timeout(600)

# ViTConfig fields of the small ViT these tests fit checkpoints to.
VIT_FIELDS = dict(image_size=16, patch_size=4, depth=1, width=16, num_heads=2, mlp_dim=32)


def params_of(model) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def randomised(model, seed: int = 0):
    """Every parameter random (a zero head at init would hide a head that was not kept)."""
    rng = np.random.default_rng(seed)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(
        lambda v: rng.standard_normal(np.shape(v)).astype(np.float32), nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """An orbax export of a model with a pre-logits layer and a 5-class head, and the model."""
    model = randomised(vit.create_model("Ti/16", num_classes=5, representation_size=8,
                                        rngs=nnx.Rngs(0), **VIT_FIELDS))
    path = tmp_path_factory.mktemp("fit") / "export"
    save_orbax(path, model, labels=[f"c{i}" for i in range(5)])
    return path, model


def test_load_and_init_fit_alike(export):
    path, model = export
    src = params_of(model)
    loaded = load_checkpoint(path, num_classes=3, representation_size=None)
    assert loaded.config.num_classes == 3 and loaded.config.representation_size is None
    assert loaded.labels is None  # the file's five names name nothing now
    assert any("head of 5 classes dropped" in w for w in loaded.warnings), loaded.warnings
    assert "pre_logits" not in loaded.params
    np.testing.assert_array_equal(loaded.params["head"]["kernel"], np.zeros((16, 3)))
    np.testing.assert_array_equal(loaded.params["head"]["bias"], np.zeros(3))
    for key, value in flatten(loaded.params).items():  # every other weight is the file's
        if key[0] != "head":
            np.testing.assert_array_equal(value, flatten(src)[key], err_msg=str(key))
    # The function training's --init goes through gives the same tree.
    notes = []
    direct = adapt_params(src, model.config, loaded.config, notes=notes)
    assert flatten(direct).keys() == flatten(loaded.params).keys()
    for key, value in flatten(direct).items():
        np.testing.assert_array_equal(value, flatten(loaded.params)[key])
    assert notes == [w for w in loaded.warnings if "head" in w]


def test_same_class_count_keeps_the_head(export):
    path, model = export
    loaded = load_checkpoint(path, num_classes=5, dropout=0.1)
    np.testing.assert_array_equal(loaded.params["head"]["kernel"],
                                  params_of(model)["head"]["kernel"])
    assert loaded.labels == [f"c{i}" for i in range(5)] and loaded.config.dropout == 0.1


def test_a_headless_checkpoint_gets_a_zero_head_and_a_note(tmp_path):
    model = randomised(vit.create_model("Ti/16", num_classes=0, rngs=nnx.Rngs(0), **VIT_FIELDS))
    save_orbax(tmp_path / "backbone", model)
    loaded = load_checkpoint(tmp_path / "backbone", num_classes=4)
    np.testing.assert_array_equal(loaded.params["head"]["kernel"], np.zeros((16, 4)))
    assert any("the checkpoint has none" in w for w in loaded.warnings), loaded.warnings
    assert loaded.build_model()(np.zeros((1, 16, 16, 3), np.float32)).shape == (1, 4)


def test_a_replaced_zero_head_takes_its_warning_along(tmp_path):
    model = vit.create_model("Ti/16", num_classes=5, rngs=nnx.Rngs(0), **VIT_FIELDS)  # zero head
    save_orbax(tmp_path / "zero_head", model)
    assert any("all zeros" in w for w in load_checkpoint(tmp_path / "zero_head").warnings)
    refit = load_checkpoint(tmp_path / "zero_head", num_classes=3)
    assert not any("all zeros" in w for w in refit.warnings), refit.warnings


def test_a_misfit_names_the_parameter_and_both_shapes(export):
    path, _ = export
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, mlp_dim=24)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    # fc1: [width, mlp_dim]; fc2: [mlp_dim, width]: the numbers of the two configs, not ours.
    assert "blocks/0/mlp/fc1/kernel has shape (16, 32), the model needs (16, 24)" in message
    assert "blocks/0/mlp/fc2/kernel has shape (32, 16), the model needs (24, 16)" in message


def test_named_arrays_collects_every_missing_key():
    arrays = {"vit.a": np.ones(2), "b": np.ones(3), "extra": np.ones(1)}
    get = NamedArrays(arrays, ("vit.", ""), dtype=np.float32)
    assert get("a").dtype == np.float32 and get("b").shape == (3,)
    assert get.has("a") and not get.has("c")
    for i in range(8):
        assert get(f"gone{i}").size == 0
    assert get.unused() == ["extra"]
    with pytest.raises(CheckpointError, match=r"^f: unknown X layout: expected keys missing: "
                       r"vit.gone0, .*vit.gone5 and 2 more$"):
        get.check("f", "X")


def test_torch_readers_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((5, 7), np.float32), rng.standard_normal(5, np.float32)
    conv = rng.standard_normal((6, 3, 4, 4), np.float32)  # OIHW, 4x4 patches
    tensors = {"fc.weight": weight, "fc.bias": bias, "ln.weight": bias + 1, "ln.bias": bias}
    linear, norm = torch_readers(NamedArrays(tensors))
    dense = linear("fc")
    x = rng.standard_normal((2, 7), np.float32)
    want = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(weight),
                                      torch.from_numpy(bias)).numpy()
    np.testing.assert_allclose(x @ dense["kernel"] + dense["bias"], want, rtol=1e-5, atol=1e-5)
    assert norm("ln")["scale"] is tensors["ln.weight"]
    # The writers undo the readers exactly.
    out = {}
    put_linear, put_norm = torch_writers(out)
    put_linear("fc", dense)
    put_norm("ln", norm("ln"))
    for key, value in tensors.items():
        np.testing.assert_array_equal(out[key], value)
    # The patch kernel computes torch's stride-4 convolution on each 4x4 patch.
    image = rng.standard_normal((1, 3, 8, 8), np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(image), torch.from_numpy(conv),
                                      stride=4).numpy()  # [1, 6, 2, 2]
    kernel = patch_kernel_of(conv)  # [ph, pw, in, out]
    hwc = image[0].transpose(1, 2, 0)
    got = np.array([[np.einsum("pqc,pqco->o", hwc[4 * i:4 * i + 4, 4 * j:4 * j + 4], kernel)
                     for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(got.transpose(2, 0, 1), want[0], rtol=1e-5, atol=1e-5)
