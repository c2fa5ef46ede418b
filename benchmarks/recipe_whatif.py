"""What a cheaper recipe would have decided, replayed from a trained recipe's rows.

    python benchmarks/recipe_whatif.py RESULTS [--against SOURCE] [--step-costs TABLE ...]
        [--variant NAME:FIELD=VALUE,... ...] [--markdown]

RESULTS holds a recipe-v2 panel (benchmarks/recipe_panel.py) trained under the protocol
of this code (quick v7, say). A variant changes fields of that protocol that only ever
stop a training sooner or train fewer lrs or seeds: ``lr_refine``, ``max_steps`` (not
above the trained one), ``rise_margin`` (not below), ``pace_margin``, ``lr_extend``,
``lr_signal``, ``max_seeds``, ``seed_spread``. Training is deterministic (same seed, lr and
schedule: the same steps), and a training that stops sooner has, up to where it stops, the
very curve the stored one has (its lr schedule is the same until an extension the variant
does not take). So the variant's sweeps are replayed with the package's own rules
(synthbench/run/lr_selection.py ``sweep_state``, synthbench/run/train.py ``Horizon`` and
``curve_point``, synthbench/run/seeds.py ``seeds_to_add``), each training cut where the variant
would have stopped it:

- **exact**: which lrs train, the steps each trains, every validation score, the selection,
  ``lr_gap``, the knife-edge, learned-nothing and undertrained counts, the steps and the
  modelled CPU seconds (steps times the step-cost table's seconds a step);
- **a diverged training** diverges where it did if the variant trains it that far, and is
  ok where the variant stops it sooner;
- **read off the validation set**: a training cut short has no test score where it stops.
  Its run's score is then the validation token accuracy there (256 examples, not the test
  set's 512), used only for bimodal cells and pairs separated; ``proxied`` counts those runs;
- **unknown**: a variant that would train what the stored panel did not (an lr or a seed it
  lacks, or steps past where a stored training stopped) cannot be replayed: such runs are
  counted (``unknown``) and left out of every figure, and the stored recipe's same runs too.

``--against`` (the shipped reference by default) gives the recipe before it on the same
cells, as recipe_panel.py counts it. This prices a recipe before a panel trains it; the
panel it picks is then trained and measured, not replayed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_panel  # noqa: E402

from synthbench.run.lr_selection import Budget, mark_selected, sweep_state  # noqa: E402
from synthbench.run.protocols import PROTOCOLS, Protocol  # noqa: E402
from synthbench.run.runner import stored_done  # noqa: E402
from synthbench.run.schema import lr_key  # noqa: E402
from synthbench.run.seeds import seeds_to_add, selected_row  # noqa: E402
from synthbench.run.train import Horizon, curve_point, start_curve  # noqa: E402

# fields a variant may set (each only ever stops a training sooner, or trains less)
VARIANT_FIELDS = {
    "lr_refine": int, "max_steps": int, "rise_margin": float, "pace_margin": float,
    "lr_extend": int, "lr_signal": float, "max_seeds": int, "seed_spread": float,
}  # fmt: skip


class Unknown(Exception):
    """The variant would train what the stored panel did not."""


def parse_variant(text: str, base: Protocol) -> tuple[str, Protocol]:
    """``NAME:FIELD=VALUE,...`` -> (NAME, the protocol with those fields)."""
    name, _, assignments = text.partition(":")
    changes = {}
    for item in filter(None, assignments.split(",")):
        field, _, value = item.partition("=")
        if field not in VARIANT_FIELDS:
            raise ValueError(f"variant {name!r}: {field!r} is not one of {sorted(VARIANT_FIELDS)}")
        try:
            changes[field] = VARIANT_FIELDS[field](value)
        except ValueError:
            kind = "an integer" if VARIANT_FIELDS[field] is int else "a number"
            raise ValueError(f"variant {name!r}: {field}={value!r} is not {kind}") from None
    variant = dataclasses.replace(base, **changes)  # the protocol's own checks
    if 0 < variant.max_seeds < base.seeds:
        raise ValueError(
            f"variant {name!r}: max_seeds ({variant.max_seeds}) is below the seed count "
            f"({base.seeds})"
        )
    if variant.max_steps > base.max_steps or variant.rise_margin < base.rise_margin:
        raise ValueError(f"variant {name!r} trains longer than the stored recipe: not replayable")
    return name, variant


def replay_training(stored: dict, protocol: Protocol, budget: Budget) -> dict:
    """``stored``'s row as the variant would have ended it (a copy; ``proxied`` where it is
    cut short of the stored training's end)."""
    curve = stored.get("curve_steps")
    if stored["status"] not in ("ok", "diverged") or curve is None or len(curve) == 0:
        return dict(stored, proxied=False)  # failed (a worker lost, say): as it was
    if protocol.select_metric != "token_acc":
        raise Unknown("a stored curve holds token accuracy only: no early stop on another metric")
    steps, values = list(stored["curve_steps"]), list(stored["curve_val_token_acc"])
    horizon = Horizon(protocol, budget)
    seen: dict = {}
    start_curve(seen)
    for at, value in zip(steps, values, strict=True):
        if at > horizon.last_step:
            break
        if at not in horizon.measure_at:
            raise Unknown(f"curve point {at} is not one of the variant's")
        points = len(seen["curve_steps"]) + 1
        if curve_point(seen, protocol, budget, at, {"token_acc": value}):  # solved, or paced
            return _cut(stored, at, points)
        if at == horizon.last_step and not horizon.extend(at, seen["curve_val_token_acc"]):
            return _cut(stored, at, points)
    if stored["status"] == "diverged":
        return dict(stored, proxied=False)  # it trains on to the same step, and diverges there
    raise Unknown("the variant trains past the stored training's end")


