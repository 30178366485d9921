"""timm's whole ViT zoo (every architecture of its `vision_transformer` and `deit` modules) built
tiny by timm itself, saved by timm's hub writer, read by `vit.load_checkpoint`, written back by
`vit.save_checkpoint(..., "timm")` and reopened by timm; and the coverage table of
docs/checkpoints.md.

The table states what our architecture table decides for each name (`expected`: read and
written back, or refused for the arguments `timm_architectures.unsupported` names), without
building anything; tests/test_timm_zoo.py checks every name against timm's own model (`check`,
`-m slow` for the whole zoo) and that the document holds the table. `python
tests/zoo_coverage.py` rewrites the table between the `<!-- coverage timm -->` markers.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parents[1] / "docs" / "checkpoints.md"
BEGIN, END = "<!-- coverage timm -->", "<!-- /coverage timm -->"
REGENERATE = "JAX_PLATFORMS=cpu .venv/bin/python tests/zoo_coverage.py"
ATOL = 1e-5
# timm.create_model arguments of each small zoo model.
TIMM_FIELDS = dict(embed_dim=32, depth=2, num_heads=2, num_classes=5)


def tiny_args(arch: str) -> dict:
    """model_args that shrink `arch` (width, depth, heads, a 2x2 patch grid) and keep what the
    name decides: activation, norms, MLP and block family, pooling, tokens, MLP ratio."""
    from vit.models.timm_architectures import ARCHITECTURES, DEFAULTS

    stated = {**DEFAULTS, **ARCHITECTURES[arch]}
    patch = stated["patch_size"]
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    args = {k: v for k, v in TIMM_FIELDS.items() if k != "num_classes"}
    args["img_size"] = 2 * patch
    if "mlp_ratio" not in ARCHITECTURES[arch]:
        args["mlp_ratio"] = 2.0
    return args


@dataclasses.dataclass
class Outcome:
    arch: str
    read: bool = False
    written: bool = False
    refused: str | None = None  # why the read or the write was refused


def timm_model(timm, arch: str, args: dict, seed: int = 0):
    """timm's `arch` built with `args`, every parameter moved off its initial value (zeros
    and ones included) so that nothing is trivially equal."""
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, num_classes=TIMM_FIELDS["num_classes"],
                              **args).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def timm_probs(model, images: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(images.transpose(0, 3, 1, 2)))
    return torch.softmax(logits, -1).numpy()


def our_probs(loaded, images: np.ndarray) -> np.ndarray:
    import jax

    return np.asarray(jax.nn.softmax(loaded.build_model()(images), -1))


def images_for(args: dict, seed: int = 1) -> np.ndarray:
    size = args["img_size"]
    return np.random.RandomState(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


def check(timm, arch: str, folder: Path) -> Outcome:
    """Saves tiny `arch` with timm's `save_for_hf`, reads it, writes it back, reopens it in
    timm. A refusal (CheckpointError) is an outcome; probabilities that differ by more than
    ATOL, or a written folder timm reads differently, raise AssertionError."""
    from timm.models._hub import save_for_hf

    from vit.checkpoints import load_checkpoint, save_checkpoint
    from vit.errors import CheckpointError

    args, outcome = tiny_args(arch), Outcome(arch)
    model = timm_model(timm, arch, args)
    save_for_hf(model, str(folder / "src"), model_args=args, safe_serialization=True)
    images = images_for(args)
    ref = timm_probs(model, images)
    assert np.ptp(ref, axis=-1).min() > 1e-3, f"{arch}: timm's probabilities are uniform"
    try:
        loaded = load_checkpoint(folder / "src")
    except CheckpointError as err:
        outcome.refused = str(err)
        return outcome
    np.testing.assert_allclose(our_probs(loaded, images), ref, atol=ATOL, err_msg=arch)
    outcome.read = True
    try:
        save_checkpoint(loaded, folder / "out", "timm")
    except CheckpointError as err:
        outcome.refused = str(err)
        return outcome
    theirs = timm.create_model(f"local-dir:{folder / 'out'}", pretrained=True).eval()
    np.testing.assert_allclose(timm_probs(theirs, images), ref, atol=ATOL,
                               err_msg=f"{arch} written back")
    outcome.written = True
    return outcome


def expected(arch: str) -> Outcome:
    """What reading tiny `arch` must give: refused for the arguments this ViT does not build,
    else read and written back."""
    from vit.models import timm_architectures

    bad = timm_architectures.unsupported(timm_architectures.arguments(arch, tiny_args(arch),
                                                                      arch))
    if bad:
        return Outcome(arch, refused="; ".join(bad))
    return Outcome(arch, read=True, written=True)


def agrees(outcome: Outcome) -> bool:
    """Whether a checked outcome is the expected one (a refusal naming the same reasons)."""
    want = expected(outcome.arch)
    if want.refused:
        return not outcome.read and all(part in (outcome.refused or "")
                                        for part in want.refused.split("; "))
    return outcome == want


# -- the coverage table -----------------------------------------------------------------------
# A family per name: the first of these tags the name holds (timm's names say the recipe).
_TAGS = (("_distilled_", "DeiT, distilled (deit module)"),
         ("deit3_", "DeiT-III (deit module)"), ("deit_", "DeiT (deit module)"),
         ("aimv2", "AIMv2"), ("beit3", "BEiT-3"), ("eva_", "EVA"), ("flexivit", "FlexiViT"),
         ("test_vit", "timm's test models"), ("_xp_", "ViT-22B style (parallel scaling)"),
         ("pwee", "parallel scaling (pwee)"), ("dlittle", "differential attention"),
         ("dwee", "differential attention"), ("18x2", "parallel blocks (18x2)"),
         ("rpn", "res-post norm (rpn)"), ("clip", "CLIP"), ("siglip", "SigLIP"),
         ("dinov2", "DINOv2"), ("tipsv2", "TIPSv2"), ("radio", "RADIO"),
         ("intern", "InternViT"), ("reg", "registers (timm-trained)"),
         ("gap", "average pooling (timm-trained)"))


def family(arch: str) -> str:
    return next((name for tag, name in _TAGS if tag in arch), "ViT (original, DeiT-III, miil)")


def coverage_rows(outcomes: list[Outcome], version: str) -> str:
    """The markdown between the markers: one row per family."""
    families: dict[str, list[Outcome]] = {}
    for o in outcomes:
        families.setdefault(family(o.arch), []).append(o)
    read = sum(o.read for o in outcomes)
    written = sum(o.written for o in outcomes)
    lines = [f"Made by `{REGENERATE}` from timm {version}'s `vision_transformer` and `deit` "
             "modules: "
             f"{len(outcomes)} architectures, **{read} read** within 1e-5 of timm's "
             f"probabilities, **{written} written back** and reopened by "
             f"`timm.create_model(\"local-dir:...\", pretrained=True)` to the same "
             f"probabilities, {len(outcomes) - read} refused by name. `tests/test_timm_zoo.py` "
             "checks every row (`-m slow`; a name per block family by default): each "
             "architecture built tiny by timm itself, every parameter perturbed, saved with "
             "timm's `save_for_hf`.", "",
             "| family | architectures | read | written back | refused, and why |",
             "|---|---|---|---|---|"]
    for name in sorted(families, key=lambda n: (-len(families[n]), n)):
        group = families[name]
        reasons: dict[str, list[str]] = {}
        for o in group:
            if o.refused:
                reasons.setdefault(o.refused, []).append(f"`{o.arch}`")
        refused = "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
        lines.append(f"| {name} | {len(group)} | {sum(o.read for o in group)} | "
                     f"{sum(o.written for o in group)} | {refused or '-'} |")
    return "\n".join(lines)


def replace_section(text: str, rows: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{rows}\n{END}{tail}"


def table() -> str:
    from vit.models.timm_table import ARCHITECTURES, TIMM_VERSION

    return coverage_rows([expected(arch) for arch in ARCHITECTURES], TIMM_VERSION)


def main() -> int:
    DOC.write_text(replace_section(DOC.read_text(), table()))
    print(f"{DOC}: the timm coverage table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
