"""Paired step time of one mechanism in the core track and in the block track, task by task.

    OMP_NUM_THREADS=1 python benchmarks/track_step_cost.py --mech deltanet [--protocol quick]
        [--tasks copy,kv_recall] [--rounds 5] [--steps 8]

For each task at its default layout, the run's model is built as `synthbench run` builds it
(``build_model``) in the protocol (core) and in its block twin (``protocol_of_track``), and
each takes training steps on the protocol's batch: forward, cross-entropy on the answers,
backward, AdamW. The two alternate round by round in one process (A B A B ...), so that a
busy machine slows both alike; the figure per task is the median over the rounds of
seconds per step. The suite's ratio weighs each task by its steps in the stored core-track
rows of the mechanism where ``--rows`` holds them (a results tree: the steps its selected
runs trained), else every task alike. A step's time, not a whole run's: the block track may
stop earlier or later than the core track, which `benchmarks/suite_time.py --new-track
block` measures on whole runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from synthbench.core.task import IGNORE, TASKS, in_default_suite
from synthbench.run.protocols import protocol_of_track
from synthbench.run.spec import RunSpec
from synthbench.run.train import build_model


def step_seconds(spec: RunSpec, steps: int) -> float:
    """Seconds per training step of ``spec``'s model on its protocol's batch (after one
    step that warms up)."""
    torch.manual_seed(0)
    task = spec.make_task()
    model = build_model(spec, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = task.generate(spec.protocol.batch_size, torch.Generator().manual_seed(0))

    def step() -> None:
        logits = model(batch.inputs)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1), ignore_index=IGNORE
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def stored_steps(tree: str, protocol: str, mech: str) -> dict[str, float]:
    """Per task, the steps the mechanism's runs trained in ``tree`` (every lr row), or {}."""
    from synthbench.run.store import ResultStore

    rows = ResultStore(tree).load(warn=False).rows
    mine = rows[(rows["protocol"] == protocol) & (rows["mechanism"] == mech)]
    return mine.groupby("task")["steps_done"].sum().astype(float).to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mech", default="deltanet")
    parser.add_argument("--protocol", default="quick", help="the core-track protocol")
    parser.add_argument("--tasks", default="", help="comma-separated (default: every task)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rows", help="a results tree whose core-track rows weigh the tasks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    core = protocol_of_track(args.protocol, "core")
    block = protocol_of_track(args.protocol, "block")
    tasks = [t for t in args.tasks.split(",") if t] or sorted(
        e.name for e in TASKS.entries() if e.source == "builtin" and in_default_suite(e)
    )
    weights = stored_steps(args.rows, core.name, args.mech) if args.rows else {}
    totals = {"core": 0.0, "block": 0.0}
    print(f"{args.mech}: {core.name} (core) against {block.name} (block), ms per step")
    for task in tasks:
        specs = {
            "core": RunSpec.resolve(task, args.mech, core, 0),
            "block": RunSpec.resolve(task, args.mech, block, 0),
        }
        times: dict[str, list[float]] = {"core": [], "block": []}
        for i in range(args.rounds):
            for track in ("core", "block") if i % 2 == 0 else ("block", "core"):
                times[track].append(step_seconds(specs[track], args.steps))
        medians = {track: statistics.median(v) for track, v in times.items()}
        weight = weights.get(task, 1.0)
        for track in totals:
            totals[track] += weight * medians[track]
        ratio = medians["block"] / medians["core"]
        print(
            f"{task:16s} core {medians['core'] * 1e3:7.1f}  block {medians['block'] * 1e3:7.1f}"
            f"  x{ratio:.2f}" + (f"  ({weight:.0f} steps stored)" if weights else "")
        )
    how = "weighted by the stored core-track steps" if weights else "every task alike"
    ratio = totals["block"] / totals["core"]
    print(f"suite ({len(tasks)} tasks, {how}): block / core x{ratio:.2f}")


if __name__ == "__main__":
    main()
