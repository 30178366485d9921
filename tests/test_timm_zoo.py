"""Every architecture of timm's `vision_transformer` and `deit` modules, built tiny by timm
itself (its own activation, norms, MLP, block family, pooling and tokens, DeiT's distillation
token and head; 32 wide, 2 deep, a 2x2 patch grid; every parameter perturbed) and saved with
timm's `save_for_hf`: read to timm's probabilities within 1e-5, written back and reopened by
`timm.create_model("local-dir:...")` to the same, or refused by name for what this ViT does not
build (tests/zoo_coverage.py). One name per block family by default; the whole zoo with
`-m slow` (and tests/test_timm_deit.py for the deit module). And docs/checkpoints.md holds the
coverage table our architecture table gives."""

import re
import tempfile
from pathlib import Path

import pytest
import zoo_coverage as zoo
from timm_reference import architectures, import_timm

from vit.models.timm_table import ARCHITECTURES

timm = import_timm()
needs_timm = pytest.mark.skipif(timm is None, reason="timm is not installed "
                                "(scripts/setup_env.sh installs it)")

# A name per block family and per way of pooling, norming or embedding: what the whole sweep
# covers, in a minute.
FAMILIES = [
    "vit_base_patch16_224",  # the original: token head, exact GELU, LayerNorm 1e-6
    "aimv2_large_patch14_224",  # RMSNorm, SwiGLU, SiLU, patch-embedding norm, no biases
    "vit_base_patch16_clip_quickgelu_224",  # pre_norm without patch bias, LayerNorm 1e-5
    "beit3_base_patch16_224",  # scale norms in attention and MLP, fc_norm after the pooling
    "vit_small_patch16_18x2_224",  # ParallelThingsBlock, layer scale
    "vit_base_patch16_rpn_224",  # ResPostBlock, average pooling without class token
    "vit_giant_patch14_reg4_dinov2",  # GluMlp, registers without position rows
    "vit_so150m_patch16_reg4_map_256",  # a MAP head over the patches alone
    "vit_huge_patch16_radio_v3",  # no final norm
    "test_vit4",  # rmsnorm by name, dynamic image size
    "vit_base_patch16_xp_224",  # ParallelScalingBlock, qk-norm, RmsNorm by class name
    "vit_dwee_patch16_reg1_gap_256",  # differential attention
    "vit_dpwee_patch16_reg1_gap_256",  # DiffParallelScalingBlock
    "deit_tiny_distilled_patch16_224",  # the deit module's distillation token and second head
]


def _check(arch):
    with tempfile.TemporaryDirectory() as tmp:
        outcome = zoo.check(timm, arch, Path(tmp))
    assert zoo.agrees(outcome), (outcome, zoo.expected(arch))
    return outcome


@needs_timm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", FAMILIES)
def test_a_name_per_family_reads_and_writes_back_as_timm(arch):
    _check(arch)


@needs_timm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_timm_vit_architecture_reads_and_writes_back_as_timm():
    assert architectures(timm) == sorted(ARCHITECTURES)  # the table's names are timm's
    outcomes = [_check(arch) for arch in architectures(timm)]
    assert sum(o.read for o in outcomes) >= 150


def test_the_coverage_table_is_what_the_architecture_table_gives():
    text = zoo.DOC.read_text()
    want = zoo.replace_section(text, zoo.table())
    assert text == want, f"docs/checkpoints.md's timm coverage is stale: run `{zoo.REGENERATE}`"


REFUSED = {  # model_args timm builds and this ViT does not -> what the refusal names
    "global_pool": ("avgmax", "global_pool='avgmax'"),
    "pos_embed": ("none", "pos_embed='none'"),
    "dynamic_img_pad": (True, "dynamic_img_pad=True"),
    "act_layer": ("relu", "act_layer=relu"),
}


@needs_timm
@pytest.mark.parametrize("key", list(REFUSED))
def test_what_this_vit_does_not_build_is_refused_by_name(tmp_path, key):
    from timm.models._hub import save_for_hf

    from vit.checkpoints import load_checkpoint
    from vit.errors import CheckpointError

    value, named = REFUSED[key]
    args = {**zoo.tiny_args("vit_base_patch16_224"), key: value}
    save_for_hf(zoo.timm_model(timm, "vit_base_patch16_224", args), str(tmp_path),
                model_args=args, safe_serialization=True)
    with pytest.raises(CheckpointError, match=re.escape(named)) as refused:
        load_checkpoint(tmp_path)
    assert "vit_base_patch16_224" in str(refused.value) and "config.json" in str(refused.value)


def test_every_refusal_names_the_argument_and_why():
    for arch in ARCHITECTURES:
        refused = zoo.expected(arch).refused
        assert refused is None or all(re.match(r"\w+=\S+ \(.+\)$", part)
                                      for part in refused.split("; ")), refused