def _cut(stored: dict, at: int, points: int) -> dict:
    if stored["status"] == "ok" and at == int(stored["steps_done"]):
        return dict(stored, proxied=False)
    # a diverged training stopped before its divergence: ok where it stops
    row = dict(stored, steps_done=at, proxied=True, status="ok", error=None)
    row["curve_steps"] = list(stored["curve_steps"])[:points]
    row["curve_val_token_acc"] = list(stored["curve_val_token_acc"])[:points]
    row["val_token_acc"] = row["curve_val_token_acc"][-1]
    for metric in ("token_acc", "exact_match", "free_token_acc", "val_exact_match"):
        row[metric] = math.nan  # not measured where the variant stops
    row["token_acc"] = row["val_token_acc"]  # the score's stand-in (token_acc targets only)
    return row


def replay_run(stored: list[dict], protocol: Protocol) -> list[dict]:
    """The rows of one run under the variant: its sweep, from the protocol's grid."""
    by_lr = {lr_key(r["lr"]): r for r in stored}
    done: dict[float, dict] = {}
    while True:
        state = sweep_state(protocol, done.values())
        if state.complete:
            rows = list(done.values())
            mark_selected(protocol, rows)
            return rows
        for lr in state.pending:
            if lr not in by_lr:
                raise Unknown(f"lr {lr:g} was not trained")
            done[lr] = replay_training(by_lr[lr], protocol, state.budgets.get(lr, Budget()))


def replay(rows: pd.DataFrame, protocol: Protocol, base_seeds: int) -> tuple[pd.DataFrame, int]:
    """Every cell's runs under the variant: seeds below ``base_seeds``, and the ones the seed
    rule adds to them (synthbench/run/seeds.py ``seeds_to_add``). Returns (rows, unknown
    runs)."""
    out, unknown = [], 0
    for _, cell in rows.groupby(["task", "mechanism"], sort=True):
        runs = {seed: part.to_dict("records") for seed, part in cell.groupby("seed")}
        replayed = {seed: _or_unknown(runs.get(seed), protocol) for seed in range(base_seeds)}
        if all(r is not None for r in replayed.values()):
            selected = {seed: selected_row(protocol, r) for seed, r in replayed.items()}
            for seed in seeds_to_add(protocol, selected):
                replayed[seed] = _or_unknown(runs.get(seed), protocol)
        if any(r is None for r in replayed.values()):
            unknown += sum(r is None for r in replayed.values())
            continue  # a cell not wholly replayable is left out, as in the stored recipe
        for r in replayed.values():
            out.extend(r)
    return pd.DataFrame(out), unknown


def _or_unknown(stored: list[dict] | None, protocol: Protocol) -> list[dict] | None:
    if not stored:
        return None
    try:
        return replay_run(stored, protocol)
    except Unknown:
        return None


def figures(rows: pd.DataFrame, per_step: dict) -> dict:
    runs = recipe_panel.run_table(rows, per_step)
    result = recipe_panel.counts(runs)
    proxied = rows[rows["selected"].astype(bool)]["proxied"].fillna(False).astype(bool)
    result["proxied"] = int(proxied.sum())
    return result


