"""Planning: from a selection (tasks, mechanisms, a protocol, seeds, parameter grids) to the
RunSpecs of its runs, every name and parameter resolved and checked before anything runs; and
its size, counted without resolving one (what a command says, and checks, first)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.task import LADDER, TASK_SETS, TASKS, check_ladder
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
    compiled: bool = False,
    difficulties: Sequence[str] | None = None,
    protocol_params: dict[str, Any] | None = None,
) -> list[RunSpec]:
    """Every (task, mechanism, grid point, seed 0..seeds-1), resolved and checked before
    anything runs; names that resolve to the same run (an alias and its name) give it once.

    A list among ``task_params``, ``mechanism_params`` or ``protocol_params`` is a sweep over
    its values, ``difficulties`` a list of presets (synthbench/run/grid.py); the name
    ``ladder`` among them scores each laddered task over its ladder's levels, its seeds dealt
    to them (``task_presets``)."""
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
            ({**preset, **point}, task_seeds)
            for preset, task_seeds in task_presets(task, protocol, seeds, difficulties, task_params)
            for point in grid.points(task_params or {}, task_defaults)
        ]
        for mechanism in mechanisms:
            mech_defaults = grid.constructor_defaults(MECHANISMS.get(mechanism))
            mech_points = grid.points(mechanism_params or {}, mech_defaults)
            for proto, (task_point, task_seeds), mech_point in itertools.product(
                protocols, task_points, mech_points
            ):
                first = RunSpec.resolve(
                    task, mechanism, proto, task_seeds[0], task_point, mech_point,
                    eval_length_mult, pos, pos_params, threads, compiled,
                )  # fmt: skip
                specs.setdefault(first.run_id, first)
                for spec in first.with_seeds(task_seeds[1:]):
                    specs.setdefault(spec.run_id, spec)
    return list(specs.values())


def suite_difficulties(
    task_option: str,
    task_params: dict[str, Any] | None,
    difficulties: Sequence[str] | None,
    seeds: int,
) -> list[str] | None:
    """The difficulties ``run`` plans (its hook: ``--task``'s text, the task parameters, the
    ``--difficulty`` names or None, the seeds): those given; else, for the suite (``--task
    all`` or ``extended``) without task parameters, ``ladder``, each task scored over its
    ladder (docs/TASKS.md, "Ladders"), where the seeds fill the longest ladder (a one-seed
    suite, smoke's, is a wiring check: its tasks run their defaults); else None (one
    setting: a task named alone, or with parameters, runs exactly what it says)."""
    if difficulties:
        return list(difficulties)
    if task_option not in TASK_SETS or task_params:
        return None
    levels = max((len(e.obj.ladder.names) for e in TASKS.entries() if e.obj.ladder), default=0)
    return [LADDER] if levels and seeds >= levels else None


def task_presets(
    task: str,
    protocol: Protocol,
    seeds: int,
    difficulties: Sequence[str] | None,
    task_params: dict[str, Any] | None = None,
) -> list[tuple[dict[str, Any], list[int]]]:
    """(overrides, seeds) of each setting ``task`` runs at: one per difficulty preset (or
    ladder level, ``--difficulty L2``) at seeds 0..seeds-1, the task's defaults without
    ``difficulties``; and ``ladder`` (``LADDER``) its ladder's levels, seeds 0..seeds-1
    dealt to them in turn (``Ladder.level_of_seed``: the seeds a task has are spread over
    its levels, not multiplied by them; docs/TASKS.md, "Ladders"). A task without a ladder
    (a control, the State tasks), or one whose parameters the protocol pins (slay-paper's
    earlier layouts), runs its one setting under ``ladder``."""
    entry = TASKS.entry(task)
    task_cls, every_seed = entry.obj, list(range(seeds))
    found = []
    for name in difficulties or [None]:
        if name is None:
            found.append(({}, every_seed))
        elif name != LADDER:
            found += [(p, every_seed) for p in grid.difficulty_points(task, task_cls, [name])]
        elif task_cls.ladder is None or protocol.pinned_task_params(entry.name):
            found.append(({}, every_seed))
        else:
            found += _ladder_levels(entry.name, task_cls, seeds, task_params or {})
    return found


def _ladder_levels(task: str, task_cls, seeds: int, task_params: dict[str, Any]):
    """(overrides, dealt seeds) of each level of ``task``'s ladder, checked."""
    ladder = task_cls.ladder
    check_ladder(task_cls)
    if seeds < len(ladder.names):
        raise ValueError(
            f"the ladder of {task} has {len(ladder.names)} levels, each run at a seed of "
            f"its own: it needs at least {len(ladder.names)} seeds, got {seeds}"
        )
    fixed = sorted(set(task_params) & set(ladder.axis))
    if fixed:
        raise ValueError(
            f"the ladder of {task} varies {', '.join(ladder.axis)}: a task parameter cannot "
            f"set {', '.join(fixed)} as well (give a difficulty instead of the ladder)"
        )
    dealt: dict[str, list[int]] = {name: [] for name in ladder.names}
    for seed in range(seeds):
        dealt[ladder.level_of_seed(task, seed)].append(seed)
    return [(ladder.levels[name], dealt[name]) for name in ladder.names]


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
    task_runs = 0  # per mechanism and protocol point: runs (seeds) over every task setting
    for task in tasks:
        task_cls = TASKS.get(task)
        presets = task_presets(task, protocol, seeds, difficulties, task_params)
        points = grid.n_points(task_params or {}, grid.task_defaults(task_cls))
        task_runs += points * sum(len(task_seeds) for _, task_seeds in presets)
    mech_points = sum(
        grid.n_points(mechanism_params or {}, grid.constructor_defaults(MECHANISMS.get(m)))
        for m in mechanisms
    )
    return protocols * task_runs * mech_points
