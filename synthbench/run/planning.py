"""Planning: from a selection (tasks, mechanisms, a protocol, seeds, parameter grids) to the
RunSpecs of its runs, every name and parameter resolved and checked before anything runs; and
its size, counted without resolving one (what a command says, and checks, first)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.task import TASKS
from synthbench.run import grid
from synthbench.run.limits import MAX_SEEDS
from synthbench.run.protocols import Protocol
from synthbench.run.spec import RunSpec


def plan(
    tasks: Sequence[str],
    mechanisms: Sequence[str],
    protocol: Protocol,
    seeds: int,
    *,
    task_params: dict[str, Any] | None = None,
    mechanism_params: dict[str, Any] | None = None,
    eval_length_mult: float | None = None,
    pos: str | None = None,
    pos_params: dict[str, Any] | None = None,
    threads: int = 1,
    difficulties: Sequence[str] | None = None,
    protocol_params: dict[str, Any] | None = None,
) -> list[RunSpec]:
    """Every (task, mechanism, grid point, seed 0..seeds-1), resolved and checked before
    anything runs; names that resolve to the same run (an alias and its name) give it once.

    A list among ``task_params``, ``mechanism_params`` or ``protocol_params`` is a sweep over
    its values, ``difficulties`` a ladder of presets (synthbench/run/grid.py)."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(
            f"the number of seeds must be an integer in [1, {MAX_SEEDS}], got {seeds!r}"
        )
    protocols = grid.protocol_points(protocol, protocol_params)
    specs: dict[str, RunSpec] = {}
    for task in tasks:
        task_cls = TASKS.get(task)
        task_defaults = grid.task_defaults(task_cls)
        task_points = [
            {**preset, **point}
            for preset in grid.difficulty_points(task, task_cls, difficulties)
            for point in grid.points(task_params or {}, task_defaults)
        ]
        for mechanism in mechanisms:
            mech_defaults = grid.constructor_defaults(MECHANISMS.get(mechanism))
            mech_points = grid.points(mechanism_params or {}, mech_defaults)
            for proto, task_point, mech_point in itertools.product(
                protocols, task_points, mech_points
            ):
                first = RunSpec.resolve(
                    task, mechanism, proto, 0, task_point, mech_point,
                    eval_length_mult, pos, pos_params, threads,
                )  # fmt: skip
                specs.setdefault(first.run_id, first)
                for spec in first.with_seeds(range(1, seeds)):
                    specs.setdefault(spec.run_id, spec)
    return list(specs.values())


def plan_size(
    tasks: Sequence[str],
    mechanisms: Sequence[str],
    protocol: Protocol,
    seeds: int,
    *,
    task_params: dict[str, Any] | None = None,
    mechanism_params: dict[str, Any] | None = None,
    difficulties: Sequence[str] | None = None,
    protocol_params: dict[str, Any] | None = None,
) -> int:
    """How many runs ``plan`` would give, counted without resolving one (a product of the
    lists' lengths): what a command says, and checks against its cap, before planning."""
    fields = {f.name: getattr(protocol, f.name) for f in dataclasses.fields(protocol)}
    protocols = grid.n_points(protocol_params or {}, fields)
    task_points = 0
    for task in tasks:
        task_cls = TASKS.get(task)
        presets = sum(1 for _ in grid.difficulty_points(task, task_cls, difficulties))
        task_points += presets * grid.n_points(task_params or {}, grid.task_defaults(task_cls))
    mech_points = sum(
        grid.n_points(mechanism_params or {}, grid.constructor_defaults(MECHANISMS.get(m)))
        for m in mechanisms
    )
    return protocols * task_points * mech_points * seeds
