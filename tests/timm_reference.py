"""timm itself, for the tests that check our files against it, and the generator of
`vit/models/timm_table.py` (`python tests/timm_reference.py > vit/models/timm_table.py`).

timm imports torchvision, and the only torchvision on the package registries is a CUDA build:
its Python parts work beside the CPU torch, but its compiled ops (`_C.so`) do not load, and its
import then stops at `torchvision::nms`, whose fake (meta) kernel it registers whether the ops
loaded or not. Installed where every program finds it, that broken import also breaks
transformers, which imports torchvision whenever it is installed. So scripts/setup_env.sh
installs timm and torchvision (--no-deps, pinned) into `.venv/timm-reference`, a folder only
this module puts on `sys.path`, and `import_timm` declares the two op schemas torchvision
registers fakes for before importing it; nothing here calls them (timm's ViT never runs nms).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

# Where scripts/setup_env.sh installs timm and torchvision, beside the test environment's
# packages but not among them.
TIMM_DIR = Path(sys.prefix) / "timm-reference"


def import_timm():
    """timm, importable beside the CPU torch; None when it or torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    if "timm" in sys.modules:
        return sys.modules["timm"]
    if TIMM_DIR.is_dir() and str(TIMM_DIR) not in sys.path:
        _keep_transformers_as_installed()
        sys.path.append(str(TIMM_DIR))
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return None
    compiled = next(Path(spec.submodule_search_locations[0]).glob("_C.*"), None)
    try:  # what torchvision's own import does first; a CPU build of it loads here
        torch.ops.load_library(str(compiled))
        has_ops = True
    except (OSError, RuntimeError, TypeError):
        has_ops = False
    if not has_ops:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            with contextlib.suppress(RuntimeError):  # declared already
                lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBS.append(lib)  # a Library takes its definitions away when it is collected
    try:
        import timm
    except ImportError:
        return None
    return timm


_LIBS: list = []


def _keep_transformers_as_installed() -> None:
    """transformers decides once per process whether torchvision is installed, and then
    preprocesses images with it (another resize than PIL's) if so. Asked before the timm folder
    joins sys.path, it answers for the environment as installed, so the tests that compare with
    transformers in the same process see the same transformers, whichever test runs first."""
    if importlib.util.find_spec("transformers") is None:
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()


# timm's modules whose architectures the table holds: its ViT, and DeiT's (VisionTransformer,
# or VisionTransformerDistilled with a distillation token and head).
MODULES = ("vision_transformer", "deit")


def architectures(timm, module: str | None = None) -> list[str]:
    """Every architecture timm registers in its `vision_transformer` and `deit` modules (or in
    `module` alone)."""
    return sorted(name for m in ((module,) if module else MODULES)
                  for name in timm.list_models(module=m))


def entrypoint_args(timm, arch: str) -> dict:
    """The keyword arguments the architecture name passes to timm's `VisionTransformer`
    (the model_args it carries), without building the model; for the deit module's
    distilled names (`_create_deit(..., distilled=True)`, a `VisionTransformerDistilled`),
    `distilled: True` beside them."""
    import timm.models.deit as deit
    import timm.models.vision_transformer as vt

    class Captured(Exception):
        pass

    def capture(variant, pretrained=False, **kwargs):
        raise Captured(kwargs)

    def capture_deit(variant, pretrained=False, distilled=False, **kwargs):
        raise Captured({**kwargs, **({"distilled": True} if distilled else {})})

    originals = vt._create_vision_transformer, deit._create_deit
    vt._create_vision_transformer, deit._create_deit = capture, capture_deit
    try:
        timm.models._registry.model_entrypoint(arch)(pretrained=False)
    except Captured as done:
        return done.args[0]
    finally:
        vt._create_vision_transformer, deit._create_deit = originals
    raise AssertionError(f"{arch} did not build a VisionTransformer")


def as_json(value):
    """A timm layer argument (a class, a functools.partial, a string) as table text."""
    import functools

    if isinstance(value, functools.partial):
        kw = ",".join(f"{k}={as_json(v)}" for k, v in sorted(value.keywords.items()))
        return f"{as_json(value.func)}({kw})"
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, tuple):
        return list(value)
    return value


def table(timm) -> dict[str, dict]:
    return {arch: {k: as_json(v) for k, v in sorted(entrypoint_args(timm, arch).items())}
            for arch in architectures(timm)}


def pretrained_defaults(timm) -> dict[str, dict]:
    """Per architecture, what timm's builder adds from the name's default pretrained_cfg when
    `create_model(name)` is called without them: the image size (`img_size`, ViTs having a
    fixed input size) and `num_classes`."""
    out = {}
    for arch in architectures(timm):
        cfg = timm.models.get_pretrained_cfg(arch)
        out[arch] = {"img_size": list(cfg.input_size[-2:]), "num_classes": cfg.num_classes}
    return out


def table_module(timm) -> str:
    """The text of vit/models/timm_table.py."""
    import pprint

    rows = pprint.pformat(table(timm), width=99, sort_dicts=True)
    defaults = pprint.pformat(pretrained_defaults(timm), width=99, sort_dicts=True)
    deit = pprint.pformat(tuple(architectures(timm, "deit")), width=99)
    return (f'"""The ViT architectures timm {timm.__version__} publishes (its `vision_transformer` '
            'and `deit`\nmodules) and the keyword arguments each name passes to '
            '`VisionTransformer` (`distilled`: the\ndeit module\'s `VisionTransformerDistilled`, '
            'with a distillation token and head); `DEIT`: the\ndeit module\'s names; '
            '`PRETRAINED`: the image size and classes timm adds from the name\'s\ndefault '
            'pretrained_cfg. Generated by\n`python tests/timm_reference.py > '
            'vit/models/timm_table.py`; do not edit.\n"""\n\n'
            f'TIMM_VERSION = "{timm.__version__}"\n'
            f"ARCHITECTURES = {rows}\n"
            f"DEIT = {deit}\n"
            f"PRETRAINED = {defaults}\n")


if __name__ == "__main__":
    sys.stdout.write(table_module(import_timm()))
