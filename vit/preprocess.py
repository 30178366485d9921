"""Turning an image file or PIL image into the model's input, as a checkpoint's source expects.

Each checkpoint family has its own convention (vit_jax and big_vision: [-1, 1]; Hugging Face:
its `preprocessor_config.json`; timm: its `pretrained_cfg`). A `Preprocessing` records one, travels
inside our own checkpoints, and is applied the same way by predict, eval and rollout, so nobody
guesses. Each convention is reproduced to the pixel, rounding rules included: timm's eval
transform (`transforms_imagenet_eval`: torchvision's `Resize` and `CenterCrop` on PIL images,
timm's `ResizeKeepRatio` and `CenterCropOrPad`) and transformers' PIL image processors
(`resize`, then its own `center_crop`). Needs only numpy and PIL.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

import numpy as np
from PIL import Image

from vit.errors import ConfigError, DataError
from vit.images import to_rgb

RESAMPLE = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
            "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}
# PIL's resampling enum, as transformers' preprocessor_config.json stores `resample`.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# timm's names: "center" keeps the aspect and crops; "squash" resizes both sides to
# size / crop_pct; "border" fits the longer side and pads with the mean colour.
CROP_MODES = ("center", "squash", "border")
RESCALE = 1 / 255
# timm's resolve_data_config, for a pretrained_cfg key that is absent (or empty, or null).
TIMM_DEFAULTS = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": IMAGENET_MEAN,
                 "std": IMAGENET_STD, "crop_pct": 0.875, "crop_mode": "center"}

# transformers 5's PIL image processor for each model type: its class and the class attributes
# a preprocessor_config.json key falls back to when absent or null
# (models/*/image_processing_pil_*.py; None: the attribute is unset, i.e. off).
_VIT = {"resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "size": {"height": 224, "width": 224}, "default_to_square": True, "crop_size": None,
        "do_resize": True, "do_center_crop": None, "do_rescale": True, "rescale_factor": RESCALE,
        "do_normalize": True, "do_convert_rgb": None, "do_pad": None}
_BIT = {**_VIT, "resample": 3, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
        "size": {"shortest_edge": 224}, "default_to_square": False,
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
        "do_convert_rgb": True}
_BEIT = {**_VIT, "resample": 3, "crop_size": {"height": 224, "width": 224},
         "do_center_crop": False}
HF_PROCESSORS = {
    "vit": ("ViTImageProcessor", _VIT),
    "deit": ("DeiTImageProcessor", {**_VIT, "resample": 3, "size": {"height": 256, "width": 256},
                                    "crop_size": {"height": 224, "width": 224},
                                    "do_center_crop": True}),
    "dinov2": ("BitImageProcessor", _BIT),
    "bit": ("BitImageProcessor", _BIT),
    "clip": ("CLIPImageProcessor", _BIT),
    "clip_vision_model": ("CLIPImageProcessor", _BIT),
    "siglip": ("SiglipImageProcessor", {**_VIT, "resample": 3, "default_to_square": False,
                                        "do_convert_rgb": True}),
    "siglip_vision_model": ("SiglipImageProcessor", {**_VIT, "resample": 3,
                                                     "default_to_square": False,
                                                     "do_convert_rgb": True}),
    "beit": ("BeitImageProcessor", _BEIT),
    "data2vec-vision": ("BeitImageProcessor", _BEIT),
}


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Resize (then maybe crop or pad) to `size`, rescale, normalise per channel.

    The resize rule, one of:
    - none of `crop_pct`, `shortest_edge`, `resize_to`: resize straight to `size` (vit_jax,
      big_vision, transformers' `{height, width}` without a crop);
    - `crop_pct` (timm's eval transform): with `crop_mode` "center", the shorter side to
      `floor(size / crop_pct)` and a centre crop of `size`; "squash", both sides to
      `floor(size / crop_pct)` and a centre crop; "border", the longer side to
      `floor(size / crop_pct)` and a centre crop or pad (with the mean colour) to `size`. The
      crop offset is torchvision's `round((h - crop_h) / 2)`;
    - `shortest_edge` (transformers): the shorter side to it, the longer to
      `int(shortest_edge * long / short)`, then transformers' centre crop to `size`
      (offset `(h - crop_h) // 2`);
    - `resize_to` (transformers): resize to that `(height, width)`, then its centre crop to `size`.

    Pixels become `x * rescale_factor` (1/255: [0, 1]), then `(x - mean) / std`. Any image mode
    becomes RGB first (`vit.images.to_rgb`: transparency onto white, as transformers'
    `convert_to_rgb`; timm's transform takes RGB only, its loaders drop transparency instead).
    """

    size: tuple[int, int] = (224, 224)
    resample: str = "bilinear"
    crop_pct: float | None = None
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_mode: str = "center"
    shortest_edge: int | None = None
    resize_to: tuple[int, int] | None = None
    rescale_factor: float = RESCALE

    def __post_init__(self):
        object.__setattr__(self, "size", _numbers("image size", self.size, int))
        object.__setattr__(self, "mean", _numbers("mean", self.mean, float))
        object.__setattr__(self, "std", _numbers("std", self.std, float))
        if self.crop_pct is not None:
            object.__setattr__(self, "crop_pct", _number("crop_pct", self.crop_pct))
        if self.shortest_edge is not None:
            object.__setattr__(self, "shortest_edge",
                               _number("shortest_edge", self.shortest_edge, int))
        if self.resize_to is not None:
            object.__setattr__(self, "resize_to", _numbers("resize_to", self.resize_to, int))
        object.__setattr__(self, "rescale_factor",
                           _number("rescale_factor", self.rescale_factor))
        if not isinstance(self.resample, str) or self.resample not in RESAMPLE:
            raise DataError(f"unknown resample {self.resample!r}; use one of {', '.join(RESAMPLE)}")
        # Values that would divide by zero or fail to broadcast deep inside the pipeline.
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"image size {self.size}: must be two sizes of at least 1 pixel")
        if self.crop_pct is not None and not (self.crop_pct > 0 and math.isfinite(self.crop_pct)):
            raise ConfigError(f"crop_pct={self.crop_pct}: must be above 0 (timm's usual value is "
                              "0.875), or none to resize without cropping")
        if self.crop_mode not in CROP_MODES:
            raise ConfigError(f"crop_mode={self.crop_mode!r}: use one of {', '.join(CROP_MODES)} "
                              "(timm's names)")
        if self.crop_pct is None and self.crop_mode != "center":
            # timm's crop_mode shapes crop_pct's crop; without one the image is resized to size,
            # which is what every mode does at crop_pct 1.
            object.__setattr__(self, "crop_mode", "center")
        if self.shortest_edge is not None and self.shortest_edge < 1:
            raise ConfigError(f"shortest_edge={self.shortest_edge}: must be at least 1 pixel")
        if self.resize_to is not None and (len(self.resize_to) != 2 or min(self.resize_to) < 1):
            raise ConfigError(f"resize_to={list(self.resize_to)}: give [height, width], each at "
                              "least 1 pixel")
        rules = [n for n in ("crop_pct", "shortest_edge", "resize_to")
                 if getattr(self, n) is not None]
        if len(rules) > 1:
            raise ConfigError(f"{' and '.join(rules)} are two resize rules: set one of them "
                              "(crop_pct: timm's; shortest_edge or resize_to: transformers')")
        if self.resize_to == self.size:  # the centre crop of an image at its own size
            object.__setattr__(self, "resize_to", None)
        if not (self.rescale_factor > 0 and math.isfinite(self.rescale_factor)):
            raise ConfigError(f"rescale_factor={self.rescale_factor}: must be above 0 (pixels "
                              "are multiplied by it; 1/255 gives [0, 1])")
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (1, 3):
                raise ConfigError(f"{name}={list(getattr(self, name))}: give 3 values, one per "
                                  "RGB channel (or 1 for all three)")
        if not all(math.isfinite(m) for m in self.mean):
            raise ConfigError(f"mean={list(self.mean)}: every value must be a finite number")
        if not all(s > 0 and math.isfinite(s) for s in self.std):
            raise ConfigError(f"std={list(self.std)}: every value must be above 0 (the pixels "
                              "are divided by it)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        """A `to_dict`; a field it lacks (an older checkpoint's) takes its default, which keeps
        the older meaning: crop_pct is timm's centre crop, 1/255, transparency onto white."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})

    def with_size(self, size: int | tuple[int, int]) -> Preprocessing:
        """The same preprocessing at another input size: crop_pct stays; a transformers resize
        before its crop keeps its ratio to the crop."""
        size = (size, size) if isinstance(size, int) else tuple(size)
        changes: dict[str, Any] = {"size": size}
        if self.shortest_edge is not None:
            changes["shortest_edge"] = round(self.shortest_edge * min(size) / min(self.size))
        if self.resize_to is not None:
            changes["resize_to"] = tuple(round(r * s / o) for r, s, o in
                                         zip(self.resize_to, size, self.size, strict=True))
        return dataclasses.replace(self, **changes)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """PIL image of any mode -> float32 `[h, w, 3]` array."""
        image = resize_crop(to_rgb(image), self)
        return normalize(image, self.mean, self.std, self.rescale_factor)

    # -- the geometry ---------------------------------------------------------------------------
    def geometry(self, image_wh: tuple[int, int]
                 ) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, ...]]:
        """For an image of `(width, height)`: the `(width, height)` it is resized to, the box
        `(left, top, right, bottom)` of the output in the resized image (outside it where the
        output is padded), and the padding's colour. The one copy of this arithmetic."""
        w, h = image_wh
        th, tw = self.size
        fill: tuple[int, ...] = (0,)
        if self.crop_pct is not None:  # timm's transforms_imagenet_eval
            sh, sw = (math.floor(x / self.crop_pct) for x in self.size)
            if self.crop_mode == "squash":
                resized = sw, sh
            elif self.crop_mode == "border":
                resized = _keep_ratio(w, h, sh, sw, longest=1.0)
                fill = tuple(round(255 * m) for m in self.mean)
            elif sh == sw:  # torchvision's Resize(int): the shorter side
                resized = _shorter_side(w, h, sh)
            else:
                resized = _keep_ratio(w, h, sh, sw, longest=0.0)
            offset = _torchvision_offset
        elif self.shortest_edge is not None:  # transformers: resize, then its centre crop
            resized, offset = _shorter_side(w, h, self.shortest_edge), _transformers_offset
        elif self.resize_to is not None:
            resized, offset = (self.resize_to[1], self.resize_to[0]), _transformers_offset
        else:
            return (tw, th), (0, 0, tw, th), fill
        left, top = offset(resized[0], tw), offset(resized[1], th)
        return resized, (left, top, left + tw, top + th), fill

    def seen_region(self, image_wh: tuple[int, int]) -> tuple[float, float, float, float]:
        """The box `(left, top, right, bottom)` in the original image's pixels that the model's
        input covers (beyond the image where the input is padded)."""
        (rw, rh), (left, top, right, bottom), _ = self.geometry(image_wh)
        sx, sy = rw / image_wh[0], rh / image_wh[1]
        return (left / sx, top / sy, right / sx, bottom / sy)

    def describe_geometry(self) -> str:
        """The resize rule in words, e.g. `shorter side to 248, centre crop 224x224 (timm crop_pct
        0.9, crop_mode center)`."""
        th, tw = self.size
        if self.crop_pct is not None:
            sh, sw = (math.floor(x / self.crop_pct) for x in self.size)
            scaled = f"{sh}" if sh == sw else f"{sh}x{sw}"
            what = {"center": f"shorter side to {scaled}, centre crop",
                    "squash": f"resize to {sh}x{sw}, centre crop",
                    "border": f"longer side to {scaled}, centre crop or pad"}[self.crop_mode]
            return (f"{what} {th}x{tw} (timm crop_pct {self.crop_pct:g}, crop_mode "
                    f"{self.crop_mode})")
        if self.shortest_edge is not None:
            return (f"shorter side to {self.shortest_edge}, centre crop {th}x{tw} "
                    "(transformers)")
        if self.resize_to is not None:
            return (f"resize to {self.resize_to[0]}x{self.resize_to[1]}, centre crop {th}x{tw} "
                    "(transformers)")
        return f"resize to {th}x{tw}"

    # -- timm -----------------------------------------------------------------------------------
    @classmethod
    def from_timm(cls, pretrained_cfg: dict, image_size: tuple[int, int] | None = None
                  ) -> Preprocessing:
        """What timm's `create_transform(**resolve_data_config(pretrained_cfg=cfg),
        is_training=False)` does to an RGB image. A key that is absent, null or empty takes
        timm's default (`TIMM_DEFAULTS`), except `input_size`, which falls back to `image_size`
        when given (the model's size). A value timm would fail on, or silently replace, is a
        ConfigError naming the key."""
        if not isinstance(pretrained_cfg, dict):
            raise ConfigError(f"pretrained_cfg is {_shown(pretrained_cfg)}, not a dict")
        pc = pretrained_cfg

        def get(key):  # resolve_data_config: `is not None` for input_size, truthiness otherwise
            value = pc.get(key)
            if key == "input_size" and value is None and image_size is not None:
                return (3, *image_size)
            if (value is None) if key == "input_size" else not _truthy(value):
                return TIMM_DEFAULTS[key]
            return value

        size = get("input_size")
        if (not isinstance(size, (list, tuple)) or len(size) not in (2, 3)
                or not all(_is_number(v, int) and v >= 1 for v in size)):
            raise ConfigError(f"pretrained_cfg.input_size={_shown(size)}: expected [3, height, "
                              "width]")
        if len(size) == 3 and size[0] != 3:
            raise ConfigError(f"pretrained_cfg.input_size={_shown(size)}: {size[0]} channels; "
                              "images are prepared as RGB, 3 channels")
        interpolation = get("interpolation")
        if not isinstance(interpolation, str) or interpolation not in RESAMPLE:
            raise ConfigError(f"pretrained_cfg.interpolation={_shown(interpolation)}: use one "
                              f"of {', '.join(RESAMPLE)}")
        crop_mode = get("crop_mode")
        if crop_mode not in CROP_MODES:  # timm would take any other value as "center"
            raise ConfigError(f"pretrained_cfg.crop_mode={_shown(crop_mode)}: use one of "
                              f"{', '.join(CROP_MODES)}")
        values = {}
        for key in ("mean", "std"):
            value = get(key)
            if not isinstance(value, (list, tuple)) or not all(_is_number(v, float)
                                                                for v in value):
                raise ConfigError(f"pretrained_cfg.{key}={_shown(value)}: expected a list of "
                                  "numbers, one per RGB channel")
            values[key] = tuple(value)
        crop_pct = get("crop_pct")
        if not _is_number(crop_pct, float) or not crop_pct > 0:
            raise ConfigError(f"pretrained_cfg.crop_pct={_shown(crop_pct)}: expected a number "
                              "above 0, e.g. 0.875")
        hw = tuple(int(v) for v in size[-2:])
        if crop_mode == "squash" and all(math.floor(x / crop_pct) == x for x in hw):
            crop_pct, crop_mode = None, "center"  # resized straight to the size, nothing cut
        try:
            return cls(size=hw, resample=interpolation, crop_pct=crop_pct, crop_mode=crop_mode,
                       **values)
        except (ConfigError, DataError) as err:
            raise ConfigError(f"pretrained_cfg: {err}") from None

    def to_timm_pretrained_cfg(self) -> dict[str, Any]:
        """The pretrained_cfg keys with which timm prepares RGB images as this does. A
        ConfigError when timm cannot say it."""
        if self.rescale_factor != RESCALE:
            raise ConfigError(f"rescale_factor={self.rescale_factor:g}: timm always divides by "
                              "255; orbax keeps it")
        if self.shortest_edge is not None:
            raise ConfigError(
                f"preprocessing {self.describe_geometry()}: timm has no equal (its centre crop "
                "rounds the offset half to even where transformers' rounds it down, a pixel "
                "apart for some image sizes); orbax keeps it")
        crop_pct, crop_mode = self.crop_pct, self.crop_mode
        if crop_pct is None:
            crop_pct, crop_mode = _squash_crop_pct(self.size, self.resize_to or self.size)
            if crop_pct is None:
                raise ConfigError(
                    f"preprocessing {self.describe_geometry()}: timm's squash mode cannot "
                    "resize to that size before this crop, or crops it a pixel elsewhere; "
                    "orbax keeps it")
        return {"input_size": [3, *self.size], "interpolation": self.resample,
                "mean": _three(self.mean), "std": _three(self.std), "crop_pct": crop_pct,
                "crop_mode": crop_mode}

    # -- transformers ---------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, processor: dict, model_type: str, where) -> Preprocessing:
        """What transformers' PIL image processor for `model_type` does with this
        `preprocessor_config.json` (`processor`); absent or null keys take that class's
        defaults (`HF_PROCESSORS`). `where` (the file) starts every error message. A value
        transformers would fail on, or that makes each image another size, is a ConfigError.
        Other modes become RGB as the processors do with do_convert_rgb (without it they take
        RGB only)."""
        if model_type not in HF_PROCESSORS:
            raise ConfigError(f"{where}: model_type {model_type!r} has no known image processor; "
                              f"one of {', '.join(HF_PROCESSORS)}")
        if not isinstance(processor, dict):
            raise ConfigError(f"{where}: expected a JSON object, not {_shown(processor)}")
        defaults = HF_PROCESSORS[model_type][1]
        pc = {**defaults, **{k: v for k, v in processor.items() if v is not None}}

        def bad(key, want, value=None):
            # key: a processor key, or key.inner for a value inside one (value then given)
            shown = _shown(pc[key] if value is None else value)
            return ConfigError(f"{where}: {key} is {shown}, not {want}; fix or replace the file")

        for key in ("do_resize", "do_center_crop", "do_rescale", "do_normalize",
                    "do_convert_rgb", "do_pad", "default_to_square"):
            if pc.get(key) is not None and not isinstance(pc[key], bool):
                raise bad(key, "true or false")
        if model_type.startswith("clip") and processor.get("use_square_size"):
            pc["size"] = {"height": 224, "width": 224}  # CLIPImageProcessorPil, for KOSMOS-2
        if not pc["do_resize"]:
            raise bad("do_resize", "true (without a resize each image keeps its own size; the "
                      "model takes one size)")
        if pc.get("do_pad"):
            raise bad("do_pad", "false (padding after normalisation is not supported)")
        size = _hf_size(pc["size"], pc["default_to_square"], "size", bad)
        crop = None
        if pc.get("do_center_crop"):
            if pc.get("crop_size") is None:
                raise bad("do_center_crop", "true without a crop_size")
            crop = _hf_size(pc["crop_size"], True, "crop_size", bad)
            if "height" not in crop:
                raise bad("crop_size", '{"height": H, "width": W}')
            crop = crop["height"], crop["width"]
        resample = pc["resample"]
        if isinstance(resample, bool) or not isinstance(resample, int) or (
                resample not in PIL_RESAMPLE):
            raise bad("resample", "a PIL resampling code (0 to 5)")
        rescale = 1.0
        if pc["do_rescale"]:
            rescale = pc["rescale_factor"]
            if not _is_number(rescale, float) or not rescale > 0:
                raise bad("rescale_factor", "a number above 0, e.g. 1/255")
        mean, std = (0.0,) * 3, (1.0,) * 3
        if pc["do_normalize"]:
            mean = _hf_channels(pc, "image_mean", bad)
            std = _hf_channels(pc, "image_std", bad)
        kw = {"resample": PIL_RESAMPLE[resample], "mean": mean, "std": std,
              "rescale_factor": rescale}
        if "shortest_edge" in size:
            if crop is None:
                raise bad("size", "{\"shortest_edge\": ...} without a centre crop (each image "
                          "keeps its aspect, so its own size; set do_center_crop and "
                          "crop_size, or size {\"height\", \"width\"})")
            kw.update(size=crop, shortest_edge=size["shortest_edge"])
        else:
            resized = size["height"], size["width"]
            kw.update(size=crop or resized, resize_to=resized if crop else None)
        try:
            return cls(**kw)
        except (ConfigError, DataError) as err:
            raise ConfigError(f"{where}: {err}") from None

    def to_hf_processor(self, model_type: str) -> dict[str, Any]:
        """A `preprocessor_config.json` with which transformers' image processor for
        `model_type` (AutoImageProcessor opens it) prepares images as this does, of any mode
        (do_convert_rgb). A ConfigError when transformers cannot say it."""
        if model_type not in HF_PROCESSORS:
            raise ConfigError(f"model_type {model_type!r} has no known image processor; one of "
                              f"{', '.join(HF_PROCESSORS)}")
        th, tw = self.size
        crop = {"height": th, "width": tw}
        if self.shortest_edge is not None:
            size: dict[str, int] = {"shortest_edge": self.shortest_edge}
        else:
            resized = self.resize_to
            if self.crop_pct is not None:
                resized = None
                if self.crop_mode == "squash":
                    resized = tuple(math.floor(x / self.crop_pct) for x in self.size)
                if resized is None or any(
                        _torchvision_offset(r, c) != _transformers_offset(r, c)
                        for r, c in zip(resized, self.size, strict=True)):
                    raise ConfigError(
                        f"preprocessing {self.describe_geometry()}: transformers' processors "
                        "have no equal (they crop at another offset, or only after a fixed "
                        "resize); orbax keeps it")
            resized = resized or self.size
            size = {"height": resized[0], "width": resized[1]}
        pil = {name: code for code, name in PIL_RESAMPLE.items()}
        return {"image_processor_type": HF_PROCESSORS[model_type][0], "do_resize": True,
                "size": size, "resample": pil[self.resample],
                "do_center_crop": size != crop, "crop_size": crop, "do_rescale": True,
                "rescale_factor": self.rescale_factor, "do_normalize": True,
                "image_mean": _three(self.mean), "image_std": _three(self.std),
                "do_convert_rgb": True}


