"""Suite v4's calibration screen (issue 70): does each ladder's top level leave fewer than
``BOUND_COUNT`` (10) of the reference mechanisms at the ceiling?

    python benchmarks/ceiling_screen.py --results DIR [--tasks T,...] [--level L3]
        [--mechs M,...] [--protocol quick] [--train [--compile]]

For each laddered task, the runs of DIR at the level (one seed each, the first stored) are
read as the informativeness audit reads a cell: the test value of the task's target metric
at the selected lr, at the ceiling within ``BOUND_MARGIN`` (0.02) of 1.0
(synthbench/report/informative.py). The verdict is decided as soon as the runs decide it:

- **at the ceiling**: ``BOUND_COUNT`` or more of the mechanisms are there (the level is too
  easy: its ladder needs a harder top);
- **below the ceiling**: so few are there that the untrained ones cannot take the count to
  ``BOUND_COUNT`` (a run that failed counts as not there, and is listed);
- **open**: neither yet.

With ``--train`` an open task trains its next mechanism (``synthbench run --task T
--difficulty LEVEL --mech M --seeds 1 --jobs 1``, core track, resumable), the weakest first by
the shipped reference's mean score on the task. So a task whose top level is informative is
decided in about ``n - BOUND_COUNT + 1`` trainings of runs (3 of 12), not 12. The audit's
full count of pairs separated needs every mechanism at every level; this screen only says
which ladders need a harder top before that is paid for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from synthbench.core.task import TASKS
from synthbench.report.informative import BOUND_COUNT, BOUND_MARGIN, reference_rows
from synthbench.run.protocols import Protocol
from synthbench.run.runner import stored_done
from synthbench.run.seeds import run_score
from synthbench.run.store import ResultStore

REFERENCE_MECHANISMS = (
    "softmax,linear,performer,cosformer,slay,sliding-window,retnet,gla,deltanet,"
    "gated-deltanet,mamba2,based"
)


def level_scores(rows: pd.DataFrame, protocol: str, task: str, level: str) -> dict[str, float]:
    """Mechanism -> score of its lowest-seed complete run of ``task`` at ``level`` under
    ``protocol`` (the newest version stored); NaN where that run has no selected row (every
    lr failed). A run under way is not scored."""
    if rows.empty:
        return {}
    rows = rows[(rows["protocol"] == protocol) & (rows["task"] == task)]
    if rows.empty:
        return {}
    rows = rows[rows["protocol_version"] == rows["protocol_version"].max()]
    spec = TASKS.get(task)
    at_level = rows["task_params"].map(lambda p: spec.level_of(json.loads(p)) == level)
    found = {}
    for mech, part in rows[at_level].groupby("mechanism"):
        done = [run for _, run in part.groupby("seed", sort=True) if _complete(run)]
        if not done:
            continue  # under way: not scored yet
        chosen = done[0][done[0]["selected"].astype(bool) & (done[0]["status"] == "ok")]
        score = run_score(chosen.iloc[0].to_dict()) if len(chosen) else None
        found[str(mech)] = float("nan") if score is None else score
    return found


def _complete(run: pd.DataFrame) -> bool:
    """Whether a run's stored rows are done, judged by the recipe they were trained under
    (the runner's own rule, as benchmarks/keep_complete.py judges them)."""
    trained = Protocol.from_config(json.loads(run.iloc[0]["config"])["protocol"])
    return stored_done(trained, run.to_dict("records"))


def reference_order(task: str, mechs: list[str]) -> list[str]:
    """``mechs`` by the shipped reference's mean score on ``task`` (core track), lowest
    first; a mechanism the reference lacks goes first (nothing says it is strong)."""
    rows, _ = reference_rows()
    rows = rows[(rows["protocol"] == "quick") & (rows["task"] == task)]
    rows = rows[rows["selected"].astype(bool) & (rows["status"] == "ok")]
    means = {}
    for mech, part in rows.groupby("mechanism"):
        values = [run_score(r) for r in part.to_dict("records")]
        values = [v for v in values if v is not None]
        if values:
            means[str(mech)] = sum(values) / len(values)
    return sorted(mechs, key=lambda m: (m in means, means.get(m, 0.0)))


def verdict(scores: dict[str, float], mechs: list[str]) -> tuple[str, int, int]:
    """(verdict, mechanisms at the ceiling, mechanisms not yet scored) of one level."""
    at_ceiling = sum(scores[m] >= 1.0 - BOUND_MARGIN for m in mechs if m in scores)
    untried = sum(m not in scores for m in mechs)
    if at_ceiling >= BOUND_COUNT:
        return "at the ceiling", at_ceiling, untried
    if at_ceiling + untried < BOUND_COUNT:
        return "below the ceiling", at_ceiling, untried
    return "open", at_ceiling, untried


def train(task: str, level: str, mech: str, protocol: str, results: Path, compiled: bool) -> int:
    command = [sys.executable, "-m", "synthbench.cli", "run", "--task", task]
    command += ["--difficulty", level, "--mech", mech, "--protocol", protocol, "--seeds", "1"]
    command += ["--jobs", "1", "--results", str(results)] + (["--compile"] if compiled else [])
    return subprocess.run(command, stdout=sys.stderr).returncode  # stdout: the table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True, help="the results tree")
    parser.add_argument("--tasks", help="comma-separated laddered tasks (default: every one)")
    parser.add_argument("--level", default=None, help="the level (default: each ladder's top)")
    parser.add_argument("--mechs", default=REFERENCE_MECHANISMS, help="comma-separated")
    parser.add_argument("--protocol", default="quick")
    parser.add_argument("--train", action="store_true", help="train until each task is decided")
    parser.add_argument("--compile", action="store_true", help="train with run --compile")
    args = parser.parse_args(argv)

    laddered = [name for name in TASKS.names() if TASKS.get(name).ladder is not None]
    tasks = args.tasks.split(",") if args.tasks else laddered
    unknown = [t for t in tasks if t not in laddered]
    if unknown:
        print(f"ceiling_screen: no ladder: {', '.join(unknown)}", file=sys.stderr)
        return 2
    mechs = args.mechs.split(",")
    if len(mechs) < BOUND_COUNT:
        message = f"{len(mechs)} mechanisms cannot reach {BOUND_COUNT} at the ceiling"
        print(f"ceiling_screen: {message}", file=sys.stderr)
        return 2
    if args.train:
        args.results.mkdir(parents=True, exist_ok=True)

    def load() -> pd.DataFrame:
        if not args.results.is_dir():
            return pd.DataFrame()
        return ResultStore(args.results).load(warn=False).rows

    rows = load()
    print("| task | level | verdict | at ceiling | below | failed | untried |")
    print("|---|---|---|---:|---|---|---:|")
    for task in tasks:
        level = args.level or TASKS.get(task).ladder.names[-1]
        order = reference_order(task, mechs)
        while True:
            scores = level_scores(rows, args.protocol, task, level)
            decided, at_ceiling, untried = verdict(scores, mechs)
            if decided != "open" or not args.train:
                break
            mech = next(m for m in order if m not in scores)
            if train(task, level, mech, args.protocol, args.results, args.compile) != 0:
                print(f"ceiling_screen: training {task} {level} {mech} failed", file=sys.stderr)
                return 1
            rows = load()
        ceiling = 1.0 - BOUND_MARGIN
        below = [f"{m} {scores[m]:.3f}" for m in order if m in scores and scores[m] < ceiling]
        failed = [m for m in order if m in scores and scores[m] != scores[m]]
        print(
            f"| {task} | {level} | {decided} | {at_ceiling} | {', '.join(below) or '-'} | "
            f"{', '.join(failed) or '-'} | {untried} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
