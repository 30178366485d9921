"""The test suite's size and wall time: `./scripts/test.sh`, and with `--all` `.ci/run`."""

from __future__ import annotations

import re

from benchmarks import common, tables

COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def summary(output: str) -> dict:
    for line in reversed(output.splitlines()):
        counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                  for n, kind in COUNT.findall(line)}
        if counts:
            return counts
    raise ValueError("no pytest summary line in the output")


def run(command: list[str]) -> dict:
    done = common.run_cli(command, capture=True, check=False)  # a failing suite is a figure too
    return {"command": done["command"], "exit_code": done["returncode"],
            "wall_s": done["wall_s"], **summary(done["stdout"])}


def main(argv: list[str]) -> int:
    args = common.parser("suite", __doc__,
                         all=(False, "also .ci/run, the slow tests too")).parse_args(argv)
    runs = [run(["./scripts/test.sh"]), *([run([".ci/run"])] if args.all else [])]
    common.write_record("suite", {"runs": runs}, argv=argv, out=args.out)
    return max(r["exit_code"] for r in runs)


def table(r: dict) -> list[str]:
    return tables.table(["command", "passed", "skipped", "failed", "wall time"],
                        [[f"`{run['command']}`", run["passed"], run.get("skipped", 0),
                          run.get("failed", 0), f"{run['wall_s'] / 60:.1f} minutes"]
                         for run in r["runs"]])
