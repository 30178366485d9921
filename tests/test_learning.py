"""Training learns: a few hundred steps on the bundled digits reach clearly above chance (one
in ten) on the 360 held-out test digits, not merely `0 <= accuracy <= 1`."""

import json

import pytest

from vit.training.metrics import read_metrics

pytestmark = pytest.mark.timeout(600)


def test_three_hundred_steps_on_digits_reach_80_percent_test_accuracy(trained_digits, tmp_path,
                                                                     capsys):
    """The run is the shared `trained_digits` (tests/conftest.py): the demo recipe made quick,
    300 steps of 2 blocks."""
    from vit.cli import main

    losses = [r["loss"] for r in read_metrics(trained_digits / "metrics.jsonl")
              if r["split"] == "train"]
    assert losses[-1] < 0.5 * losses[0], losses
    capsys.readouterr()
    assert main(["eval", "--workdir", str(trained_digits), "--split", "test", "--json",
                 "--out", str(tmp_path / "eval")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_examples"] == 360
    assert report["accuracy"] >= 0.80, report["accuracy"]  # chance is 0.10
    # Every digit is learnt, not a few classes carrying the average.
    assert min(report["per_class_accuracy"].values()) >= 0.5, report["per_class_accuracy"]
