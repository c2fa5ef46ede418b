"""Which half of a seed decides a bimodal cell: the model's initialisation or the data's order;
and whether a longer budget decides it instead.

    python benchmarks/init_or_data.py --task induction --mech mamba2 --lr 0.01 \
        --seeds 0 1 [--protocol quick] [--diagonal] [--schedule STEPS]
    python benchmarks/init_or_data.py --task induction --mech mamba2 --lr 0.01 \
        --self 1 2 4 --schedule 3000

A run's seed draws both its model's initial weights and its training batches
(synthbench/run/train.py: ``seeded_model``, ``training_generator``). Where one seed learns a
task and another does not, this trains the two crossed pairings at one lr, each as `run`
trains a training (the protocol's whole recipe: early stop, extensions): the first seed's
model on the second seed's batches, and the second's model on the first's. If the outcome
follows the model, the initialisation decides; if it follows the batches, the data order
does. ``--diagonal`` trains the two seeds as themselves as well (what the stored runs of that
lr hold), to check the pairing against them. One JSON line per training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from unittest import mock

import torch

from synthbench.run import train
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec


def crossed(
    task: str,
    mech: str,
    lr: float,
    init_seed: int,
    data_seed: int,
    protocol: str,
    schedule: int | None = None,
):
    """One training: the model of ``init_seed``, the batches of ``data_seed``; with
    ``schedule``, under a schedule of that many steps from the first."""
    recipe = PROTOCOLS.get(protocol)
    if schedule is not None:
        recipe = dataclasses.replace(recipe, steps=schedule, max_steps=schedule)
    spec = RunSpec.resolve(task, mech, recipe, init_seed)

    def batches(_spec):
        return torch.Generator().manual_seed(data_seed)

    with torch.random.fork_rng(), mock.patch.object(train, "training_generator", batches):
        return train.train_eval(spec, lr, torch.device("cpu"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--mech", required=True)
    parser.add_argument("--lr", type=float, required=True)
    seeds = parser.add_mutually_exclusive_group(required=True)
    seeds.add_argument("--seeds", type=int, nargs=2, metavar=("A", "B"))
    seeds.add_argument("--self", type=int, nargs="+", metavar="S", dest="alone")
    parser.add_argument("--protocol", default="quick")
    parser.add_argument("--diagonal", action="store_true")
    parser.add_argument("--schedule", type=int, metavar="STEPS")
    args = parser.parse_args(argv)
    if not 0 < args.lr < float("inf"):
        print(f"error: --lr must be a positive number, got {args.lr}", file=sys.stderr)
        return 2
    if args.schedule is not None and args.schedule < 1:
        print(f"error: --schedule must be a positive number of steps, got {args.schedule}",
              file=sys.stderr)  # fmt: skip
        return 2
    torch.set_num_threads(1)
    if args.alone:
        pairs = [(seed, seed) for seed in args.alone]
    else:
        a, b = args.seeds
        pairs = [(a, b), (b, a)] + ([(a, a), (b, b)] if args.diagonal else [])
    for init_seed, data_seed in pairs:
        try:
            row = crossed(
                args.task, args.mech, args.lr, init_seed, data_seed, args.protocol, args.schedule
            )
        except (KeyError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        keys = ("status", "steps_done", "val_token_acc", "token_acc", "error")
        curve = [round(value, 4) for value in row["curve_val_token_acc"] or []]
        print(json.dumps({"init_seed": init_seed, "data_seed": data_seed,
                          **{k: row[k] for k in keys}, "curve": curve}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
