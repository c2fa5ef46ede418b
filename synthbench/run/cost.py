"""What a plan costs: its training time (its trainings' wall seconds summed) and the command's
wall time, from measured per-step costs (docs/PROTOCOLS.md, "Cost per mechanism";
``synthbench run`` prints it before it trains).

The seconds of one optimizer step of a (protocol, task, mechanism), a training's fixed costs
(model, data sets, curve points, test evaluation, checks) spread over its steps, come from
the first of:

    stored   rows of that task, mechanism and protocol in the results tree: the median
             wall_seconds / steps_done of the ok rows trained at the command's thread count
             on its device
    bench    the newest `synthbench bench train` row of it in the bench results tree, on the
             command's device: run_s (a predicted training) / the protocol's steps
    table    the shipped table, synthbench/data/step_costs.csv (benchmarks/step_costs.py
             writes it; every row says where its figure comes from): measured on the
             reference machine, a 2-core CPU, one thread

and none of those leaves the pair unknown: the estimate says which.

What the estimate measures is what a results row stores as ``wall_seconds`` (``synthbench
results``: wall_s) and the line of a finished run adds up: a training's wall seconds in its
worker, from building the model to its test metrics. Its sum over the plan's trainings is
the training time. A per-step figure is a warm training's (its process has trained
before), so the sum adds what a fresh process pays on top (``FIRST_TRAINING_S``,
``FIRST_OF_TASK_S``); the command's wall time adds, beyond the trainings shared by the
workers, what no row holds: its own start, the leak checks and the workers' start.

A plan's trainings are what it would train before any lr grid grows (every lr a run starts
with), each at the whole schedule: an upper bound for that first round. Where the protocol
grows its grid or stops trainings early, the expected figure scales each training by what
measured runs of it did (``trainings_per_run`` and ``steps_frac``: the table's, else those of
its runs stored here; a pair with neither, as its protocol's measured pairs did: the table's,
else every pair of the protocol stored here).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from synthbench.core.paths import OutsideRoot, path_under
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.row_checks import row_problems

STEP_COSTS = "step_costs.csv"  # under the synthbench.data package
MACHINE = "a 2-core CPU, 1 thread"  # where the shipped table was measured
TABLE_COLUMNS = [
    "protocol", "protocol_version", "task", "mechanism", "step_seconds", "source",
    # measured runs behind a reference or runs figure: rows, trainings per run, the mean
    # share of the protocol's steps a training trained
    "rows", "trainings_per_run", "steps_frac",
    # a training measured by benchmarks/step_costs.py: its steps and its step time
    "measured_steps", "step_ms",
    "scale",  # a layout or scaled figure: the measured ratio of step times applied
]  # fmt: skip
TABLE_SOURCES = {
    "reference": "the median wall_seconds / steps_done of the protocol's rows of "
    "synthbench/data/reference/quick.parquet",
    "runs": "the same over the quick rows of benchmarks/runs/quick-v4 (mechanisms the "
    "reference lacks)",
    "layout": "a reference or runs figure times the ratio of the step time on today's layout "
    "of the task to the step time on the layout of those rows, measured back to back, the "
    "median over the mechanisms",
    "measured": "the protocol's whole training measured here (seed 0, its lr): wall / steps",
    "scaled": "the quick figure times the ratio of this protocol's step time to quick's, "
    "measured back to back, the median over a sample of tasks for the mechanism",
}
# What a warm training's per-step figure leaves out, measured on the reference machine (2
# cores, one thread, benchmarks/cost_breakdown.py and a fresh process timed phase by
# phase; docs/PROTOCOLS.md, "What the estimate adds"): in a training's wall_seconds, a
# process's first training (torch imports its compiler stack, torch._dynamo, on the first
# AdamW: 1.5-1.8 s) and its first of each task (the task's chance, synthbench/integrity/
# audit.py, and the first batches: 0.1-0.3 s); outside every training, the command's own
# start (interpreter, torch and synthbench imported, planning, checking the plan: 3-3.5 s),
# the leak check of each mechanism before it trains (0.4-0.7 s) and, where workers train,
# a worker's start (its interpreter and imports: about 1.6 s; they start together).
FIRST_TRAINING_S = 1.6
FIRST_OF_TASK_S = 0.2
COMMAND_START_S = 3.5
LEAK_CHECK_S = 0.5
WORKER_START_S = 1.6
SOURCES = ("stored", "bench", "table")  # in order of preference
SOURCE_WORDS = {"stored": "stored rows", "bench": "`bench train` rows", "table": "the table"}
Key = tuple[str, str, str]  # (protocol, task, mechanism)


@dataclass(frozen=True)
class Cost:
    """One (protocol, task, mechanism)'s measured seconds per step, and what its measured
    runs trained (when known): trainings per run and the share of the steps."""

    step_seconds: float
    source: str  # one of SOURCES
    trainings_per_run: float | None = None
    steps_frac: float | None = None


@dataclass(frozen=True)
class Training:
    """One planned training: a run at one of the lrs it starts with."""

    protocol: str
    task: str
    mechanism: str
    steps: int  # its schedule (a budget's limit, if lower)
    lrs: int  # the lrs its run starts with
    adaptive: bool  # its protocol grows the lr grid, stops trainings early or extends them
    # the most it may run, past ``steps`` while its curve still rises (protocol.max_steps,
    # within its budget); 0: ``steps``
    max_steps: int = 0

    @property
    def key(self) -> Key:
        return (self.protocol, self.task, self.mechanism)


# -- figures from rows ----------------------------------------------------------------------


def figures_of_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (protocol, task, mechanism) of results rows: the median wall_seconds /
    steps_done of the ok rows (``step_seconds``), how many (``rows``), their trainings per
    run and mean share of the steps (needs run_id and steps; else left out)."""
    ok = rows[
        (rows["status"] == "ok")
        & (rows["steps_done"] > 0)
        & (rows["wall_seconds"] > 0)
        & rows["wall_seconds"].map(math.isfinite)
    ]
    ok = ok.assign(per_step=ok["wall_seconds"] / ok["steps_done"])
    groups = ok.groupby(["protocol", "task", "mechanism"], sort=True)
    figures = groups.agg(step_seconds=("per_step", "median"), rows=("per_step", "size"))
    if "run_id" in ok and "steps" in ok:
        figures["trainings_per_run"] = groups["run_id"].size() / groups["run_id"].nunique()
        figures["steps_frac"] = (
            (ok["steps_done"] / ok["steps"])
            .groupby([ok["protocol"], ok["task"], ok["mechanism"]])
            .mean()
        )
    if "protocol_version" in ok:
        figures["protocol_version"] = groups["protocol_version"].max()
    return figures.reset_index()


