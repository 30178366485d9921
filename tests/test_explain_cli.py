"""`vit rollout` and `vit explain-eval` end to end on a tiny orbax checkpoint."""

import json
import urllib.parse

import numpy as np
import pytest
from PIL import Image

from vit.cli import main

pytestmark = pytest.mark.timeout(600)

MANIFEST_KEYS = {"image", "label", "pred", "pred_label", "prob", "method", "class", "overlay",
                 "map"}


@pytest.fixture(scope="module")
def checkpoint(tiny_files):
    """The tiny orbax export (tests/conftest.py): 8x8 inputs, classes digit0..digit9."""
    return str(tiny_files["orbax"])


def test_rollout_writes_overlays_maps_manifest_and_gallery(checkpoint, tmp_path, capsys):
    pics = tmp_path / "pics"
    (pics / "sub").mkdir(parents=True)
    Image.new("RGB", (200, 140), (20, 200, 40)).save(pics / "big.png")
    Image.new("L", (8, 8), 90).save(pics / "sub" / "big.png")  # same stem: must not collide
    (pics / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    rc = main(["rollout", str(pics), str(tmp_path / "missing.jpg"), "--checkpoint", checkpoint,
               "--data", "digits", "--limit", "4", "--method", "relevancy", "--out", str(out),
               "--html", "--class", "digit3"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "broken.png" in captured.err and "missing.jpg" in captured.err
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 2 + 4  # two readable files, four digits (--limit is for --data)
    for row in rows:
        assert set(row) == MANIFEST_KEYS
        assert row["class"] == 3 and row["method"] == "relevancy"
        assert row["pred_label"] == f"digit{row['pred']}" and 0 < row["prob"] <= 1
        grid = np.load(out / row["map"], allow_pickle=False)
        assert grid.shape == (2, 2)
    overlays = {r["image"]: Image.open(out / r["overlay"]).size for r in rows}
    assert overlays[str(pics / "big.png")] == (200, 140)
    assert overlays[str(pics / "sub" / "big.png")] == (128, 128)  # tiny: enlarged
    assert len({r["overlay"] for r in rows}) == len(rows)
    page = (out / "index.html").read_text()
    for link in {part.split('"')[0] for part in page.split('src="')[1:]}:
        assert (out / urllib.parse.unquote(link)).is_file()


def test_rollout_on_dataset_images_records_true_labels(checkpoint, tmp_path):
    out = tmp_path / "out"
    assert main(["rollout", "--checkpoint", checkpoint, "--data", "digits", "--limit", "3",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    from vit.data import open_source

    truth = open_source("digits", "test")
    assert [r["label"] for r in rows] == [truth[i]["label"] for i in range(3)]
    assert [r["image"] for r in rows] == ["digits:test:0", "digits:test:1", "digits:test:2"]
    assert all(r["class"] == r["pred"] for r in rows)
    assert not (out / "index.html").exists()


def test_rollout_reports_user_mistakes_in_one_line(checkpoint, tmp_path, capsys):
    assert main(["rollout", "--checkpoint", checkpoint, "--out", str(tmp_path)]) == 2
    assert main(["rollout", "--checkpoint", checkpoint, "--data", "digits", "--class", "cat",
                 "--out", str(tmp_path)]) == 2
    assert main(["rollout", str(tmp_path / "nope.png"), "--checkpoint", checkpoint,
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 3


@pytest.mark.slow
def test_explain_eval_prints_the_json_report(checkpoint, capsys):
    rc = main(["explain-eval", "--checkpoint", checkpoint, "--data", "digits", "--limit", "12",
               "--method", "rollout", "attention", "--steps", "4", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metric"] == "deletion"
    assert set(report["results"]) == {"rollout", "attention", "random"}
    for r in report["results"].values():
        lo, hi = r["ci95"]
        assert 0 <= lo <= r["auc"] <= hi <= 1
