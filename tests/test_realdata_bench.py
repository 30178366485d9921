"""The real-data benchmark's reading of a `vit train` command's timings: where its time went."""

import json

import pytest

from benchmarks import realdata

pytestmark = pytest.mark.timeout(60)


def test_the_split_of_a_run_adds_up_from_the_timings_it_wrote(tmp_path):
    # A made-up run of 100 steps: its metrics.jsonl's timing records (vit.training.timings),
    # and the command's wall time, which holds the process's start-up before the run.
    timing = {"split": "timing", "at_s": 0.0}
    rows = [{**timing, "step": 1, "startup_s": 4.5, "process_start_s": 2.0},
            {**timing, "step": 1, "compile_s": 6.0},
            *({**timing, "step": s, "step_s": [0.1] * 10} for s in range(10, 101, 10)),
            {"step": 100, "split": "train", "images_per_s": 500.0},
            {**timing, "step": 100, "evaluation_s": 3.0},
            {**timing, "step": 100, "checkpoint_s": 0.3},
            {**timing, "step": 100, "exit_s": 0.5, "at_s": 25.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    split = realdata.split_of_vit_run(tmp_path, 27.5)
    assert split["step_ms"] == pytest.approx(100.0)
    assert split["steps_s"] == pytest.approx(10.0)
    assert split["startup_and_compile_s"] == pytest.approx(2.0 + 4.5 + 6.0)
    assert split["final_eval_s"] == pytest.approx(3.0)
    # The saves, the exit, and the time after the run returned (wall - start-up - end).
    assert split["checkpoint_and_exit_s"] == pytest.approx(0.3 + 0.5 + 0.5)
    parts = (split["startup_and_compile_s"] + split["steps_s"] + split["final_eval_s"]
             + split["checkpoint_and_exit_s"] + split["other_s"])
    assert parts == pytest.approx(27.5, abs=0.2) and split["other_s"] == pytest.approx(0.7)


def test_a_poll_log_gives_each_metrics_line_the_first_time_it_was_seen():
    text = ("100.0 3.00 2.00 1.00 0\n120.0 4.00 2.00 1.00 2\nckpt 130 500\nckpt 125 500\n"
            "ckpt 128 600.orbax-checkpoint-tmp\n140.5 5.00 3.00 1.0 3\n")
    load, counts, saved = realdata._timeline_from_poll(text, None)
    assert load == [[100.0, 3.0], [120.0, 4.0], [140.5, 5.0]]
    assert counts == [[100.0, 0], [120.0, 2], [140.5, 3]]
    assert saved == {500: 125.0}  # the earliest listing of a finished step; unfinished ones not
