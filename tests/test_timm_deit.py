"""Every architecture of timm's `deit` module (DeiT, DeiT-III, and the distilled DeiTs timm
builds as `VisionTransformerDistilled`: a distillation token after the class token, pos_embed
rows [cls, dist, grid], `head` and `head_dist` averaged) built tiny by timm itself, every
parameter perturbed, saved with timm's `save_for_hf`: read to timm's probabilities within 1e-5,
written back by `vit.save_checkpoint(..., "timm")` (a distilled deit architecture for a model
with a distillation token) and reopened by `timm.create_model("local-dir:...")` to the same."""

import json

import numpy as np
import pytest
from timm_reference import architectures, import_timm
from zoo_coverage import our_probs, timm_probs

from vit.models.timm_table import ARCHITECTURES, DEIT

timm = import_timm()
needs_timm = pytest.mark.skipif(timm is None, reason="timm is not installed "
                                "(scripts/setup_env.sh installs it)")
ATOL = 1e-5


def _tiny(arch: str) -> dict:
    patch = ARCHITECTURES[arch]["patch_size"]
    return dict(embed_dim=48, depth=2, num_heads=4, img_size=2 * patch)


def _timm_model(arch: str, args: dict):
    import torch

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=5, **args).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_the_table_holds_the_deit_module_and_marks_the_distilled_names():
    assert len(DEIT) == 16 and set(DEIT) <= set(ARCHITECTURES)
    distilled = sorted(a for a in DEIT if ARCHITECTURES[a].get("distilled"))
    assert distilled == ["deit_base_distilled_patch16_224", "deit_base_distilled_patch16_384",
                         "deit_small_distilled_patch16_224", "deit_tiny_distilled_patch16_224"]
    assert not any(args.get("distilled") for a, args in ARCHITECTURES.items()
                   if a not in distilled)


@needs_timm
def test_the_deit_names_are_timms():
    assert list(DEIT) == architectures(timm, "deit")


@needs_timm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", DEIT)
def test_a_deit_architecture_reads_and_writes_back_as_timm(tmp_path, arch):
    from timm.models._hub import save_for_hf

    from vit.checkpoints import load_checkpoint, save_checkpoint

    args = _tiny(arch)
    model = _timm_model(arch, args)
    save_for_hf(model, str(tmp_path / "src"), model_args=args, safe_serialization=True)
    size = args["img_size"]
    images = np.random.RandomState(1).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    ref = timm_probs(model, images)
    assert np.ptp(ref, axis=-1).min() > 1e-3, "timm's probabilities are uniform"

    loaded = load_checkpoint(tmp_path / "src")
    distilled = bool(ARCHITECTURES[arch].get("distilled"))
    assert loaded.config.dist_token == distilled
    assert ("head_dist" in loaded.params) == distilled
    np.testing.assert_allclose(our_probs(loaded, images), ref, atol=ATOL, err_msg=arch)

    save_checkpoint(loaded, tmp_path / "out", "timm")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert bool(ARCHITECTURES[written["architecture"]].get("distilled")) == distilled
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    assert type(theirs).__name__ == type(model).__name__
    np.testing.assert_allclose(timm_probs(theirs, images), ref, atol=ATOL,
                               err_msg=f"{arch} written back")
    again = load_checkpoint(tmp_path / "out")
    np.testing.assert_allclose(our_probs(again, images), ref, atol=ATOL)


@needs_timm
def test_our_distilled_model_opens_in_timm_as_a_distilled_deit(tmp_path):
    import jax
    from flax import nnx

    import vit
    from vit.checkpoints import LoadedCheckpoint, save_checkpoint

    model = vit.create_model("Ti/16", width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8,
                             image_size=16, num_classes=5, dist_token=True, dist_head=True,
                             rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape)
                                                for x, k in zip(leaves, keys, strict=True)]))
    images = np.random.RandomState(2).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    ours = np.asarray(jax.nn.softmax(model(images), -1))
    assert np.ptp(ours, axis=-1).min() > 1e-3
    save_checkpoint(LoadedCheckpoint.from_model(model), tmp_path / "out", "timm")
    arch = json.loads((tmp_path / "out" / "config.json").read_text())["architecture"]
    assert ARCHITECTURES[arch].get("distilled"), arch
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    assert type(theirs).__name__ == "VisionTransformerDistilled"
    np.testing.assert_allclose(timm_probs(theirs, images), ours, atol=ATOL)


@needs_timm
def test_a_distilled_model_without_its_second_head_is_refused_for_timm(tmp_path):
    import vit
    from vit.checkpoints import save_checkpoint
    from vit.errors import CheckpointError

    model = vit.create_model("Ti/16", width=32, depth=1, mlp_dim=64, num_heads=4, patch_size=8,
                             image_size=16, num_classes=5, dist_token=True, dist_head=False)
    with pytest.raises(CheckpointError, match="distillation head"):
        save_checkpoint(model, tmp_path / "out", "timm")
