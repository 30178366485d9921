"""The real-data benchmark's reading of a `vit train` command's output: where its time went."""

import json

import pytest

from benchmarks import realdata

pytestmark = pytest.mark.timeout(60)


def test_the_split_of_a_run_adds_up_from_its_stamped_lines(tmp_path):
    # A made-up run: 100 steps of batch 50 at a steady rate after a first window holding the
    # compile; validation printed a few seconds after the last step, then the command exits.
    rows = [{"step": 10, "split": "train", "images_per_s": 40.0},
            *({"step": s, "split": "train", "images_per_s": 500.0} for s in range(20, 101, 10)),
            {"step": 100, "split": "validation", "accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    lines = [[12.5, "step 10/100: accuracy 0.1 loss 2.3 lr 1e-3 40 img/s, 0% waiting"]]
    lines += [[12.5 + (s - 10) * 0.1, f"step {s}/100: accuracy 0.2 loss 2 lr 1e-3 500 img/s"]
              for s in range(20, 101, 10)]
    lines += [[24.5, "step 100: validation accuracy 0.5000 loss 1.0"], [25.0, "done: 100"]]
    split = realdata.split_of_vit_run({"lines": lines, "wall_s": 25.5}, tmp_path, 100, 50)
    assert split["step_ms"] == pytest.approx(100.0)
    assert split["steps_s"] == pytest.approx(10.0)
    assert split["startup_and_compile_s"] == pytest.approx(12.5 - 1.0)
    assert split["final_eval_s"] == pytest.approx(24.5 - 21.5)
    assert split["checkpoint_and_exit_s"] == pytest.approx(1.0)
    parts = (split["startup_and_compile_s"] + split["steps_s"] + split["final_eval_s"]
             + split["checkpoint_and_exit_s"])
    assert parts == pytest.approx(25.5, abs=0.2)


def test_a_poll_log_gives_each_metrics_line_the_first_time_it_was_seen():
    text = ("100.0 3.00 2.00 1.00 0\n120.0 4.00 2.00 1.00 2\nckpt 130 500\nckpt 125 500\n"
            "ckpt 128 600.orbax-checkpoint-tmp\n140.5 5.00 3.00 1.0 3\n")
    load, counts, saved = realdata._timeline_from_poll(text, None)
    assert load == [[100.0, 3.0], [120.0, 4.0], [140.5, 5.0]]
    assert counts == [[100.0, 0], [120.0, 2], [140.5, 3]]
    assert saved == {500: 125.0}  # the earliest listing of a finished step; unfinished ones not
