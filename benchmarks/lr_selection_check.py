"""The pre-declared check of a cheaper learning-rate selection, replayed on the shipped
reference (synthbench/data/reference/quick.parquet: every lr each sweep trained, with its
learning curve), on the runs of one of its protocols (quick by default; the reference holds
both tracks, quick and quick-block).

    python benchmarks/lr_selection_check.py [--protocol quick] [--schemes seed0,...] [--out F.json]

A training's first k steps do not depend on how long it goes on (the lr schedule spans the
protocol's steps either way), so a scheme that stops trainings early can be replayed from the
stored curves: its selection, and what it would have cost (each row's seconds per step times
the steps the scheme trains). A scheme that needs a training the reference never ran (an lr
its sweep did not reach, or a stopped row carried further) cannot be replayed for that
(task, mechanism) pair: the pair is counted as unverifiable, never guessed.

The check, declared before any scheme was run against it (issue "Cost", part 2):

- per pair, every seed's new lr is the reference's, or one grid step away with its test score
  (the target metric) inside the spread of the reference's selected scores over the seeds;
  at least ``AGREEMENT`` of the pairs agree;
- the separations of the head-to-head table (synthbench/report/separation.py, target and
  curve area) are the reference's: none lost, none new;
- no pair unverifiable.

Schemes:

- ``reference``: the shipped selection (synthbench/run/lr_selection.py), replayed: it must
  give the stored selection back, which checks the replay itself;
- ``seed0``: seed 0 sweeps as the reference does; every other seed trains seed 0's lr only;
- ``halving:R:K``: successive halving per seed: every lr of the grid trains R steps (the grid
  grows past an edge as the reference's does, on the scores at R steps); the best K go on to
  the end, and the best of those is selected;
- ``seed0+halving:R:K``: halving on seed 0, its lr reused by the other seeds.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from synthbench.run.lr_selection import score, sweep_state
from synthbench.run.protocols import Protocol
from synthbench.run.schema import lr_key

REFERENCE = Path(__file__).resolve().parents[1] / "synthbench" / "data" / "reference"
AGREEMENT = 0.9
DEFAULT_SCHEMES = "reference,seed0,halving:200:2,halving:300:2,halving:300:1,seed0+halving:300:2"


class Unverifiable(Exception):
    """The scheme needs a training the reference did not run."""


@dataclass(frozen=True)
class Choice:
    lr: float  # the selected lr
    edge: bool  # alone at an edge of its grid
    seconds: float  # what the scheme's trainings of this run cost


def _solved(protocol: Protocol, row) -> bool:
    return bool(protocol.stop_at) and row[f"val_{protocol.select_metric}"] >= protocol.stop_at


def _complete(protocol: Protocol, row) -> bool:
    return row["steps_done"] >= protocol.steps or _solved(protocol, row)


def _per_step(row) -> float:
    return row["wall_seconds"] / max(1, row["steps_done"])


def full_sweep(protocol: Protocol, rows: dict[float, pd.Series]) -> Choice:
    state = sweep_state(protocol, [r.to_dict() for r in rows.values()])
    return Choice(state.selected, state.edge, sum(r["wall_seconds"] for r in rows.values()))


def _at(protocol: Protocol, row, rung: int) -> tuple[float, int]:
    """(score, steps) of ``row``'s training stopped at ``rung`` steps (earlier if solved)."""
    if _solved(protocol, row) and row["steps_done"] <= rung:
        return protocol.stop_at, int(row["steps_done"])
    steps = [int(s) for s in row["curve_steps"]]
    if rung not in steps:
        raise Unverifiable("the training stopped before the rung")
    value = float(row["curve_val_token_acc"][steps.index(rung)])
    return min(value, protocol.stop_at) if protocol.stop_at else value, rung