# -- the shipped table ----------------------------------------------------------------------


def read_table(path: Path | None = None) -> pd.DataFrame:
    """The shipped table of per-step costs (or ``path``'s)."""
    if path is not None:
        return pd.read_csv(path, comment="#")
    with resources.files("synthbench.data").joinpath(STEP_COSTS).open("r") as f:
        return pd.read_csv(f, comment="#")


def write_table(table: pd.DataFrame, path: Path) -> None:
    """The table with a header saying what each source means (benchmarks/step_costs.py)."""
    table = table.reindex(columns=TABLE_COLUMNS)
    order = {name: i for i, name in enumerate(PROTOCOLS.names())}
    table = table.sort_values(
        ["protocol", "mechanism", "task"], key=lambda c: c.map(order) if c.name == "protocol" else c
    )
    for name in ("protocol_version", "rows", "measured_steps"):
        table[name] = table[name].astype("Int64")
    header = [
        "# seconds per optimizer step of one training at the protocol's whole schedule, its",
        "# fixed costs included; measured on the reference machine, "
        f"{MACHINE} (benchmarks/step_costs.py writes this file; docs/PROTOCOLS.md explains it)",
        *(f"# source {name}: {meaning}" for name, meaning in TABLE_SOURCES.items()),
    ]
    body = table.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    path.write_text("\n".join(header) + "\n" + body)


# earlier versions of a protocol whose steps cost what today's do (the same model, batch and
# evaluation sets): recipe v2 changed which trainings quick runs and how long, not a step, and
# its knife-edge refinement (quick v7, standard v6, the block track's v5) which lrs train
SAME_STEPS = {"quick": {5, 6}, "standard": {5}, "quick-block": {4}, "standard-block": {4}}


def _current(table: pd.DataFrame) -> pd.Series:
    """The figures measured at their protocol's version here: only those say how today's
    recipe trains (an earlier version's runs grew other grids, stopped at other steps; its
    step times still price a step of the same model)."""
    if "protocol_version" not in table:  # figures that do not say: taken as today's
        return pd.Series(True, index=table.index)
    versions = table["protocol"].map(
        lambda name: PROTOCOLS.get(name).version if name in PROTOCOLS else -1
    )
    return table["protocol_version"].isna() | (table["protocol_version"] == versions)


