"""Seeds an lr sweep left at chance while another seed of the same cell learned elsewhere.

With two lrs in the grid (quick: 3e-3 and 1e-2), the best of a sweep always sits at an edge,
and the grid grows past it. When every lr scores at chance, which edge is "best" is noise,
so the grid can grow away from the lr where the task is learnt. This lists, per (protocol,
mechanism, task) with at least two seeds, each seed whose selected validation token accuracy
is within MARGIN of chance while another seed's selected lr, one its own sweep never
trained, scores at least GAP more. A measurement of the sweep rule on stored rows
(docs/PROTOCOLS.md, "A sweep at chance grows by noise"), not a check that fails.

    python benchmarks/stranded_seeds.py [RESULTS] [--margin 0.02] [--gap 0.15]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from synthbench.run.schema import lr_key
from synthbench.run.store import ResultStore

DEFAULT_ROOT = Path(__file__).parent / "runs" / "rebuild"


def at_chance(rows: pd.DataFrame, margin: float) -> pd.Series:
    """Whether each row's validation token accuracy is within ``margin`` of its chance."""
    return rows["val_token_acc"] <= rows["chance_token_acc"] + margin


def stranded(rows: pd.DataFrame, margin: float, gap: float) -> pd.DataFrame:
    """One line per stranded seed: its score and lrs, and the best of the seeds that did
    better at an lr it never trained."""
    found = []
    ok = rows[rows["status"] == "ok"]
    for (protocol, mech, task), cell in ok.groupby(["protocol", "mechanism", "task"]):
        chosen = cell[cell["selected"]].set_index("seed")
        if len(chosen) < 2:
            continue
        for seed, row in chosen[at_chance(chosen, margin)].iterrows():
            tried = {lr_key(lr) for lr in cell.loc[cell["seed"] == seed, "lr"]}
            better = chosen[
                (chosen["val_token_acc"] - row["val_token_acc"] >= gap)
                & ~chosen["lr"].map(lr_key).isin(tried)
            ]
            if len(better):
                best_seed = better["val_token_acc"].idxmax()
                best = better.loc[best_seed]
                found.append(
                    {
                        "protocol": protocol,
                        "mechanism": mech,
                        "task": task,
                        "seed": seed,
                        "val_token_acc": row["val_token_acc"],
                        "lrs_tried": " ".join(f"{lr:.3g}" for lr in sorted(tried)),
                        "better_seed": best_seed,
                        "its_lr": f"{best['lr']:.3g}",
                        "its_val_token_acc": best["val_token_acc"],
                    }
                )
    return pd.DataFrame(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--margin", type=float, default=0.02, help="above chance, still chance")
    parser.add_argument("--gap", type=float, default=0.15, help="how much better the best seed")
    args = parser.parse_args()
    rows = ResultStore(args.results).load().rows
    selected = rows[rows["selected"]]
    table = stranded(rows, args.margin, args.gap)
    n_at_chance = int(at_chance(selected, args.margin).sum())
    print(f"{len(selected)} selected runs in {args.results}; {n_at_chance} at chance")
    print(f"{len(table)} stranded: at chance where another seed's lr, never tried, did better")
    if len(table):
        print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
