"""What a plan costs: its CPU time, from measured per-step costs (docs/PROTOCOLS.md, "Cost per
mechanism"; ``synthbench run`` prints it before it trains).

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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from synthbench.core.text import plural
from synthbench.run.protocols import PROTOCOLS

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
# evaluation sets): recipe v2 changed which trainings quick runs and how long, not a step
SAME_STEPS = {"quick": {5}}


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
    An unreadable file is passed over: the run itself reports it."""
    frames = []
    for protocol, task, mechanism in sorted(set(keys)):
        folder = Path(root) / f"protocol={protocol}" / f"task={task}" / f"mechanism={mechanism}"
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            if path.name.startswith("."):
                continue
            try:
                rows = pq.read_table(path, columns=STORED_COLUMNS).to_pandas()
            except (OSError, ValueError, KeyError, pa.ArrowException):
                continue
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
) -> Estimate:
    """The estimate of ``trainings`` from the best figures at hand: the rows stored under
    ``results``, then `bench train` rows under ``bench_results``, then the shipped table."""
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
    return estimate(trainings, costs, stored_factors(measured) | averages)


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
    seconds: float  # CPU seconds of the covered trainings, each at its whole schedule
    longest: float  # the longest covered training
    exact: bool  # no covered training's protocol grows its grid or stops early
    expected: float | None  # what measured runs suggest (None: not known)
    trainings_per_run: float | None  # the mean over the covered adaptive trainings
    steps_frac: float | None  # the same, of the share of their steps
    sources: dict[str, int]  # covered trainings by where their cost came from
    unknown: dict[str, tuple[str, ...]]  # mechanism -> its tasks without a cost
    protocols: tuple[str, ...]


def estimate(
    trainings: Iterable[Training],
    costs: Mapping[Key, Cost],
    averages: Mapping[str, tuple[float, float]] | None = None,
) -> Estimate:
    """The CPU time of ``trainings`` at ``costs``. A training whose protocol neither grows
    its lr grid nor stops early takes its whole schedule, once: the bound is what it costs
    (at its ``max_steps`` where extensions may take it further). Any other is expected to
    take steps x steps_frac x trainings_per_run / lrs (what the measured runs of its pair
    did, extensions included in steps_frac; else the protocol's ``averages``; else
    unknown)."""
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
    return Estimate(
        trainings=len(trainings),
        covered=covered,
        steps=tuple(sorted(steps)),
        seconds=seconds,
        longest=longest,
        exact=not adaptive,
        expected=expected if covered else None,
        trainings_per_run=sum(f[0] for f in factors) / len(factors) if factors else None,
        steps_frac=sum(f[1] for f in factors) / len(factors) if factors else None,
        sources={s: sources[s] for s in SOURCES if sources[s]},
        unknown={m: tuple(sorted(tasks)) for m, tasks in sorted(unknown.items())},
        protocols=tuple(sorted({t.protocol for t in trainings})),
    )


def duration(seconds: float) -> str:
    """A span as people say it: 40 s, 12 min, 1.3 h, 4.2 days."""
    if seconds < 0.5:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _steps_text(steps: tuple[int, ...]) -> str:
    return f"x {steps[0]} steps" if len(steps) == 1 else f"of {steps[0]} to {steps[-1]} steps"


def _wall(seconds: float, longest: float, capacity: int) -> str:
    if capacity <= 1:
        return ""
    wall = duration(max(seconds / capacity, longest))
    return f", {'' if wall.startswith('<') else '~'}{wall} wall with {capacity} at once"


def _sources(est: Estimate) -> str:
    if len(est.sources) == 1:
        (source,) = est.sources
        return f"measured on {MACHINE}" if source == "table" else f"from {SOURCE_WORDS[source]}"
    counts = []
    for source, n in est.sources.items():
        what = "the shipped table" if source == "table" else SOURCE_WORDS[source]
        counts.append(f"{what} ({n}{f': {MACHINE}' if source == 'table' else ''})")
    return "from " + ", ".join(counts)


def lines(est: Estimate, capacity: int = 1, note: str = "", options: str = "") -> list[str]:
    """The one to three lines ``synthbench run`` prints before it trains: the CPU time (an
    upper bound for the first lr round where the protocol adapts), what to expect, and the
    pairs without a measured cost. ``note`` goes with the per-step costs (a caveat of the
    caller's), ``options`` at the end of the command that measures unknown pairs."""
    protocol = "/".join(est.protocols)
    said = []
    if est.covered:
        plan = f"{plural(est.covered, 'training')} {_steps_text(est.steps)}"
        costs = f"per-step costs {_sources(est)}{note}"
        if est.exact:
            said.append(
                f"estimated CPU time: {duration(est.seconds)} ({plan}: {protocol} neither grows "
                f"its lr grid nor stops early; {costs}){_wall(est.seconds, est.longest, capacity)}"
            )
        else:
            wall = _wall(est.seconds, est.longest, capacity) if est.expected is None else ""
            said.append(
                f"estimated CPU time: {duration(est.seconds)} at most for the first lr round "
                f"({plan}; grown lrs add trainings, early stopping removes steps; {costs}){wall}"
            )
            if est.expected is not None:
                how = ""
                if est.trainings_per_run is not None:
                    how = (
                        f" (as {protocol}'s measured runs went: {est.trainings_per_run:.1f} "
                        f"trainings per run, {est.steps_frac:.0%} of the steps)"
                    )
                wall = _wall(est.expected, est.longest, capacity)
                said.append(f"expected: ~{duration(est.expected)} CPU{wall}{how}")
            else:
                version = PROTOCOLS.get(protocol).version if protocol in PROTOCOLS else "?"
                said.append(
                    f"expected: not known (no measured runs of {protocol} v{version} say how "
                    "far its lr grids grow or how early its trainings stop)"
                )
    if est.unknown:
        parts = [
            m if len(tasks) > 3 else f"{m} on {', '.join(tasks)}"
            for m, tasks in est.unknown.items()
        ]
        head = (
            f"estimate covers {est.covered} of {plural(est.trainings, 'training')}"
            if est.covered
            else "estimated CPU time: not known"
        )
        said.append(
            f"{head}; unknown: {'; '.join(parts)} (no measured cost: run `synthbench bench "
            f"train --protocol {est.protocols[0]} --mech {','.join(est.unknown)}{options}`)"
        )
    return said


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
