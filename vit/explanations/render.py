"""Pictures of maps: colour overlays on the original image, raw `.npy` grids, an HTML gallery.

Maps live on the patch grid of the preprocessed image; an overlay stretches the grid (bilinear)
over the part of the original image the model saw (all of it, or the centre crop when the
preprocessing crops), at the original size. Tiny images (8x8 digits) are first enlarged with
nearest-neighbour, to at least `min_side` pixels, so a person can see them. Every file is
written whole or not at all (a temporary name renamed into place): a rerun into the same folder
that fails part-way (a full disk) leaves the files already there as they were.
"""

from __future__ import annotations

import html
import math
import re
import urllib.parse
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image

from vit.images import to_rgb
from vit.paths import write_whole
from vit.preprocess import Preprocessing

MIN_SIDE = 128


def normalise(grid_map: np.ndarray) -> np.ndarray:
    """Scales a map to [0, 1]; a flat map becomes all zeros."""
    m = np.asarray(grid_map, np.float32)
    span = float(m.max() - m.min())
    return (m - m.min()) / span if span > 0 else np.zeros_like(m)


def enlarge(image: Image.Image, min_side: int = MIN_SIDE) -> Image.Image:
    """RGB image, enlarged by a whole factor (nearest) when its shorter side is under min_side."""
    image = to_rgb(image)
    factor = math.ceil(min_side / min(image.size)) if min(image.size) < min_side else 1
    if factor == 1:
        return image
    return image.resize((image.size[0] * factor, image.size[1] * factor), Image.NEAREST)


def seen_region(preprocessing: Preprocessing | None, size_wh: tuple[int, int]):
    """The box `(left, top, right, bottom)` of an original image that preprocessing keeps
    (beyond the image where it pads): `Preprocessing.seen_region`."""
    w, h = size_wh
    if preprocessing is None:
        return (0.0, 0.0, float(w), float(h))
    return preprocessing.seen_region((w, h))


def overlay(image: Image.Image, grid_map: np.ndarray, *, cmap: str = "jet", alpha: float = 0.5,
            region=None, min_side: int = MIN_SIDE) -> Image.Image:
    """The map in colour over the image, at the image's size (enlarged when tiny)."""
    original = to_rgb(image)
    base = enlarge(original, min_side)
    zoom = base.size[0] / original.size[0]
    left, top, right, bottom = (v * zoom for v in (region or (0, 0, *original.size)))
    box_w, box_h = max(1, round(right - left)), max(1, round(bottom - top))
    heat = Image.fromarray(normalise(grid_map), mode="F").resize((box_w, box_h), Image.BILINEAR)
    colours = matplotlib.colormaps[cmap](np.clip(np.asarray(heat), 0, 1))[..., :3] * 255.0
    out = np.asarray(base, np.float32).copy()
    t, lft = round(top), round(left)
    y0, x0 = max(t, 0), max(lft, 0)  # a padded input reaches beyond the image
    patch = out[y0:max(y0, t + box_h), x0:max(x0, lft + box_w)]
    colours = colours[y0 - t:, x0 - lft:]
    patch[...] = (1 - alpha) * patch + alpha * colours[:patch.shape[0], :patch.shape[1]]
    return Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8), "RGB")


class SafeNames:
    """File stems from arbitrary input names: no directories, no traversal, no collisions."""

    def __init__(self):
        self.taken: set[str] = set()

    def claim(self, name: str) -> str:
        base = re.split(r"[\\/]", str(name))[-1]
        base = re.sub(r"\.[A-Za-z0-9]{1,5}$", "", base)
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._-")[:80] or "image"
        stem, k = base, 1
        while stem.lower() in self.taken:
            stem, k = f"{base}-{k}", k + 1
        self.taken.add(stem.lower())
        return stem


def write_explanation(out: Path, stem: str, image: Image.Image, grid_map: np.ndarray, *,
                      cmap: str = "jet", alpha: float = 0.5, region=None) -> dict[str, str]:
    """Writes `overlays/STEM.png`, `maps/STEM.npy`, `inputs/STEM.png`; paths relative to out."""
    paths = {"overlay": f"overlays/{stem}.png", "map": f"maps/{stem}.npy",
             "input": f"inputs/{stem}.png"}
    for rel in paths.values():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
    picture = overlay(image, grid_map, cmap=cmap, alpha=alpha, region=region)
    write_whole(out / paths["overlay"], lambda f: picture.save(f, format="PNG"))
    grid = np.asarray(grid_map, np.float32)
    write_whole(out / paths["map"], lambda f: np.save(f, grid, allow_pickle=False))
    write_whole(out / paths["input"], lambda f: enlarge(image).save(f, format="PNG"))
    return paths


def write_gallery(out: Path, entries: list[dict], title: str = "vit rollout") -> Path:
    """`OUT/index.html`: input, overlay, label and probability per image; opens from disk.

    Each entry holds `input` and `overlay` (paths relative to out) and a `caption`; an entry
    may add `text_relevance` (`[{"token", "score"}, ...]`, a prompt's token scores), shown as
    the prompt with each token shaded by its score (exact values on hover).
    """
    cards = []
    for e in entries:
        src_in = urllib.parse.quote(e["input"])
        src_ov = urllib.parse.quote(e["overlay"])
        tokens = _shaded_tokens(e["text_relevance"]) if e.get("text_relevance") else ""
        cards.append(
            '<figure><div class="pair">'
            f'<a href="{src_in}"><img src="{src_in}" alt="input"></a>'
            f'<a href="{src_ov}"><img src="{src_ov}" alt="overlay"></a></div>'
            f"<figcaption>{html.escape(e['caption'])}{tokens}</figcaption></figure>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
main {{ display: flex; flex-wrap: wrap; gap: 1em; }}
figure {{ margin: 0; border: 1px solid #ccc; padding: .5em; }}
.pair img {{ height: 160px; image-rendering: pixelated; margin-right: .25em; }}
figcaption {{ font-size: 90%; max-width: 330px; overflow-wrap: anywhere; }}
.tokens {{ font-family: monospace; white-space: pre-wrap; margin: .3em 0 0; }}
</style></head>
<body><h1>{html.escape(title)}</h1><main>
{chr(10).join(cards)}
</main></body></html>
"""
    path = out / "index.html"
    # A file name that is not UTF-8 reaches us with surrogate escapes: each byte shows as "?".
    write_whole(path, lambda f: f.write(page.encode("utf-8", errors="replace")))
    return path


def _shaded_tokens(scores: list[dict]) -> str:
    """A prompt's tokens, each shaded red by its score relative to the largest one."""
    top = max((abs(t["score"]) for t in scores), default=0.0)
    spans = []
    for t in scores:
        strength = abs(t["score"]) / top if top > 0 else 0.0
        spans.append(f'<span style="background: rgba(255, 0, 0, {strength:.2f})" '
                     f'title="{t["score"]:.4g}">{html.escape(t["token"])}</span>')
    return f'<p class="tokens">{"".join(spans)}</p>'
