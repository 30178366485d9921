"""`vit.preprocess` against the libraries it copies, to the pixel: timm's eval transform
(`create_transform(**resolve_data_config(pretrained_cfg=cfg), is_training=False)`) and
transformers' PIL image processors (`XxxImageProcessorPil(**preprocessor_config)`), on real
photos of many shapes (scikit-image's and matplotlib's sample photos, odd crops of them, one
smaller than every target, grayscale and transparent ones).

Each comparison is made twice: the uint8 geometry (resize, crop, pad) must be equal, every
pixel; the float input after rescaling and normalising must agree within 1e-6 (it is in fact
equal: both libraries compute `x / 255` or `x * (1/255)` in ways that round to the same float32
for every uint8 value, then `(x - mean) / std` in float32, as we do). Each also checks that
it could fail: the photos are not at the target size, the outputs are not flat, and the tests
below show that the rounding rules we copy (timm's `floor(size / crop_pct)`, torchvision's and
transformers' centre-crop offsets) change pixels on these photos.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np
import pytest
from PIL import Image
from timm_reference import import_timm

from vit.errors import ConfigError
from vit.images import to_rgb
from vit.preprocess import HF_PROCESSORS, Preprocessing, resize_crop

timm = import_timm()  # first: it fixes which transformers backend this process sees
if timm is None:
    pytest.skip("timm (with torch) is not importable: the compare extra and "
                "scripts/setup_env.sh install it", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(the compare extra)")
skimage_data = pytest.importorskip("skimage.data", reason="scikit-image (its sample photos) "
                                   "is not installed (the compare extra)")
from timm.data import create_transform, resolve_data_config  # noqa: E402

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


# -- the photos -------------------------------------------------------------------------------
def _alpha(image: np.ndarray) -> np.ndarray:
    """The photo with a real alpha channel: a ramp from clear (left) to opaque (right) and a
    clear disc, so compositing onto white is seen."""
    h, w = image.shape[:2]
    ramp = np.linspace(0, 255, w)[None, :].repeat(h, 0)
    yy, xx = np.mgrid[:h, :w]
    ramp[(yy - h / 2) ** 2 + (xx - w / 3) ** 2 < (min(h, w) / 5) ** 2] = 0
    return np.dstack([image, ramp.astype(np.uint8)])


@functools.cache
def photos() -> dict[str, Image.Image]:
    import matplotlib.cbook

    with Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg")) as im:
        hopper = np.asarray(im.convert("RGB"))  # 512x600, a portrait
    chelsea, coffee = skimage_data.chelsea(), skimage_data.coffee()
    out = {
        "chelsea": chelsea,                          # 451x300
        "coffee": coffee,                            # 600x400
        "astronaut": skimage_data.astronaut(),       # 512x512
        "rocket": skimage_data.rocket(),             # 640x427
        "grace_hopper": hopper,                      # 512x600
        "chelsea_301x173": chelsea[40:213, 70:371],  # odd landscape
        "hopper_97x500": hopper[50:550, 200:297],    # a sliver
        "coffee_233x311": coffee[30:341, 150:383],   # odd portrait
        "astronaut_150x120": skimage_data.astronaut()[60:180, 180:330],  # under every target
        "camera_gray": skimage_data.camera(),        # 512x512, mode L
        "page_gray": skimage_data.page(),            # 384x191, mode L
        "chelsea_rgba": _alpha(chelsea),             # 451x300, RGBA
        "rocket_rgba_203x157": _alpha(skimage_data.rocket()[100:257, 300:503]),
    }
    return {name: Image.fromarray(a) for name, a in out.items()}


# What the default run compares on (every shape, mode and size class, the smaller files); the
# slow sweeps take every photo.
QUICK = ("chelsea", "grace_hopper", "chelsea_301x173", "hopper_97x500", "coffee_233x311",
         "astronaut_150x120", "page_gray", "rocket_rgba_203x157")


def some_photos(names=QUICK) -> dict[str, Image.Image]:
    return {n: im for n, im in photos().items() if names is None or n in names}


def test_the_photos_are_what_the_tests_need():
    images = photos()
    assert {im.mode for im in images.values()} == {"RGB", "L", "RGBA"}
    sizes = {im.size for im in images.values()}
    assert any(w > h for w, h in sizes) and any(w < h for w, h in sizes)
    assert any(max(w, h) < 224 for w, h in sizes)
    rgba = images["chelsea_rgba"]  # compositing onto white is not throwing alpha away
    assert np.abs(np.asarray(to_rgb(rgba)).astype(int) - np.asarray(rgba.convert("RGB"))).max(
        ) > 100


def _check(ours8: np.ndarray, ref8: np.ndarray, ours: np.ndarray, ref: np.ndarray,
           image: Image.Image, what: str) -> float:
    """uint8 geometry equal, float input within 1e-6; returns the float difference."""
    assert ref8.dtype == np.uint8 and ours8.dtype == np.uint8, what
    assert ours8.shape == ref8.shape and ours.shape == ref.shape == ours8.shape, what
    assert (ours8.shape[1], ours8.shape[0]) != image.size, f"{what}: no resize to check"
    assert ours8.std() > 5, f"{what}: a flat image checks nothing"
    mismatch = np.argwhere(ours8 != ref8)
    assert not len(mismatch), (f"{what}: {len(mismatch)} uint8 values differ, first at "
                               f"{mismatch[0].tolist()}")
    diff = float(np.abs(ours - ref).max())
    assert diff <= 1e-6, f"{what}: float inputs differ by {diff}"
    return diff


# -- timm -------------------------------------------------------------------------------------
def timm_transforms(cfg: dict):
    data = resolve_data_config(pretrained_cfg=cfg)
    return (create_transform(**data, is_training=False, normalize=False),
            create_transform(**data, is_training=False))


def timm_input(transform, image: Image.Image) -> np.ndarray:
    """timm's output as NHWC numpy. timm's transform takes RGB only: grayscale and RGBA photos
    become RGB as ours do (`to_rgb`; timm's own loaders would drop transparency instead)."""
    return transform(to_rgb(image)).numpy().transpose(1, 2, 0)


def compare_timm(cfg: dict, names=QUICK) -> float:
    to_uint8, to_float = timm_transforms(cfg)
    pre = Preprocessing.from_timm(cfg)
    worst = 0.0
    for name, image in some_photos(names).items():
        worst = max(worst, _check(np.asarray(resize_crop(to_rgb(image), pre)),
                                  timm_input(to_uint8, image), pre(image),
                                  timm_input(to_float, image), image, f"{cfg} {name}"))
    return worst


def _cfg(size, crop_pct, crop_mode, interpolation, **extra):
    size = (size, size) if isinstance(size, int) else size
    return {"input_size": (3, *size), "crop_pct": crop_pct, "crop_mode": crop_mode,
            "interpolation": interpolation, **IMAGENET, **extra}


MODES = ("center", "squash", "border")
PCTS = (0.875, 0.9, 0.95, 1.0)
TIMM_CASES = [_cfg(224, pct, mode, ("bicubic", "bilinear")[(i + j) % 2])
              for i, pct in enumerate(PCTS) for j, mode in enumerate(MODES)] + [
    _cfg(256, 0.9, "center", "bilinear"), _cfg(256, 0.875, "border", "bicubic"),
    _cfg(384, 1.0, "center", "bicubic"), _cfg(384, 0.95, "squash", "bilinear"),
    _cfg((224, 320), 0.9, "center", "bicubic"), _cfg((320, 224), 0.875, "border", "bilinear"),
    _cfg((256, 192), 0.95, "squash", "bicubic"),
    _cfg(224, 0.9, "center", "bicubic", mean=(0.5,) * 3, std=(0.5,) * 3),
    _cfg(224, 0.9, "border", "bicubic", mean=(0.5,) * 3, std=(0.5,) * 3),  # fill 128
]


@pytest.mark.parametrize("cfg", TIMM_CASES, ids=lambda c: "-".join(
    str(v) for v in (*c["input_size"][1:], c["crop_pct"], c["crop_mode"], c["interpolation"])))
def test_timm_eval_transform(cfg):
    compare_timm(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("size", [224, 256, 384, (224, 320), (320, 224), (200, 300)], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_timm_eval_transform_sweep(size, mode):
    interpolations = ("bicubic", "bilinear", "lanczos", "nearest")
    for i, pct in enumerate((0.8, *PCTS, 1.1)):
        compare_timm(_cfg(size, pct, mode, interpolations[i % 4]), names=None)


@pytest.mark.parametrize("cfg", [
    {"num_classes": 1000},  # nothing about images: every default
    {"input_size": None, "interpolation": None, "mean": None, "std": None, "crop_pct": None,
     "crop_mode": None},
    {"input_size": [3, 256, 256], "interpolation": "", "crop_pct": 0, "mean": []},
])
def test_timm_defaults_as_resolve_data_config_resolves_them(cfg):
    pre = Preprocessing.from_timm(cfg)
    assert (pre.crop_pct, pre.crop_mode, pre.resample, pre.mean, pre.std) == (
        0.875, "center", "bicubic", IMAGENET["mean"], IMAGENET["std"])
    compare_timm(cfg, names={"chelsea", "grace_hopper", "page_gray"})
    # input_size: the model's size stands in for an absent one, as our readers want
    assert Preprocessing.from_timm({"crop_pct": 0.9}, image_size=(96, 128)).size == (96, 128)


def test_squash_at_crop_pct_1_is_a_plain_resize():
    pre = Preprocessing.from_timm(_cfg(224, 1.0, "squash", "bicubic"))
    assert pre.crop_pct is None and pre == Preprocessing(resample="bicubic", **IMAGENET)


def _rounded_resize_crop(image, size, crop_pct, resample):
    """A near miss of timm's rule: the scale rounded per side (249 for 224 / 0.9, where timm
    floors to 248), the offset floored."""
    h, w = size
    scale = min(h, w) / crop_pct / min(image.size[1], image.size[0])
    rw, rh = max(w, round(image.size[0] * scale)), max(h, round(image.size[1] * scale))
    image = image.resize((rw, rh), Image.BICUBIC if resample == "bicubic" else Image.BILINEAR)
    left, top = (rw - w) // 2, (rh - h) // 2
    return image.crop((left, top, left + w, top + h))


def test_the_comparisons_see_one_pixel_of_rounding():
    """What the timm tests would catch: the scale rounded where timm floors it, and
    transformers' offset rule in place of torchvision's."""
    cfg = _cfg(224, 0.9, "center", "bicubic")
    to_uint8, _ = timm_transforms(cfg)
    rounded = [np.array_equal(np.asarray(_rounded_resize_crop(to_rgb(im), (224, 224), 0.9,
                                                              "bicubic")),
                              timm_input(to_uint8, im)) for im in some_photos().values()]
    assert not any(rounded)
    # Same resize (shorter side to 256 = floor(224 / 0.875)), the crop offsets differ only by
    # rounding: floor (transformers) against half-to-even (torchvision). Some photos tell.
    to_uint8, _ = timm_transforms(_cfg(224, 0.875, "center", "bicubic"))
    hf_rule = Preprocessing(resample="bicubic", shortest_edge=256)
    same = [np.array_equal(np.asarray(resize_crop(to_rgb(im), hf_rule)),
                           timm_input(to_uint8, im)) for im in some_photos().values()]
    assert any(same) and not all(same)


# -- transformers -----------------------------------------------------------------------------
def hf_class(model_type: str):
    name = HF_PROCESSORS[model_type][0]
    # transformers 5 names its PIL processors ...Pil; in 4 the plain name is the PIL one.
    return getattr(transformers, name + "Pil", None) or getattr(transformers, name)


def hf_input(processor, image: Image.Image, **kw) -> np.ndarray:
    # With do_convert_rgb the processor converts grayscale and RGBA itself (onto white, as
    # to_rgb); without it, it takes RGB only, and gets ours.
    feed = image if getattr(processor, "do_convert_rgb", None) else to_rgb(image)
    return processor(feed, return_tensors="np", **kw)["pixel_values"][0].transpose(1, 2, 0)


def compare_hf(processor_dict: dict, model_type: str, processor=None, pre=None,
               names=QUICK) -> float:
    pre = pre or Preprocessing.from_hf(processor_dict, model_type, "preprocessor_config.json")
    processor = processor or hf_class(model_type)(**processor_dict)
    worst = 0.0
    for name, image in some_photos(names).items():
        ref8 = hf_input(processor, image, do_rescale=False, do_normalize=False)
        worst = max(worst, _check(np.asarray(resize_crop(to_rgb(image), pre)), ref8,
                                  pre(image), hf_input(processor, image), image,
                                  f"{model_type} {processor_dict} {name}"))
    return worst


@pytest.mark.parametrize("model_type", ["vit", "deit", "dinov2", "clip", "siglip", "beit",
                                        "data2vec-vision"])
def test_hf_processor_defaults(model_type):
    compare_hf({}, model_type)


HF_CASES = [
    ("clip", {"size": {"shortest_edge": 256}, "crop_size": {"height": 224, "width": 224}}),
    ("dinov2", {"size": {"shortest_edge": 224}, "crop_size": {"height": 200, "width": 240},
                "resample": 2}),
    ("vit", {"size": {"height": 384, "width": 384}, "resample": 3, "image_mean": [0.485, 0.456,
             0.406], "image_std": [0.229, 0.224, 0.225]}),
    ("vit", {"size": 300, "do_convert_rgb": True}),  # a number: square (default_to_square)
    ("deit", {"size": {"height": 250, "width": 230}, "crop_size": 224}),
    ("beit", {"do_center_crop": True, "size": 256, "crop_size": {"height": 224, "width": 224}}),
    ("siglip", {"size": {"height": 256, "width": 256}, "rescale_factor": 1 / 127.5,
                "image_mean": 1.0, "image_std": 1.0}),  # another factor: float64 product
    ("siglip", {"do_rescale": False, "do_normalize": False}),
    # a crop larger than the resize: transformers pads, the extra pixel before the image
    ("clip", {"size": {"shortest_edge": 200}, "crop_size": {"height": 224, "width": 231},
              "resample": 1}),
    ("deit", {"size": {"height": 201, "width": 240}, "crop_size": {"height": 224, "width": 237},
              "do_convert_rgb": True}),
]


@pytest.mark.parametrize("model_type,processor", HF_CASES)
def test_hf_processor_configs(model_type, processor):
    compare_hf(processor, model_type)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(HF_PROCESSORS))
def test_hf_processor_defaults_on_every_photo(model_type):
    compare_hf({}, model_type, names=None)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["clip", "vit"])  # with and without do_convert_rgb
def test_hf_processor_sweep(model_type):
    for shortest, crop in ((224, (224, 224)), (256, (224, 224)), (300, (288, 320)),
                           (200, (224, 231)), (333, (331, 317))):
        for resample in (1, 2, 3):
            compare_hf({"size": {"shortest_edge": shortest}, "do_center_crop": True,
                        "crop_size": {"height": crop[0], "width": crop[1]},
                        "resample": resample}, model_type, names=None)
            compare_hf({"size": {"height": shortest, "width": shortest + 7},
                        "do_center_crop": True, "crop_size": list(crop),
                        "resample": resample}, model_type, names=None)


def test_hf_shortest_edge_without_a_crop_is_refused():
    with pytest.raises(ConfigError, match=r"^cfg\.json: size .*centre crop"):
        Preprocessing.from_hf({"size": {"shortest_edge": 224}, "do_center_crop": False},
                              "clip", "cfg.json")
    with pytest.raises(ConfigError, match=r"^cfg\.json: size"):
        Preprocessing.from_hf({"size": 224}, "siglip", "cfg.json")  # an int is shortest_edge


@pytest.mark.parametrize("processor,field", [
    ({"resample": 7}, "resample"), ({"resample": "bicubic"}, "resample"),
    ({"size": {"longest_edge": 224}}, "size"), ({"size": "224"}, "size"),
    ({"do_center_crop": True, "crop_size": {"shortest_edge": 8}}, "crop_size"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"), ({"image_std": "x"}, "image_std"),
    ({"rescale_factor": 0}, "rescale_factor"), ({"do_pad": True}, "do_pad"),
    ({"do_resize": False}, "do_resize"), ({"do_normalize": "yes"}, "do_normalize"),
    ({"image_std": [0.5, 0, 0.5]}, "std"),
])
def test_hf_values_it_cannot_take_are_refused_by_name(processor, field):
    with pytest.raises(ConfigError, match=rf"^p\.json: .*{field}") as err:
        Preprocessing.from_hf(processor, "vit", "p.json")
    assert "\n" not in str(err.value)


def test_hf_unknown_model_type():
    with pytest.raises(ConfigError, match="model_type 'swin'"):
        Preprocessing.from_hf({}, "swin", "p.json")
    with pytest.raises(ConfigError, match="model_type 'swin'"):
        Preprocessing().to_hf_processor("swin")


def test_hf_nulls_take_the_class_defaults():
    nulls = {k: None for k in ("size", "crop_size", "resample", "do_center_crop", "image_mean",
                               "image_std", "rescale_factor", "do_convert_rgb")}
    for model_type in HF_PROCESSORS:
        assert (Preprocessing.from_hf(nulls, model_type, "p.json")
                == Preprocessing.from_hf({}, model_type, "p.json"))


# -- writing: what the libraries read back ----------------------------------------------------
WRITABLE = {
    "plain": Preprocessing(size=(224, 224), resample="bicubic"),
    "plain_nonsquare": Preprocessing(size=(192, 256), resample="bilinear", **IMAGENET),
    "hf_resize_then_crop": Preprocessing(size=(224, 224), resample="bicubic",
                                         resize_to=(256, 256)),
    "timm_squash": Preprocessing(size=(224, 224), resample="bicubic", crop_pct=0.875,
                                 crop_mode="squash", **IMAGENET),
}


@pytest.mark.parametrize("name", list(WRITABLE))
def test_timm_pretrained_cfg_prepares_as_we_do(name):
    pre = WRITABLE[name]
    cfg = pre.to_timm_pretrained_cfg()
    assert set(cfg) == {"input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode"}
    json.dumps(cfg)
    to_uint8, to_float = timm_transforms(cfg)
    for image_name, image in some_photos().items():
        _check(np.asarray(resize_crop(to_rgb(image), pre)), timm_input(to_uint8, image),
               pre(image), timm_input(to_float, image), image, f"{name} {image_name}")


@pytest.mark.parametrize("pre,words", [
    (Preprocessing(shortest_edge=256, size=(224, 224)), "timm has no equal"),
    (Preprocessing(rescale_factor=1 / 127.5), "rescale_factor"),
    (Preprocessing(resize_to=(255, 255)), "squash"),  # offset 15.5: torchvision takes 16
])
def test_timm_cannot_say_it(pre, words):
    with pytest.raises(ConfigError, match=words):
        pre.to_timm_pretrained_cfg()


HF_WRITABLE = {
    **WRITABLE,
    "hf_shortest_edge": Preprocessing(size=(224, 224), resample="bicubic", shortest_edge=256,
                                      mean=(0.48145466, 0.4578275, 0.40821073),
                                      std=(0.26862954, 0.26130258, 0.27577711)),
    "rescaled": Preprocessing(size=(160, 160), rescale_factor=1 / 127.5, mean=(1.0,) * 3,
                              std=(1.0,) * 3),
}


@pytest.mark.parametrize("name", list(HF_WRITABLE))
def test_hf_processor_file_prepares_as_we_do(name, tmp_path):
    pre = HF_WRITABLE[name]
    model_type = "clip" if pre.shortest_edge else "vit"
    written = pre.to_hf_processor(model_type)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(written))
    processor = transformers.AutoImageProcessor.from_pretrained(str(tmp_path))
    if getattr(processor, "backend", "pil") != "pil":  # torchvision importable: ask for PIL
        processor = transformers.AutoImageProcessor.from_pretrained(str(tmp_path),
                                                                    backend="pil")
    assert type(processor).__name__.startswith(written["image_processor_type"])
    back = Preprocessing.from_hf(written, model_type, "p.json")
    assert back == pre or pre.crop_pct is not None  # timm's squash reads back as resize_to
    compare_hf(written, model_type, processor, pre)


@pytest.mark.parametrize("pre", [
    Preprocessing(crop_pct=0.875),  # centre: the long side's offset depends on the image
    Preprocessing(crop_pct=0.875, crop_mode="border"),  # fits the longer side, pads
    Preprocessing(crop_pct=0.985, crop_mode="squash"),  # 227 -> 224: offset 2 against 1
])
def test_hf_cannot_say_timms_crops(pre):
    with pytest.raises(ConfigError, match="transformers' processors have no equal"):
        pre.to_hf_processor("vit")


# -- our own checkpoints ----------------------------------------------------------------------
def test_old_dicts_keep_their_meaning():
    """A dict saved before crop_mode and the transformers rules existed: crop_pct is timm's
    centre crop (now with timm's own arithmetic), pixels / 255."""
    old = {"size": [224, 224], "resample": "bicubic", "crop_pct": 0.9, "mean": [0.5] * 3,
           "std": [0.5] * 3}
    pre = Preprocessing.from_dict(old)
    assert pre == Preprocessing(size=(224, 224), resample="bicubic", crop_pct=0.9,
                                crop_mode="center", rescale_factor=1 / 255)
    assert Preprocessing.from_dict({**old, "crop_pct": None}).describe_geometry() == (
        "resize to 224x224")
    to_uint8, _ = timm_transforms(_cfg(224, 0.9, "center", "bicubic"))
    image = photos()["chelsea"]
    np.testing.assert_array_equal(np.asarray(resize_crop(image, pre)), timm_input(to_uint8, image))


@pytest.mark.parametrize("pre", [*HF_WRITABLE.values(), Preprocessing(
    crop_pct=0.95, crop_mode="border")])
def test_dicts_round_trip_through_json(pre):
    assert Preprocessing.from_dict(json.loads(json.dumps(pre.to_dict()))) == pre


@pytest.mark.parametrize("kw,field", [
    ({"crop_mode": "diagonal"}, "crop_mode"), ({"crop_pct": 0.9, "shortest_edge": 256},
                                               "crop_pct and shortest_edge"),
    ({"resize_to": (256,)}, "resize_to"), ({"shortest_edge": 0}, "shortest_edge"),
    ({"rescale_factor": -1.0}, "rescale_factor"),
    ({"crop_pct": math.inf}, "crop_pct"),
])
def test_values_it_cannot_honour(kw, field):
    with pytest.raises(ConfigError, match=field) as err:
        Preprocessing(**kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cfg,key", [
    ({"interpolation": "random"}, "interpolation"), ({"interpolation": 3}, "interpolation"),
    ({"crop_mode": "diagonal"}, "crop_mode"), ({"crop_pct": "0.9"}, "crop_pct"),
    ({"input_size": [224, 224, 3, 1]}, "input_size"), ({"input_size": [1, 224, 224]},
                                                      "input_size"),
    ({"mean": ["a", "b", "c"]}, "mean"), ({"std": [0.5, 0.5]}, "std"),
])
def test_timm_values_it_cannot_take(cfg, key):
    with pytest.raises(ConfigError, match=rf"pretrained_cfg.*{key}"):
        Preprocessing.from_timm(cfg)