def halving(rung: int, keep: int) -> Callable[[Protocol, dict], Choice]:
    def select(protocol: Protocol, rows: dict[float, pd.Series]) -> Choice:
        grid, grown, short = sorted(lr_key(x) for x in protocol.lrs), 0, {}
        while True:
            for lr in grid:
                if lr not in short:
                    if lr not in rows:
                        raise Unverifiable("an lr the reference's sweep did not train")
                    short[lr] = _at(protocol, rows[lr], rung)
            best = max(value for value, _ in short.values())
            winners = [lr for lr in grid if short[lr][0] == best]
            alone = winners[0] if len(winners) == 1 else None
            if grown == protocol.lr_extend or alone not in (grid[0], grid[-1]):
                break
            if alone == grid[-1]:
                grid.append(lr_key(grid[-1] ** 2 / grid[-2]))
            else:
                grid.insert(0, lr_key(grid[0] ** 2 / grid[1]))
            grown += 1
        ranked = sorted(grid, key=lambda lr: (-short[lr][0], short[lr][1], lr))
        seconds, final = 0.0, {}
        for lr in grid:
            row, (value, steps) = rows[lr], short[lr]
            go_on = lr in ranked[:keep] and steps == rung and value < (protocol.stop_at or 2)
            if go_on:
                if not _complete(protocol, row):
                    raise Unverifiable("a training the reference stopped early goes on")
                seconds += row["wall_seconds"]
                final[lr] = (score(protocol, row.to_dict()), int(row["steps_done"]))
            else:
                seconds += _per_step(row) * steps
                if lr in ranked[:keep]:
                    final[lr] = (value, steps)
        chosen = min(final, key=lambda lr: (-final[lr][0], final[lr][1], lr))
        edge = chosen == alone and chosen in (grid[0], grid[-1])
        return Choice(chosen, edge, seconds)

    return select


def scheme(name: str) -> tuple[Callable[[Protocol, dict], Choice], bool]:
    """(selection of one seed's run, whether seeds > 0 reuse seed 0's lr)."""
    reuse = name.startswith("seed0")
    base = name.removeprefix("seed0").removeprefix("+")
    if base in ("", "reference"):
        return full_sweep, reuse
    if base.startswith("halving:"):
        _, rung, keep = base.split(":")
        return halving(int(rung), int(keep)), reuse
    raise SystemExit(f"unknown scheme {name!r}")