def table_costs(table: pd.DataFrame) -> dict[Key, Cost]:
    def known(value, current: bool) -> float | None:
        return None if pd.isna(value) or not current else float(value)

    return {
        (r.protocol, r.task, r.mechanism): Cost(
            float(r.step_seconds),
            "table",
            known(r.trainings_per_run, current),
            known(r.steps_frac, current),
        )  # fmt: skip
        for r, current in zip(table.itertuples(), _current(table), strict=True)
    }


def protocol_factors(table: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per protocol, the mean trainings per run and share of the steps over the figures that
    know them, at the protocol's version here: what an adaptive training of a pair without
    its own is expected to take."""
    known = table[_current(table)].dropna(subset=["trainings_per_run", "steps_frac"])
    means = known.groupby("protocol")[["trainings_per_run", "steps_frac"]].mean()
    return {p: (float(r.trainings_per_run), float(r.steps_frac)) for p, r in means.iterrows()}


# -- figures of this machine ----------------------------------------------------------------

STORED_COLUMNS = ["run_id", "status", "wall_seconds", "steps_done", "steps", "threads", "device"]


def stored_costs(
    root: Path, keys: Iterable[Key], threads: int, device: str | None
) -> dict[Key, Cost]:
    """Figures from the rows stored under ``root`` for ``keys`` (only their folders are
    read), trained with ``threads`` threads on ``device`` (a row's device name; None: any).
    An unreadable file, or a row the readers' checks leave out (run/row_checks.py: a negative
    time, say), is passed over: the run itself reports it."""
    frames = []
    for protocol, task, mechanism in sorted(set(keys)):
        try:
            folder = path_under(
                root, f"protocol={protocol}", f"task={task}", f"mechanism={mechanism}"
            )
        except OutsideRoot:
            continue
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            if path.name.startswith("."):
                continue
            try:
                rows = pq.read_table(path, columns=STORED_COLUMNS).to_pandas()
            except (OSError, ValueError, KeyError, pa.ArrowException):
                continue
            rows = rows[row_problems(rows).isna()]
            frames.append(rows.assign(protocol=protocol, task=task, mechanism=mechanism))
    if not frames:
        return {}
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["threads"] == threads]
    if device is not None:
        rows = rows[rows["device"] == device]
    if rows.empty:
        return {}
    figures = figures_of_rows(rows)
    return {
        (r.protocol, r.task, r.mechanism): Cost(
            float(r.step_seconds), "stored", float(r.trainings_per_run), float(r.steps_frac)
        )
        for r in figures.itertuples()
    }


BENCH_COLUMNS = ["mechanism", "task", "protocol", "status", "run_s", "device"]


def bench_costs(root: Path, keys: Iterable[Key], device: str | None) -> dict[Key, Cost]:
    """Figures from `synthbench bench train` rows under ``root`` (the bench results tree),
    the newest of each pair: its predicted training (run_s) over the protocol's steps."""
    wanted = set(keys)
    folder = Path(root) / "train"
    files = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))
    found: dict[Key, Cost] = {}
    for path in files if folder.is_dir() else []:  # oldest first: names start with the time
        try:
            rows = pq.read_table(path, columns=BENCH_COLUMNS).to_pylist()
        except (OSError, ValueError, KeyError, pa.ArrowException):
            continue
        for r in rows:
            key = (r["protocol"], r["task"], r["mechanism"])
            seconds = r["run_s"]
            if (
                key in wanted
                and r["status"] == "ok"
                and (device is None or r["device"] == device)
                and seconds is not None
                and math.isfinite(seconds)
                and seconds > 0
                and r["protocol"] in PROTOCOLS
            ):
                found[key] = Cost(seconds / PROTOCOLS.get(r["protocol"]).steps, "bench")
    return found


def choose(keys: Iterable[Key], *layers: Mapping[Key, Cost]) -> dict[Key, Cost]:
    """Each key's cost from the first layer that has it; what its runs trained from the
    table where it knows that (the reference's three seeds of the pair), else from the
    first layer that does (this machine's stored runs of the pair)."""
    chosen = {}
    for key in set(keys):
        found = [layer[key] for layer in layers if key in layer]
        if not found:
            continue
        first = found[0]
        knowing = [c for c in found if c.trainings_per_run is not None]
        factors = next((c for c in knowing if c.source == "table"), knowing[0] if knowing else None)
        if factors is not None:
            first = Cost(first.step_seconds, first.source, factors.trainings_per_run,
                         factors.steps_frac)  # fmt: skip
        chosen[key] = first
    return chosen


