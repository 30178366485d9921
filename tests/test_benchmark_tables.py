"""docs/benchmarks.md's tables and the README's demo result are what
scripts/benchmark_tables.py makes from benchmarks/*.json: a record written without regenerating
the tables, a hand-edited figure, or a record without a table fails here."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
DOC = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("benchmark_tables",
                                                  ROOT / "scripts" / "benchmark_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(name: str) -> dict:
    return json.loads((BENCHMARKS / f"{name}.json").read_text())


def test_the_docs_match_the_records(tables):
    assert tables.stale(ROOT) == [], "run python scripts/benchmark_tables.py"


def test_the_check_command_passes():
    done = subprocess.run([sys.executable, "scripts/benchmark_tables.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_record_has_one_table_that_names_it(tables):
    records = {p.stem for p in BENCHMARKS.glob("*.json")}
    shown = {}
    for doc in tables.DOCS:
        for name, body in tables.blocks((ROOT / doc).read_text()).items():
            assert name not in shown, f"{name} has a table in {shown.get(name)} and {doc}"
            shown[name] = doc
            assert f"`benchmarks/{name}.json`" in body, f"{doc}: the {name} table names no record"
    assert set(shown) == records, "every record gets one table, and every table a record"


def test_a_stale_figure_is_caught(tables, tmp_path):
    for doc in tables.DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    shutil.copytree(BENCHMARKS, tmp_path / "benchmarks")
    assert tables.stale(tmp_path) == []

    # A figure edited by hand in a table.
    doc = tmp_path / "docs" / "benchmarks.md"
    text = doc.read_text()
    steps = f"{record('bench_scaling')['runs'][0]['steps_per_s']:.2f}"
    doc.write_text(text.replace(f"| 1 | 1 x 1 | {steps} |", "| 1 | 1 x 1 | 9.99 |"))
    assert tables.stale(tmp_path) == ["docs/benchmarks.md"]
    doc.write_text(text)

    # A new record, tables not regenerated.
    demo = record("demo")
    demo["test_accuracy"] = 0.5
    (tmp_path / "benchmarks" / "demo.json").write_text(json.dumps(demo))
    assert tables.stale(tmp_path) == ["README.md"]


def test_figures_are_the_records(tables):
    """Cells read from the docs by pattern equal the records' own values."""
    readme, doc = (ROOT / "README.md").read_text(), DOC.read_text()

    demo = record("demo")
    right = round(demo["test_accuracy"] * demo["num_test_examples"])
    assert f"{100 * demo['test_accuracy']:.1f}% test accuracy" in readme
    assert f"({right} of {demo['num_test_examples']} held-out digits)" in readme

    inference = record("bench_inference")
    assert (f"| vit, float32 | {inference['img_s_median']['ours_float32']:.2f} | "
            f"{inference['ratio_to_transformers_median']['ours_float32']:.2f} |") in doc

    for run in record("bench_scaling")["runs"]:
        mesh = run["mesh"]
        assert re.search(rf"^\| {run['devices']} \| {mesh['data']} x {mesh['fsdp']} \| "
                         rf"{run['steps_per_s']:.2f} \|", doc, re.MULTILINE)

    faith = {(r["metric"], r["substrate"], r["steps"]): r["results"]
             for r in record("faithfulness")["runs"]}
    rollout = faith[("deletion", "mean", 16)]["rollout"]
    assert re.search(rf"^\| rollout \| {rollout['auc']:.3f} \[", doc, re.MULTILINE)

    memory = record("explain_memory")["results"]["rollout"]["compiled"]
    assert "| `rollout` | " + " | ".join(f"{c['total_gb']:.2f}" for c in memory) + " |" in doc

    prompts = record("promptshapes")["eval"]
    readme = (ROOT / "README.md").read_text()
    assert f"| {prompts['heldout_accuracy']:.3f} |" in readme
    heldout = prompts["questions"]["heldout"]
    assert f"| the 4 held-out pairs | {heldout['balanced_accuracy']:.3f} |" in readme
