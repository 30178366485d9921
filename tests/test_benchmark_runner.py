"""benchmarks/common.py, what every benchmark mode stands on: a side in its own process hands
back the dict its function returned (through a file, whatever the side prints), a failing
side raises with its stderr, a kept-alive side answers run after run in one process, a command
runs from the repository and is timed whole, the timer counts the calls it is asked to, and a
record carries its date, command and host, with every path relative to the repository."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside vit, not inside it

from benchmarks import common  # noqa: E402

SIDES = textwrap.dedent("""
    import os
    import sys

    def echo(a, b):
        print('{"not": "the result"}')  # a side's output is not its result
        return {"sum": a + b, "pid": os.getpid(), "env": os.environ.get("BENCH_TEST")}

    def broken():
        print("the side's own words", file=sys.stderr)
        raise RuntimeError("no")

    def counter(start):
        calls = [start]

        def run(step):
            calls[0] += step
            return {"total": calls[0], "pid": os.getpid()}

        return run
""")


@pytest.fixture
def sides(tmp_path):
    (tmp_path / "bench_test_sides.py").write_text(SIDES)
    return str(tmp_path)


def test_a_side_returns_its_functions_dict_from_another_process(sides):
    out = common.run_side("bench_test_sides:echo", {"a": 2, "b": 3}, pythonpath=sides,
                          env={"BENCH_TEST": "given"})
    assert out["sum"] == 5 and out["env"] == "given"
    assert out["pid"] != os.getpid()


def test_a_failing_side_raises_with_its_stderr(sides):
    with pytest.raises(common.SideFailed, match="the side's own words"):
        common.run_side("bench_test_sides:broken", pythonpath=sides)


def test_a_kept_side_answers_each_run_in_one_process(sides):
    side = common.Side("bench_test_sides:counter", {"start": 10}, pythonpath=sides)
    try:
        first, second = side(step=1), side(step=5)
    finally:
        side.close()
    assert (first["total"], second["total"]) == (11, 16)
    assert first["pid"] == second["pid"] != os.getpid()


def test_time_call_counts_the_calls_it_times():
    calls = []
    timing = common.time_call(lambda: calls.append(1), warmup=2, repeats=3, number=4)
    assert len(calls) == 2 + 3 * 4
    assert len(timing["times_s"]) == 3
    assert timing["min_s"] <= timing["median_s"] <= max(timing["times_s"])


def test_interleave_rotates_the_order_each_round():
    order = []
    common.interleave({"a": lambda: order.append("a"), "b": lambda: order.append("b"),
                       "c": lambda: order.append("c")}, rounds=3, warmup=0)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_record_carries_date_command_and_host(tmp_path):
    path = common.write_record("toy", {"figure": 1.5}, argv=["--rounds", "2"], mode="demo",
                               out=tmp_path / "toy.json")
    record = json.loads(path.read_text())
    assert record["benchmark"] == "toy" and record["figure"] == 1.5
    assert record["command"] == "python -m benchmarks demo --rounds 2"
    assert record["date_utc"].endswith("Z") and record["date_utc"][:2] == "20"
    assert record["machine"]["cpus"] == os.cpu_count()
    assert record["versions"]["python"] and "jax" in record["versions"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_command_runs_from_the_repository_and_is_timed_whole():
    done = common.run_cli([sys.executable, "-c", "import os, json; print('progress'); "
                           "print(json.dumps({'cwd': os.getcwd()}))"], capture=True)
    assert common.last_json(done["stdout"]) == {"cwd": str(common.ROOT)}
    assert done["returncode"] == 0 and done["wall_s"] >= 0
    with pytest.raises(common.SideFailed, match="the command's own words"):
        common.run_cli([sys.executable, "-c", "import sys; print(\"the command's own words\"); "
                        "sys.exit(3)"], capture=True)
    kept = common.run_cli([sys.executable, "-c", "raise SystemExit(4)"], check=False)
    assert kept["returncode"] == 4


def test_a_record_names_paths_inside_the_repository_only(tmp_path, monkeypatch):
    inside = common.ROOT / "runs" / "demo"
    assert common.relative({"workdir": str(inside), "run": [f"vit eval --workdir {inside}"],
                            "rate": "3 img/s, 1/5 of it", "pattern": "(a|b)/.*"}) == {
        "workdir": "runs/demo", "run": ["vit eval --workdir runs/demo"],
        "rate": "3 img/s, 1/5 of it", "pattern": "(a|b)/.*"}
    assert common.relative(f"{Path.home()}/data/x") == "~/data/x"
    records = tmp_path / "benchmarks" / "records"
    monkeypatch.setattr(common, "RECORDS", records)
    with pytest.raises(common.PathOutside, match="/scratch/run1"):
        common.write_record("toy", {"workdir": "/scratch/run1"}, argv=[], mode="demo",
                            out=records / "toy.json")
    assert not (records / "toy.json").exists()
    # A copy written elsewhere keeps what it was given; where it went is no part of the
    # command that makes it.
    scratch = tmp_path / "toy.json"
    path = common.write_record("toy", {"workdir": "/scratch/run1"}, mode="demo", out=scratch,
                               argv=["--out", str(scratch), "--x=1"])
    assert json.loads(path.read_text())["command"] == "python -m benchmarks demo --x=1"
    assert json.loads(path.read_text())["workdir"] == "/scratch/run1"


def test_the_runner_refuses_a_path_outside_the_repository_before_it_runs(capsys):
    from benchmarks.__main__ import main

    assert main(["demo", "--workdir", "/scratch/run1"]) == 2
    assert "/scratch/run1 is outside the repository" in capsys.readouterr().err