def trainings_of(units: Iterable) -> list[Training]:
    """The trainings of the runner's units (synthbench/run/runner.py ``Unit``): a unit with
    a step budget (an lr grown past an edge that solved) at most that many."""
    trainings = []
    for unit in units:
        spec, budget = unit.spec, unit.budget
        p = spec.protocol
        steps = p.steps if budget.steps is None else min(p.steps, budget.steps)
        longest = p.max_steps if budget.steps is None else min(p.max_steps, budget.steps)
        trainings.append(
            Training(p.name, spec.task, spec.mechanism, steps, len(p.lrs), adapts(p), longest)
        )
    return trainings


def plan_estimate(
    trainings: list[Training],
    results: Path,
    bench_results: Path,
    threads: int,
    device: str | None,
    table: pd.DataFrame | None = None,
    capacity: int = 1,
    workers: bool = False,
) -> Estimate:
    """The estimate of ``trainings`` from the best figures at hand: the rows stored under
    ``results``, then `bench train` rows under ``bench_results``, then the shipped table;
    ``capacity`` of them at once, in worker processes where ``workers`` (``estimate``)."""
    table = read_table() if table is None else table
    keys = {t.key for t in trainings}
    # a pair nobody measured trains as its protocol's measured pairs did: the table's, else
    # every pair of it stored here (a protocol the shipped table has no runs of); one read
    # of the stored rows serves both
    averages = protocol_factors(table)
    unmeasured = {t.protocol for t in trainings} - set(averages)
    read = stored_costs(results, keys | set(stored_pairs(results, unmeasured)), threads, device)
    stored = {key: c for key, c in read.items() if key in keys}
    costs = choose(keys, stored, bench_costs(bench_results, keys, device), table_costs(table))
    measured = {key: c for key, c in read.items() if key[0] in unmeasured}
    return estimate(trainings, costs, stored_factors(measured) | averages, capacity, workers)


def stored_pairs(root: Path, protocols: Iterable[str]) -> list[Key]:
    """Every (protocol, task, mechanism) of ``protocols`` with a folder under ``root``."""
    pairs = []
    for protocol in sorted(protocols):
        for folder in sorted(Path(root).glob(f"protocol={protocol}/task=*/mechanism=*")):
            task = folder.parent.name.removeprefix("task=")
            pairs.append((protocol, task, folder.name.removeprefix("mechanism=")))
    return pairs


def stored_factors(stored: Mapping[Key, Cost]) -> dict[str, tuple[float, float]]:
    """``protocol_factors`` over the stored figures."""
    if not stored:
        return {}
    figures = [
        {"protocol": protocol, "trainings_per_run": c.trainings_per_run, "steps_frac": c.steps_frac}
        for (protocol, _, _), c in stored.items()
    ]
    return protocol_factors(pd.DataFrame(figures))


# -- the estimate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    trainings: int  # planned
    covered: int  # of which with a known per-step cost
    steps: tuple[int, ...]  # the step counts of the covered trainings
    # training time: the covered trainings' wall seconds summed (a row's wall_seconds),
    # each at its whole schedule, ``startup`` included
    seconds: float
    longest: float  # the longest covered training (a worker's first, say)
    exact: bool  # no covered training's protocol grows its grid or stops early
    expected: float | None  # the training time measured runs suggest (None: not known)
    trainings_per_run: float | None  # the mean over the covered adaptive trainings
    steps_frac: float | None  # the same, of the share of their steps
    sources: dict[str, int]  # covered trainings by where their cost came from
    unknown: dict[str, tuple[str, ...]]  # mechanism -> its tasks without a cost
    protocols: tuple[str, ...]
    # of ``seconds`` (and ``expected``), what fresh processes pay on top of warm trainings:
    # each one's first training and its first of each task
    startup: float = 0.0
    # the command's own wall seconds beyond its trainings: start, leak checks, workers' start
    command: float = 0.0
    capacity: int = 1  # trainings at once
    # the per-step figure of each covered (protocol, task, mechanism)
    costs: Mapping[Key, Cost] = field(default_factory=dict)

    def training_seconds(self, training: Training) -> float | None:
        """What one training is expected to take: its per-step figure times its steps (times
        the share of the steps its pair's measured runs trained, where its protocol stops
        early), and its share of ``startup``; None where its pair has no figure. The run's
        progress bar starts its ETA from it."""
        found = self.costs.get(training.key)
        if found is None:
            return None
        frac = found.steps_frac if training.adaptive and found.steps_frac is not None else 1.0
        return found.step_seconds * training.steps * frac + self.startup / max(1, self.covered)

    def wall(self, seconds: float) -> float:
        """The command's wall seconds when its trainings take ``seconds`` in all: its own
        start and checks, then the trainings shared by ``capacity`` at once (never less than
        the longest, never more than all of them one after another)."""
        return self.command + max(seconds / self.capacity, min(self.longest, seconds))


