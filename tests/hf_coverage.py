"""The Hugging Face model types and classes the reader and writer cover, each built tiny by
transformers from its config class with every parameter perturbed, and the sweep that writes the
coverage table of docs/checkpoints.md from them.

    .venv/bin/python tests/hf_coverage.py            # rewrite the table in docs/checkpoints.md
    .venv/bin/python tests/hf_coverage.py --measure  # print each case's largest difference

`tests/test_hf_models.py` checks every case that reads: within 1e-5 of transformers' own forward,
written back, opened by transformers and the same again. The table says what each case does:
read (and as what), written (as which class), or refused (the reason, as the error says it).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "checkpoints.md"
BEGIN, END = "<!-- coverage hf -->", "<!-- /coverage hf -->"
TOLERANCE = 1e-5

V = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
         image_size=32, patch_size=8)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=100, max_position_embeddings=16, pad_token_id=1, bos_token_id=0,
            eos_token_id=2)
LABELS = dict(num_labels=5, id2label={i: f"class {i}" for i in range(5)})


@dataclasses.dataclass(frozen=True)
class Case:
    """One transformers class built tiny. `build(transformers)` gives (model, processor).
    `refused`: the refusal's words, for a case that is not read. `slow`: left to `-m slow`."""

    id: str
    model_type: str
    cls: str
    build: Callable
    note: str = ""
    refused: str | None = None
    slow: bool = False


def _vit_proc(t, size=32, crop=None, kind="ViTImageProcessor", **kw):
    cls = getattr(t, kind)
    if crop:
        return cls(size={"height": size, "width": size}, do_center_crop=True,
                   crop_size={"height": crop, "width": crop}, **kw)
    return cls(size={"height": size, "width": size}, **kw)


def _bit_proc(t, kind, edge=36, crop=32):
    return getattr(t, kind)(size={"shortest_edge": edge}, crop_size={"height": crop,
                                                                      "width": crop})


def _clip(**kw):
    return lambda t: t.CLIPConfig(vision_config=V, text_config=TEXT, **kw)


def _siglip(**kw):
    return lambda t: t.SiglipConfig(vision_config=V, text_config=TEXT, **kw)


def case(id, model_type, cls, config, processor, **kw) -> Case:
    def build(t):
        return getattr(t, cls)(config(t)).eval(), processor(t)
    return Case(id, model_type, cls, build, **kw)


def _dinov2(**kw):
    return lambda t: t.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    mlp_ratio=2, image_size=48, patch_size=8, **kw)


