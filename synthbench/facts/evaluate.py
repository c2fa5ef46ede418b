"""A fact's runs, planned as ``synthbench run`` plans them, and its verdict from stored rows.

An arm's runs are found by run id (the hash of each run's resolved config), so a fact reads
exactly the runs it declared, whichever command stored them: ``facts run``, a plain
``synthbench run`` with the same options, or another fact that shares them. Each seed's
value is the arm's target metric (or the ``metric`` it names) at the lr its validation set
selected; an arm of several tasks averages them per seed. A fact measured as a score
normalises each value by the task's chance, a test beyond the trained length by the chance of
the task at that length.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from synthbench.core.task import TASKS
from synthbench.facts.fact import LONG_METRICS, Arm, Fact
from synthbench.facts.rules import INCONCLUSIVE, NOT_RUN, ArmResult, Decision
from synthbench.integrity.audit import chance
from synthbench.report.aggregate import normalise, run_outcomes, selected_runs
from synthbench.run import runner
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec


def arm_specs(arm: Arm, seeds: int, first_seed: int = 0, threads: int = 1) -> list[RunSpec]:
    """The runs of ``arm`` at seeds ``first_seed`` .. ``first_seed + seeds - 1``."""
    firsts = [
        spec
        for task in arm.tasks
        for spec in runner.plan(
            [task],
            [arm.mech],
            PROTOCOLS.get(arm.protocol),
            1,
            task_params=arm.params_of(task),
            mechanism_params=dict(arm.mech_params),
            protocol_params=dict(arm.protocol_params),
            eval_length_mult=arm.eval_length_mult,
            pos=arm.pos,
            threads=threads,
        )
    ]
    return [s.with_seed(seed) for s in firsts for seed in range(first_seed, first_seed + seeds)]


@functools.cache
def _long_chance(task: str, task_params: str, mult: float, metric: str) -> float:
    resolved = TASKS.get(task)(**json.loads(task_params)).at_length(mult)
    found = chance(resolved)
    return found.token_acc if metric == "long_token_acc" else found.exact_match


def long_chance(spec: RunSpec, metric: str) -> float:
    """The chance of ``metric`` (long_token_acc or long_exact_match) for ``spec``'s test
    beyond the trained length: the audit's chance (what every row stores for its trained
    length) of the task at ``eval_length_mult`` times it. Computed here, not stored: rows hold
    the chance of the trained length only."""
    if spec.eval_length_mult is None:  # a task without a length knob: no such test
        return float("nan")
    params = json.dumps(spec.task_params, sort_keys=True)
    return _long_chance(spec.task, params, float(spec.eval_length_mult), metric)


def fact_specs(fact: Fact, first_seed: int = 0, threads: int = 1) -> dict[str, list[RunSpec]]:
    """Arm label -> its runs."""
    return {
        label: arm_specs(arm, fact.seeds, first_seed, threads) for label, arm in fact.arms.items()
    }


def arm_result(arm: Arm, specs: list[RunSpec], rows: pd.DataFrame, measure: str) -> ArmResult:
    """The per-seed values of one arm from the stored ``rows`` (any rows: those of its run
    ids are taken)."""
    empty = pd.Series(dtype=float)
    mine = rows[rows["run_id"].isin({s.run_id for s in specs})] if len(rows) else rows
    if mine.empty:
        return ArmResult(empty, empty, problem="not run yet", missing=True)
    stored = set(mine["run_id"])
    missing = [s for s in specs if s.run_id not in stored]
    failed = run_outcomes(mine)
    failed = failed[failed["status"] != "ok"]
    if len(failed):
        first = failed.iloc[0]
        problem = f"{len(failed)} of {len(specs)} runs failed ({first['status']}, {first['task']}"
        return ArmResult(empty, empty, problem=f"{problem} seed {int(first['seed'])})")
    if missing:
        return ArmResult(empty, empty, problem=f"{len(missing)} of {len(specs)} runs not stored")
    metric = arm.metric or "target"
    runs = selected_runs(mine, metric)
    if measure == "score" and metric in LONG_METRICS:  # their chance: at the tested length
        chances = {s.task: long_chance(s, metric) for s in specs}
        runs["chance"] = runs["task"].map(chances)
        runs["score"] = normalise(runs["value"], runs["chance"])
    column = "score" if measure == "score" else "value"
    scaled = runs["chance"].notna() & (measure == "score")
    se = runs["se"].where(~scaled, runs["se"] / (1 - runs["chance"]))
    runs = runs.assign(measured=runs[column], measured_se=se)
    per_seed = runs.groupby("seed").agg(
        measured=("measured", "mean"),
        # independent test sets: the mean of k values has sqrt(sum se^2) / k
        measured_se=("measured_se", lambda s: float(np.sqrt((s**2).sum())) / len(s)),
        tasks=("task", "nunique"),
    )
    per_seed = per_seed[per_seed["tasks"] == len(arm.tasks)]
    return ArmResult(
        per_seed["measured"].astype(float),
        per_seed["measured_se"].astype(float),
        lr_edge=bool(runs["lr_edge"].any()),
    )


@dataclass(frozen=True)
class Outcome:
    name: str
    fact: Fact
    results: dict[str, ArmResult]
    decision: Decision


def decide(name: str, fact: Fact, rows: pd.DataFrame, first_seed: int = 0) -> Outcome:
    """The verdict of ``fact`` on the stored ``rows``: not run when none of its runs is
    stored; inconclusive, with the reason, when some are missing or failed."""
    specs = fact_specs(fact, first_seed)
    results = {
        label: arm_result(arm, specs[label], rows, fact.measure) for label, arm in fact.arms.items()
    }
    if all(r.missing for r in results.values()):
        why = f"none of its runs is stored: synthbench facts run {name}"
        return Outcome(name, fact, results, Decision(NOT_RUN, "", why))
    decision = fact.verdict_rule.decide(results)
    if decision.verdict == INCONCLUSIVE and not decision.figures:
        figures = "; ".join(f"{label} {r.text()}" for label, r in results.items())
        decision = Decision(INCONCLUSIVE, figures, decision.reason)
    return Outcome(name, fact, results, decision)