def estimate(
    trainings: Iterable[Training],
    costs: Mapping[Key, Cost],
    averages: Mapping[str, tuple[float, float]] | None = None,
    capacity: int = 1,
    workers: bool = False,
) -> Estimate:
    """The training time of ``trainings`` at ``costs`` (their wall seconds summed, as their
    rows will store them). A training whose protocol neither grows its lr grid nor stops
    early takes its whole schedule, once: the bound is what it costs (at its ``max_steps``
    where extensions may take it further). Any other is expected to take steps x steps_frac
    x trainings_per_run / lrs (what the measured runs of its pair did, extensions included
    in steps_frac; else the protocol's ``averages``; else unknown). On top of the per-step
    figures (warm trainings'): each of the ``capacity`` processes that trains pays
    FIRST_TRAINING_S once and FIRST_OF_TASK_S per task it trains (a task's trainings spread
    over as many of them as there are trainings); the command adds COMMAND_START_S,
    LEAK_CHECK_S per mechanism and, with ``workers`` (worker processes, not this one),
    WORKER_START_S."""
    trainings = list(trainings)
    averages = averages or {}
    seconds = longest = 0.0
    expected: float | None = 0.0
    factors = []
    sources: Counter = Counter()
    unknown: dict[str, set[str]] = {}
    steps, covered, adaptive = set(), 0, False
    for t in trainings:
        cost = costs.get(t.key)
        if cost is None:
            unknown.setdefault(t.mechanism, set()).add(t.task)
            continue
        covered += 1
        steps.add(max(t.steps, t.max_steps))
        sources[cost.source] += 1
        full = cost.step_seconds * t.steps
        bound = cost.step_seconds * max(t.steps, t.max_steps)
        seconds += bound
        longest = max(longest, bound)
        if not t.adaptive:
            expected = None if expected is None else expected + full
            continue
        adaptive = True
        if cost.trainings_per_run is not None:
            runs, frac = cost.trainings_per_run, cost.steps_frac
        elif t.protocol in averages:
            runs, frac = averages[t.protocol]
        else:
            expected = None
            continue
        factors.append((runs, frac))
        if expected is not None:
            expected += full * frac * runs / t.lrs
    capacity = max(1, capacity)
    tasks = Counter(t.task for t in trainings if t.key in costs)
    processes = min(capacity, covered)
    startup = processes * FIRST_TRAINING_S + sum(
        FIRST_OF_TASK_S * min(capacity, n) for n in tasks.values()
    )
    mechanisms = len({t.mechanism for t in trainings})
    command = COMMAND_START_S + LEAK_CHECK_S * mechanisms + (WORKER_START_S if workers else 0.0)
    return Estimate(
        trainings=len(trainings),
        covered=covered,
        steps=tuple(sorted(steps)),
        seconds=seconds + startup if covered else 0.0,
        longest=longest + FIRST_TRAINING_S + FIRST_OF_TASK_S if covered else 0.0,
        exact=not adaptive,
        expected=expected + startup if covered and expected is not None else None,
        trainings_per_run=sum(f[0] for f in factors) / len(factors) if factors else None,
        steps_frac=sum(f[1] for f in factors) / len(factors) if factors else None,
        sources={s: sources[s] for s in SOURCES if sources[s]},
        unknown={m: tuple(sorted(tasks)) for m, tasks in sorted(unknown.items())},
        protocols=tuple(sorted({t.protocol for t in trainings})),
        startup=startup if covered else 0.0,
        command=command,
        capacity=capacity,
        costs={t.key: costs[t.key] for t in trainings if t.key in costs},
    )


# -- the documentation's table --------------------------------------------------------------


def adapts(protocol) -> bool:
    """Whether a protocol grows its lr grid, stops trainings early or extends them (recipe
    v2's max_steps): then its plan's trainings at their whole schedules are only a bound."""
    return (
        protocol.lr_extend > 0
        or protocol.stop_at > 0
        or protocol.pace_margin > 0
        or protocol.max_steps > 0
    )