CASES = [
    case("vit", "vit", "ViTForImageClassification", lambda t: t.ViTConfig(**V, **LABELS),
         _vit_proc, note="the class token; exact GELU and eps 1e-12 unless config.json says",
         slow=True),
    case("vit-model", "vit", "ViTModel", lambda t: t.ViTConfig(**V), _vit_proc,
         note="pooler: Dense + tanh on the class token (our pre_logits)", slow=True),
    case("deit-teacher", "deit", "DeiTForImageClassificationWithTeacher",
         lambda t: t.DeiTConfig(**V, **LABELS),
         lambda t: _vit_proc(t, 36, 32, "DeiTImageProcessor"),
         note="distillation token; class and distillation heads averaged"),
    case("deit", "deit", "DeiTForImageClassification", lambda t: t.DeiTConfig(**V, **LABELS),
         lambda t: _vit_proc(t, 36, 32, "DeiTImageProcessor"),
         note="the class head alone; the distillation token still attends", slow=True),
    case("deit-model", "deit", "DeiTModel", lambda t: t.DeiTConfig(**V),
         lambda t: _vit_proc(t, 36, 32, "DeiTImageProcessor"),
         note="pooler: Dense + tanh on the class token", slow=True),
    case("dinov2-swiglu", "dinov2", "Dinov2ForImageClassification",
         _dinov2(use_swiglu_ffn=True, **LABELS), lambda t: _bit_proc(t, "BitImageProcessor"),
         note="SwiGLU, layer scale, class token + patch mean; 6x6 position grid resized to the "
              "processor's 4x4 as transformers does at every forward"),
    case("dinov2", "dinov2", "Dinov2ForImageClassification", _dinov2(**LABELS),
         lambda t: _bit_proc(t, "BitImageProcessor"), note="MLP, layer scale", slow=True),
    case("dinov2-model", "dinov2", "Dinov2Model", _dinov2(),
         lambda t: _bit_proc(t, "BitImageProcessor"), note="pooled output: the class token",
         slow=True),
    case("clip", "clip", "CLIPForImageClassification", _clip(**LABELS),
         lambda t: _bit_proc(t, "CLIPImageProcessor", 32),
         note="patch mean before post_layernorm, which is skipped (never run), and said"),
    case("clip-model", "clip", "CLIPModel", _clip(projection_dim=16),
         lambda t: _bit_proc(t, "CLIPImageProcessor", 32),
         note="image tower and visual_projection (our head, a zero bias); text tower, "
              "text_projection and logit_scale skipped, and said"),
    case("clip-vision", "clip_vision_model", "CLIPVisionModel",
         lambda t: t.CLIPVisionConfig(**V), lambda t: _bit_proc(t, "CLIPImageProcessor", 32),
         note="pre_layrnorm, no patch bias, quick GELU; post_layernorm of the class token",
         slow=True),
    case("clip-vision-proj", "clip_vision_model", "CLIPVisionModelWithProjection",
         lambda t: t.CLIPVisionConfig(**V, projection_dim=16),
         lambda t: _bit_proc(t, "CLIPImageProcessor", 32),
         note="visual_projection: our head with a zero bias", slow=True),
    case("siglip", "siglip", "SiglipForImageClassification", _siglip(**LABELS),
         lambda t: _vit_proc(t, kind="SiglipImageProcessor"),
         note="token mean; the attention-pooling head is skipped (never run), and said"),
    case("siglip-vision", "siglip_vision_model", "SiglipVisionModel",
         lambda t: t.SiglipVisionConfig(**V), lambda t: _vit_proc(t, kind="SiglipImageProcessor"),
         note="no class token; attention-pooling head (our 'map')"),
    case("siglip-model", "siglip", "SiglipModel", _siglip(),
         lambda t: _vit_proc(t, kind="SiglipImageProcessor"),
         note="text tower, logit_scale and logit_bias skipped, and said", slow=True),
    case("beit", "beit", "BeitForImageClassification",
         lambda t: t.BeitConfig(**V, **LABELS, use_relative_position_bias=True,
                                use_absolute_position_embeddings=True),
         lambda t: _vit_proc(t, kind="BeitImageProcessor"),
         note="per-layer relative position bias, layer scale, no key bias, absolute positions, "
              "patch mean and its norm"),
    case("beit-token", "beit", "BeitForImageClassification",
         lambda t: t.BeitConfig(**V, **LABELS, use_shared_relative_position_bias=True,
                                use_mean_pooling=False, layer_scale_init_value=0.0),
         lambda t: _vit_proc(t, kind="BeitImageProcessor"),
         note="shared relative position bias, no absolute positions, class token, no layer "
              "scale", slow=True),
    case("beit-model", "beit", "BeitModel",
         lambda t: t.BeitConfig(**V, use_relative_position_bias=True),
         lambda t: _vit_proc(t, kind="BeitImageProcessor"),
         note="pooled output: the patch mean and its norm", slow=True),
    case("data2vec", "data2vec-vision", "Data2VecVisionForImageClassification",
         lambda t: t.Data2VecVisionConfig(**V, **LABELS, use_shared_relative_position_bias=True),
         lambda t: _vit_proc(t, kind="BeitImageProcessor"),
         note="shared relative position bias; written as beit, the same computation"),
    case("data2vec-model", "data2vec-vision", "Data2VecVisionModel",
         lambda t: t.Data2VecVisionConfig(**V), lambda t: _vit_proc(t, kind="BeitImageProcessor"),
         refused="has no pooled output"),
    case("siglip-vision-nohead", "siglip_vision_model", "SiglipVisionModel",
         lambda t: t.SiglipVisionConfig(**V, vision_use_head=False),
         lambda t: _vit_proc(t, kind="SiglipImageProcessor"), refused="has no pooled output"),
    case("vit-mae", "vit_mae", "ViTMAEModel", lambda t: t.ViTMAEConfig(**V),
         lambda t: _vit_proc(t), refused="is not read"),
]