def _complete(rows: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    """The rows of the runs `run` counts as done (a sweep still training replays as
    unknown)."""
    keep = [
        part for _, part in rows.groupby("run_id")
        if stored_done(protocol, part.to_dict("records"))
    ]  # fmt: skip
    return pd.concat(keep, ignore_index=True) if keep else rows.iloc[:0]


def _on(frame: pd.DataFrame, cells: set[tuple[str, str]]) -> pd.DataFrame:
    keys = zip(frame["task"], frame["mechanism"], strict=True)
    return frame[[key in cells for key in keys]]


COLUMNS = ("runs", "cells", "knife_edge", "learned_nothing", "undertrained", "bimodal",
           "proxied", "steps", "modelled_seconds", "cost_ratio")  # fmt: skip


def markdown(report: list[dict]) -> str:
    lines = [
        "| variant | unknown runs | recipe | "
        + " | ".join(COLUMNS)
        + " | pairs separated | of them, clean |",
        "|---|---:|---|" + "---:|" * len(COLUMNS) + "---|---|",
    ]
    for entry in report:
        for recipe, result in entry["figures"].items():
            values = " | ".join(str(result.get(key, "")) for key in COLUMNS)
            pairs, clean = (
                ", ".join(f"{t} {n}" for t, n in sorted(result[key].items()))
                for key in ("separated", "separated_clean")
            )
            lines.append(
                f"| {entry['variant']} | {entry['unknown_runs']} | {recipe} | {values} "
                f"| {pairs} | {clean} |"
            )
    return "\n".join(lines)


def compare(
    stored: pd.DataFrame, earlier: pd.DataFrame, protocol: Protocol, base: Protocol, per_step: dict
) -> dict:
    """A variant's figures beside the stored recipe's and each earlier version's, all on the
    cells the variant could replay whole; each cost as a ratio to the earliest version's."""
    rows, unknown = replay(stored, protocol, base.seeds)
    if rows.empty:  # no cell could be replayed whole: nothing to compare
        return {"unknown_runs": unknown, "figures": {}}
    cells = set(map(tuple, rows[["task", "mechanism"]].drop_duplicates().values))
    on = {
        "replayed": figures(rows, per_step),
        "stored": figures(_on(stored.assign(proxied=False), cells), per_step),
    }
    for version, part in sorted(_on(earlier, cells).groupby("version")):
        on[f"{base.name} v{version}"] = {**recipe_panel.counts(part), "proxied": 0}
    first = next((key for key in on if key.startswith(f"{base.name} v")), None)
    then = on[first]["modelled_seconds"] if first else None
    for result in on.values():
        cost = result["modelled_seconds"]
        result["cost_ratio"] = round(cost / then, 2) if cost and then else None
        result["separated"] = dict(result["separated"])
        result["separated_clean"] = dict(result["separated_clean"])
    return {"unknown_runs": unknown, "figures": on}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--protocol", default="quick")
    parser.add_argument("--against", type=Path, default=recipe_panel.DEFAULT_SOURCE)
    parser.add_argument("--step-costs", nargs="*", type=Path, default=[])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE,...")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    base = PROTOCOLS.get(args.protocol)
    try:
        variants = [parse_variant(text, base) for text in ["as stored:", *args.variant]]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for source in (args.results, args.against):
        if not source.exists():
            print(f"error: {source} does not exist", file=sys.stderr)
            return 2
    per_step = recipe_panel.step_costs(args.step_costs)
    stored = recipe_panel.panel_rows(recipe_panel.load(args.results))
    stored = stored[stored["protocol"].eq(base.name) & stored["protocol_version"].eq(base.version)]
    stored = _complete(stored, base)
    if stored.empty:
        print(f"error: {args.results}: no complete {base.name} v{base.version} run of the panel",
              file=sys.stderr)  # fmt: skip
        return 2
    earlier = recipe_panel.run_table(
        recipe_panel.panel_rows(recipe_panel.load(args.against)), per_step
    )
    earlier = earlier[earlier["protocol"].eq(base.name) & earlier["version"].lt(base.version)]
    report = [
        {"variant": name, **compare(stored, earlier, protocol, base, per_step)}
        for name, protocol in variants
    ]
    if args.markdown:
        print(markdown(report))
    else:
        for entry in report:
            print(json.dumps(entry, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
