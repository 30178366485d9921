"""One list of image suffixes: predict, rollout's inputs and image-folder datasets agree."""

import numpy as np
import pytest
from PIL import Image

from vit.data import open_source
from vit.explanations.inputs import gather
from vit.images import IMAGE_SUFFIXES, list_images

pytestmark = pytest.mark.timeout(120)


def test_a_folder_with_every_suffix_is_seen_alike_by_predict_rollout_and_datasets(tmp_path):
    cls = tmp_path / "root" / "only_class"
    cls.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, suffix in enumerate(IMAGE_SUFFIXES):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)).save(
            cls / f"{i:02d}{suffix}")
    Image.new("RGB", (16, 16)).save(cls / "99_upper.PNG", "PNG")  # suffixes are matched in any case
    (cls / "notes.txt").write_text("not an image")

    by_predict = [p.name for p in list_images([cls])]
    by_rollout = [item.name.rsplit("/", 1)[-1] for item in gather([str(cls)], None, "test",
                                                                   None, None)]
    source = open_source(str(tmp_path / "root"), "train", val_fraction=0.0, strict=True)
    by_dataset = [p.name for p in source.files]

    assert len(by_predict) == len(IMAGE_SUFFIXES) + 1 and "notes.txt" not in by_predict
    assert by_predict == by_rollout == by_dataset
    for i in range(len(source)):  # and every listed format decodes
        assert source[i]["image"].shape == (16, 16, 3)