def quiet() -> None:
    """transformers' progress bars and backend notices off (they would bury the output)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def perturbed(model, seed: int = 0):
    """`model` with every parameter moved by 0.1 * N(0, 1), so that zero-initialised ones
    (layer scale, biases, position bias tables) are not trivially right."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save_case(c: Case, folder: Path, seed: int = 0):
    """Builds, perturbs and saves `c` (weights and processor) to `folder`; returns (model,
    processor)."""
    import transformers

    model, processor = c.build(transformers)
    perturbed(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return model, processor


def output_of(cls: str) -> str:
    """What a transformers class gives that is compared: "probs" (softmax of a classifier's
    logits), "image_features" (a two-tower model's `get_image_features`), "image_embeds"
    (CLIPVisionModelWithProjection) or "pooled" (a backbone's `pooler_output`)."""
    if cls.endswith(("ForImageClassification", "WithTeacher")):
        return "probs"
    if cls in ("CLIPModel", "SiglipModel"):
        return "image_features"
    return "image_embeds" if cls.endswith("WithProjection") else "pooled"


def reference(model, pixels_nhwc: np.ndarray) -> np.ndarray:
    """transformers' output of `model` on `pixels_nhwc` (already prepared)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(pixels_nhwc.transpose(0, 3, 1, 2)))
    output = output_of(type(model).__name__)
    with torch.no_grad():
        if output == "image_features":
            return model.get_image_features(pixel_values=x).pooler_output.numpy()
        out = model(pixel_values=x)
        if output == "probs":
            return torch.softmax(out.logits, -1).numpy()
        return (out.image_embeds if output == "image_embeds" else out.pooler_output).numpy()


def ours(loaded, pixels_nhwc: np.ndarray, probs: bool) -> np.ndarray:
    """Our model's output on `pixels_nhwc`: probabilities (`probs`), else the raw output (the
    pooled or projected features of a backbone)."""
    import jax

    out = loaded.build_model()(jax.numpy.asarray(pixels_nhwc))
    return np.asarray(jax.nn.softmax(out, -1) if probs else out)


def sweep(measure: bool = False, folder_of: Callable | None = None) -> list[dict]:
    """Each case read, written back and reopened by transformers (the forwards run only with
    `measure`): a row per case, with what happened. `folder_of(case)`: where the case is
    already saved (without it each is built and saved here)."""
    import json

    import transformers

    from vit.checkpoints import load_checkpoint, save_checkpoint
    from vit.errors import CheckpointError

    quiet()
    rows = []
    for c in CASES:
        row = {"case": c}
        rows.append(row)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "src", Path(tmp) / "out"
            if folder_of is None or measure:
                model, _ = save_case(c, src)
            else:
                src = folder_of(c)
            try:
                loaded = load_checkpoint(src)
            except CheckpointError as err:
                row["refused"] = str(err).replace(f"{src}/", "")
                continue
            row["read_as"] = re.search(r"\(Hugging Face (\w+)\)", loaded.source).group(1)
            save_checkpoint(loaded, out, "hf")
            written = json.loads((out / "config.json").read_text())
            row["written"] = (written["model_type"], written["architectures"][0])
            if measure:
                size = loaded.preprocessing.size
                x = np.random.RandomState(0).randn(2, *size, 3).astype(np.float32)
                back = getattr(transformers, written["architectures"][0]).from_pretrained(out)
                want = reference(model, x)
                probs = output_of(c.cls) == "probs"
                row["diff"] = float(np.abs(ours(loaded, x, probs) - want).max())
                row["diff_back"] = float(np.abs(reference(back.eval(), x) - want).max())
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "Made by `.venv/bin/python tests/hf_coverage.py` from the cases in that file: each a "
        "transformers class built tiny from its config class, every parameter perturbed, saved "
        "with `save_pretrained`. `tests/test_hf_models.py` checks every row read within 1e-5 "
        "of transformers' forward (probabilities; pooled or projected features for a backbone),"
        " written back and opened by the class named with no array missing or left over, the "
        "same again (`--measure` prints the differences).",
        "", "| model_type | class | read | written as | what it covers |", "|---|---|---|---|---|"]
    for row in rows:
        c = row["case"]
        if "refused" in row:
            lines.append(f"| `{c.model_type}` | `{c.cls}` | no: {row['refused']} | | |")
            continue
        model_type, arch = row["written"]
        lines.append(f"| `{c.model_type}` | `{c.cls}` | yes | `{model_type}` `{arch}` | "
                     f"{c.note} |")
    return "\n".join(lines)


def render(doc: str, rows: list[dict]) -> str:
    """`doc` with the table between the markers (a "Coverage" section added if absent)."""
    block = f"{BEGIN}\n{table(rows)}\n{END}"
    if BEGIN in doc:
        start, end = doc.index(BEGIN), doc.index(END) + len(END)
        return doc[:start] + block + doc[end:]
    if "## Coverage" not in doc:
        doc = doc.rstrip("\n") + "\n\n## Coverage\n"
    head, _, tail = doc.partition("## Coverage\n")
    return f"{head}## Coverage\n\n{block}\n{tail}"


def main(argv: list[str]) -> None:
    if "--measure" in argv:
        for row in sweep(measure=True):
            c = row["case"]
            what = (f"refused: {row['refused']}" if "refused" in row else
                    f"read {row['diff']:.2e}, written back {row['diff_back']:.2e}")
            print(f"{c.id:22s} {c.cls:40s} {what}")
        return
    DOC.write_text(render(DOC.read_text(), sweep()))
    print(f"wrote the Hugging Face coverage table in {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])