def of_protocol(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of protocol ``name`` (a reference file holds both tracks); none is an error."""
    mine = rows[rows["protocol"] == name]
    if mine.empty:
        held = ", ".join(sorted(set(rows["protocol"]))) or "none"
        raise SystemExit(f"error: the reference holds no {name!r} runs (it holds: {held})")
    return mine.reset_index(drop=True)


def stored_protocol(rows: pd.DataFrame) -> Protocol:
    """The protocol the rows were trained under, from their stored config (not today's); the
    rows must be of one protocol (``of_protocol``)."""
    (fields,) = {json.dumps(json.loads(c)["protocol"], sort_keys=True) for c in rows["config"]}
    fields = json.loads(fields)
    fields["lrs"], fields["betas"] = tuple(fields["lrs"]), tuple(fields["betas"])
    return Protocol(description="as stored", **fields)


def _target(row) -> float:
    return float(row[row["target_metric"]])


def replay(protocol: Protocol, rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """One record per (task, mechanism): the new choice per seed, or why it cannot be known."""
    select, reuse = scheme(name)
    lrs = sorted(rows["lr"].unique())
    records = []
    for (task, mech), pair in rows.groupby(["task", "mechanism"]):
        runs = {
            int(seed): {lr_key(r["lr"]): r for _, r in g.iterrows()}
            for seed, g in pair.groupby("seed")
        }
        record = {"task": task, "mechanism": mech, "unverifiable": None}
        try:
            new = {}
            for seed, run in runs.items():
                if reuse and seed != min(runs):
                    lr, edge = new[min(runs)].lr, new[min(runs)].edge
                    if lr not in run or not _complete(protocol, run[lr]):
                        raise Unverifiable("seed 0's lr was not trained on this seed")
                    new[seed] = Choice(lr, edge, run[lr]["wall_seconds"])
                else:
                    new[seed] = select(protocol, run)
        except Unverifiable as exc:
            records.append({**record, "unverifiable": str(exc)})
            continue
        reference = {seed: full_sweep(protocol, run) for seed, run in runs.items()}
        spent = sum(r["wall_seconds"] for run in runs.values() for r in run.values())
        scores = [_target(runs[s][c.lr]) for s, c in reference.items()]
        verdicts = []
        for seed, choice in new.items():
            was = reference[seed].lr
            inside = min(scores) - 1e-9 <= _target(runs[seed][choice.lr]) <= max(scores) + 1e-9
            near = abs(lrs.index(choice.lr) - lrs.index(was)) == 1
            verdicts.append("same" if choice.lr == was else "step" if near and inside else "no")
        records.append(
            {
                **record,
                "verdicts": verdicts,
                "agrees": "no" not in verdicts,
                "choices": {s: (c.lr, c.edge) for s, c in new.items()},
                "seconds": sum(c.seconds for c in new.values()),
                "reference_seconds": spent,
            }
        )
    return pd.DataFrame(records)


def reselected(rows: pd.DataFrame, replayed: pd.DataFrame) -> pd.DataFrame:
    """The reference's rows with each verifiable pair's new selection marked."""
    rows = rows.copy()
    for record in replayed[replayed["unverifiable"].isna()].itertuples():
        pair = (rows["task"] == record.task) & (rows["mechanism"] == record.mechanism)
        for seed, (lr, edge) in record.choices.items():
            run = pair & (rows["seed"] == seed)
            rows.loc[run, "selected"] = rows.loc[run, "lr"].map(lr_key) == lr
            rows.loc[run, "lr_edge"] = edge
    return rows


def separated(rows: pd.DataFrame) -> set[tuple]:
    from synthbench.report.separation import separation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = separation(rows).pairs
    pairs = pairs[pairs["separated"]]
    return set(
        zip(pairs["task"], pairs["a"], pairs["b"], pairs["measure"], pairs["ahead"], strict=True)
    )


def check(rows: pd.DataFrame, protocol: Protocol, name: str, before: set[tuple]) -> dict:
    replayed = replay(protocol, rows, name)
    known = replayed[replayed["unverifiable"].isna()]
    after = separated(reselected(rows, replayed))
    cost = {
        mech: float(part["seconds"].sum() / part["reference_seconds"].sum())
        for mech, part in known.groupby("mechanism")
    }
    result = {
        "scheme": name,
        "pairs": len(replayed),
        "unverifiable": int(replayed["unverifiable"].notna().sum()),
        "agreement": float(known["agrees"].mean()) if len(known) else None,
        "same_lr": float(known["verdicts"].map(lambda v: set(v) == {"same"}).mean()),
        "cost": cost,
        "cost_all": float(known["seconds"].sum() / known["reference_seconds"].sum()),
        "separations_lost": sorted(before - after),
        "separations_new": sorted(after - before),
    }
    result["passes"] = (
        result["unverifiable"] == 0
        and (result["agreement"] or 0) >= AGREEMENT
        and not result["separations_lost"]
        and not result["separations_new"]
    )
    return result


def line(result: dict) -> str:
    costs = " ".join(f"{m} {c:.2f}" for m, c in result["cost"].items())
    agreement = "-" if result["agreement"] is None else f"{result['agreement']:.2f}"
    return (
        f"{result['scheme']:<20} unverifiable {result['unverifiable']:>3}/{result['pairs']}  "
        f"agree {agreement}  same lr {result['same_lr']:.2f}  separations -"
        f"{len(result['separations_lost'])} +{len(result['separations_new'])}  "
        f"cost {result['cost_all']:.2f} ({costs})  {'PASS' if result['passes'] else 'fail'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", default="quick", help="whose runs to replay")
    parser.add_argument("--schemes", default=DEFAULT_SCHEMES)
    parser.add_argument("--reference", type=Path, default=REFERENCE / "quick.parquet")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = of_protocol(pd.read_parquet(args.reference), args.protocol)
    protocol = stored_protocol(rows)
    before = separated(rows)
    print(
        f"{args.reference.name}, {args.protocol} v{protocol.version}: "
        f"{rows['mechanism'].nunique()} mechanisms x "
        f"{rows['task'].nunique()} tasks x {rows['seed'].nunique()} seeds, {len(rows)} trainings; "
        f"{len(before)} separations; cost relative to the reference's seconds (verifiable pairs)"
    )
    results = []
    for name in args.schemes.split(","):
        results.append(check(rows, protocol, name, before))
        print(line(results[-1]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