def _is_number(value, kind) -> bool:
    """A real number (a whole one for `int`); a string is not one, it is never parsed."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return kind is not int or float(value).is_integer()


def _truthy(value) -> bool:
    try:
        return bool(value)
    except ValueError:  # an array: not a pretrained_cfg value, but not empty either
        return True


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(name: str, value, kind=float):
    """`value` as `kind`, or a ConfigError naming the field."""
    if not _is_number(value, kind):
        raise ConfigError(f"{name}={value!r}: expected a number")
    return kind(value)


def _numbers(name: str, values, kind) -> tuple:
    """A list of numbers as a tuple of `kind`, or a ConfigError naming the field."""
    if not isinstance(values, (tuple, list, np.ndarray)) or not all(
            _is_number(v, kind) for v in values):
        what = "whole numbers" if kind is int else "numbers"
        raise ConfigError(f"{name}={values!r}: expected a list of {what}")
    return tuple(kind(v) for v in values)


def _three(values: tuple[float, ...]) -> list[float]:
    return list(values) * 3 if len(values) == 1 else list(values)


def _shorter_side(w: int, h: int, side: int) -> tuple[int, int]:
    """torchvision's `Resize(side)` (`_compute_resized_output_size`) and transformers'
    `shortest_edge`: the shorter side to `side`, the longer to `int(side * long / short)`."""
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(side * long / short)
    return (side, new_long) if w <= h else (new_long, side)


def _keep_ratio(w: int, h: int, target_h: int, target_w: int, longest: float
                ) -> tuple[int, int]:
    """timm's `ResizeKeepRatio.get_params` (no random scale or aspect): the shorter side fits
    (longest 0) or the longer (longest 1); each side is `round(side / ratio)`."""
    ratio_h, ratio_w = h / target_h, w / target_w
    ratio = max(ratio_h, ratio_w) * longest + min(ratio_h, ratio_w) * (1.0 - longest)
    new_h, new_w = (round(x * 1.0 / ratio) for x in (h, w))
    return new_w, new_h


def _torchvision_offset(side: int, crop: int) -> int:
    """Where torchvision's `CenterCrop` (and timm's `CenterCropOrPad`) starts a crop on one
    axis: `int(round((side - crop) / 2.0))` (half to even), or, where it pads, the left padding
    `(crop - side) // 2` taken off."""
    if crop > side:
        return -((crop - side) // 2)
    return int(round((side - crop) / 2.0))


def _transformers_offset(side: int, crop: int) -> int:
    """transformers' `center_crop`: `(side - crop) // 2`, or, where it pads, the padding before
    the image, `ceil((crop - side) / 2)`, taken off."""
    if crop > side:
        return -math.ceil((crop - side) / 2)
    return (side - crop) // 2


def _squash_crop_pct(size: tuple[int, int], resized: tuple[int, int]
                     ) -> tuple[float | None, str]:
    """A crop_pct with which timm's squash mode resizes to `resized` (`floor(size / crop_pct)`
    on both axes) and then crops `size` where transformers' crop does; (None, "squash") if
    none does."""
    if any(_torchvision_offset(r, s) != _transformers_offset(r, s)
           for r, s in zip(resized, size, strict=True)):
        return None, "squash"
    candidates = {s / r for s, r in zip(size, resized, strict=True)}
    for pct in sorted(candidates):
        for _ in range(4):  # a float quotient may land a hair above the interval's top
            if all(math.floor(s / pct) == r for s, r in zip(size, resized, strict=True)):
                return pct, "squash"
            pct = math.nextafter(pct, 0.0)
    return None, "squash"


def _hf_size(value, default_to_square: bool, key: str, bad) -> dict[str, int]:
    """transformers' `get_size_dict`: a dict (one of the key sets its processors resize with
    here), a [height, width] list, or one number (square, or the shortest edge)."""
    if isinstance(value, dict):
        if set(value) not in ({"height", "width"}, {"shortest_edge"}):
            raise bad(key, '{"height": H, "width": W} or {"shortest_edge": S}')
        out = value
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        out = {"height": value[0], "width": value[1]}
    elif _is_number(value, int):
        out = ({"height": value, "width": value} if default_to_square
               else {"shortest_edge": value})
    else:
        raise bad(key, 'a size in pixels (a whole number, [height, width], {"height": H, '
                  '"width": W} or {"shortest_edge": S})')
    for name, v in out.items():
        if not (_is_number(v, int) and v >= 1):
            if isinstance(value, dict):
                raise bad(f"{key}.{name}", "a whole number of at least 1", v)
            raise bad(key, "sizes in whole pixels, each at least 1")
    return {k: int(v) for k, v in out.items()}


def _hf_channels(pc: dict, key: str, bad) -> tuple[float, ...]:
    """image_mean or image_std: one number for every channel, or three."""
    value = pc[key]
    if _is_number(value, float):
        return (float(value),) * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(
            _is_number(v, float) for v in value):
        raise bad(key, "a number or a list of 3 numbers (one per RGB channel)")
    return tuple(float(v) for v in value)


# vit_jax and big_vision checkpoints were trained on inputs in [-1, 1].
INCEPTION = Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def resize_crop(image: Image.Image, pre: Preprocessing | tuple[int, int],
                crop_pct: float | None = None, resample: str = "bilinear") -> Image.Image:
    """The geometry of a `Preprocessing` (`pre`; or, given a size, of
    `Preprocessing(size, resample, crop_pct)`): resize, then crop or pad, as `geometry` says.

    The one place this is done: prediction, rollout and the data pipeline's eval transform
    all come here, so a model is evaluated on exactly what it is shown at prediction time.
    """
    if not isinstance(pre, Preprocessing):
        pre = Preprocessing(size=tuple(pre), resample=resample, crop_pct=crop_pct)
    resized, box, fill = pre.geometry(image.size)
    if resized != image.size:  # torchvision skips a resize to the same size; PIL copies
        image = image.resize(resized, RESAMPLE[pre.resample])
    if box == (0, 0, *resized):
        return image
    left, top, right, bottom = box
    if left >= 0 and top >= 0 and right <= resized[0] and bottom <= resized[1]:
        return image.crop(box)
    colour = fill * len(image.getbands()) if len(fill) == 1 else fill
    out = Image.new(image.mode, (right - left, bottom - top),
                    colour if len(colour) > 1 else colour[0])
    out.paste(image, (-left, -top))
    return out


def normalize(image, mean, std, rescale_factor: float = RESCALE) -> np.ndarray:
    """uint8 pixels (a PIL image, or a 0..255 array of any shape ending in channels) -> float32
    `(x * rescale_factor - mean) / std`.

    At 1/255 this is float32 `x / 255`, as torchvision's `to_tensor` computes it; for every
    uint8 value it equals transformers' float64 `x * (1 / 255)` cast to float32. Another factor
    is applied as transformers does (float64 product, then float32)."""
    if rescale_factor == RESCALE:
        if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim >= 3:
            out = _normalize_by_table(image, mean, std)
            if out is not None:
                return out
        x = np.array(image, np.float32)  # a fresh array, then in place: no temporaries
        x /= 255.0
    else:
        x = (np.asarray(image, np.float64) * rescale_factor).astype(np.float32)
    x -= np.asarray(mean, np.float32)
    x /= np.asarray(std, np.float32)
    return x


@functools.lru_cache(maxsize=16)
def _table(mean: tuple, std: tuple, channels: int) -> np.ndarray | None:
    """`normalize`'s value of each uint8 level, by the same float32 operations, when one table
    serves every channel (the same mean and std in each); else None."""
    table = np.arange(256, dtype=np.float32)[:, None].repeat(channels, 1)
    table /= 255.0
    table -= np.asarray(mean, np.float32)
    table /= np.asarray(std, np.float32)
    return table[:, 0].copy() if (table == table[:, :1]).all() else None


def _normalize_by_table(image: np.ndarray, mean, std) -> np.ndarray | None:
    """`normalize` of a uint8 array at 1/255 as one lookup a pixel (the same numbers, in one
    pass over the pixels instead of three), or None where the channels differ."""
    table = _table(tuple(np.ravel(mean).tolist()), tuple(np.ravel(std).tolist()),
                   image.shape[-1])
    return None if table is None else table[image]
