"""What ``synthbench run`` says of a plan's cost before it trains: the lines that put
synthbench/run/cost.py's ``Estimate`` in words, naming what the figure measures (a row's
``wall_seconds``, summed) and where its per-step costs come from."""

from __future__ import annotations

from synthbench.core.text import duration, plural
from synthbench.run.cost import MACHINE, SOURCE_WORDS, Estimate
from synthbench.run.protocols import PROTOCOLS


def _steps_text(steps: tuple[int, ...]) -> str:
    return f"x {steps[0]} steps" if len(steps) == 1 else f"of {steps[0]} to {steps[-1]} steps"


def _wall(est: Estimate, seconds: float, bound: bool = False) -> str:
    """What the command takes in wall time when its trainings take ``seconds``."""
    wall = duration(est.wall(seconds))
    said = f"{'at most ' if bound else ''}{'' if wall.startswith('<') else '~'}{wall}"
    at_once = f" with {est.capacity} at once" if est.capacity > 1 else ""
    return f"; the command: {said} wall{at_once}, its start and leak checks included"


def _startup(est: Estimate) -> str:
    if not est.startup:
        return ""
    return (
        f"; {duration(est.startup)} of it fresh processes' first trainings and first of each task"
    )


def _sources(est: Estimate) -> str:
    if len(est.sources) == 1:
        (source,) = est.sources
        return f"measured on {MACHINE}" if source == "table" else f"from {SOURCE_WORDS[source]}"
    counts = []
    for source, n in est.sources.items():
        what = "the shipped table" if source == "table" else SOURCE_WORDS[source]
        counts.append(f"{what} ({n}{f': {MACHINE}' if source == 'table' else ''})")
    return "from " + ", ".join(counts)


# what the estimate's figure is: a row's wall_seconds (docs/CLI.md, "What it will cost")
TRAINING_TIME = "estimated training time"
SUMMED = "the trainings' wall seconds summed, as `results` lists them"


def lines(est: Estimate, note: str = "", options: str = "") -> list[str]:
    """The one to three lines ``synthbench run`` prints before it trains: the training time
    (the trainings' wall seconds summed: what their rows will store; an upper bound for the
    first lr round where the protocol adapts) and the command's wall time with the
    estimate's ``capacity`` at once, what to expect, and the pairs without a measured cost.
    ``note`` goes with the per-step costs (a caveat of the caller's), ``options`` at the end
    of the command that measures unknown pairs."""
    protocol = "/".join(est.protocols)
    said = []
    if est.covered:
        plan = f"{plural(est.covered, 'training')} {_steps_text(est.steps)}"
        costs = f"per-step costs {_sources(est)}{note}{_startup(est)}"
        if est.exact:
            said.append(
                f"{TRAINING_TIME}: {duration(est.seconds)} ({SUMMED}; {plan}: {protocol} "
                f"neither grows its lr grid nor stops early; {costs}){_wall(est, est.seconds)}"
            )
        else:
            wall = _wall(est, est.seconds, bound=True) if est.expected is None else ""
            said.append(
                f"{TRAINING_TIME}: {duration(est.seconds)} at most for the first lr round "
                f"({SUMMED}; {plan}; grown or refined lrs add trainings, early stopping "
                f"removes steps; {costs}){wall}"
            )
            if est.expected is not None:
                how = ""
                if est.trainings_per_run is not None:
                    how = (
                        f" (as {protocol}'s measured runs went: {est.trainings_per_run:.1f} "
                        f"trainings per run, {est.steps_frac:.0%} of the steps)"
                    )
                said.append(
                    f"expected: ~{duration(est.expected)} training time{how}"
                    f"{_wall(est, est.expected)}"
                )
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
            else f"{TRAINING_TIME}: not known"
        )
        said.append(
            f"{head}; unknown: {'; '.join(parts)} (no measured cost: run `synthbench bench "
            f"train --protocol {est.protocols[0]} --mech {','.join(est.unknown)}{options}`)"
        )
    return said