def test_the_crop_mode_without_a_crop_is_a_resize():
    # `dataclasses.replace(pre, crop_pct=None)` (vit convert --lossy) gives a plain resize
    pre = dataclasses.replace(Preprocessing(crop_pct=0.9, crop_mode="border"), crop_pct=None)
    assert pre == Preprocessing()


def test_with_size_keeps_the_ratios():
    assert Preprocessing(crop_pct=0.9).with_size(384).crop_pct == 0.9
    pre = Preprocessing(shortest_edge=256).with_size(448)
    assert (pre.size, pre.shortest_edge) == ((448, 448), 512)
    pre = Preprocessing(resize_to=(256, 256)).with_size((112, 112))
    assert (pre.size, pre.resize_to) == ((112, 112), (128, 128))


def test_seen_region_is_the_geometry_mapped_back():
    pre = Preprocessing(size=(224, 224), crop_pct=0.875)  # 451x300 -> 384x256, crop 224
    left, top, right, bottom = pre.seen_region((451, 300))
    assert (left, top) == pytest.approx((80 * 451 / 384, 16 * 300 / 256))
    assert (right - left, bottom - top) == pytest.approx((224 * 451 / 384, 224 * 300 / 256))
    border = Preprocessing(size=(224, 224), crop_pct=1.0, crop_mode="border")
    left, top, right, bottom = border.seen_region((451, 300))  # pads above and below
    assert left == 0 and right == pytest.approx(451) and top < 0 and bottom > 300
