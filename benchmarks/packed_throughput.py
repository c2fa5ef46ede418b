"""Runs per hour of packed training (synthbench/run/packed.py) against one training at a time.

    OMP_NUM_THREADS=1 python benchmarks/packed_throughput.py --protocol quick \\
        --tasks copy,kv_recall --mechs softmax,mamba2 --members 6 --steps 50 --repeats 3 \\
        --out /somewhere/packed.json

For each (task, mechanism), ``--members`` trainings of one run (seeds 0, 1, ... crossed with
the protocol's lrs, lr fastest) train twice: packed, ``train_packed``, and unpacked, one
``train_eval`` after the other. Each time in a fresh process, so that its peak resident set
(``ru_maxrss``; on a GPU also ``torch.cuda.max_memory_allocated``) is its own, and the two
alternate, A B A B, ``--repeats`` times, so that a drift of the machine falls on both.

Only a prefix of ``--steps`` steps is trained (a step budget: the lr schedule is the whole
protocol's) and the whole schedule predicted from the phase timer (synthbench/run/phases.py):
the measured time, plus the remaining steps at the measured seconds per step (batches and
steps), plus the remaining curve points at the measured seconds per point. The prediction
is of the whole schedule, early stops off (``stop_at`` 0 while measuring: a training that
solves its task sooner stops sooner either way). Runs per hour = members x 3600 / predicted
seconds; the ratio is packed over unpacked, of the medians. The step ratio compares the
training steps alone (a step of every member, unpacked seconds over packed): what packing
changes, without the evaluations after training, which are the same either way (and, after
a short prefix, those of barely trained models: free-running generation then costs a pass
per wrong answer). ``--threads`` is 1 unless given, as the project measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

MODES = ("packed", "unpacked")
ROOT = Path(__file__).resolve().parents[1]  # the tree measured, whatever is installed
sys.path.insert(0, str(ROOT))


def members_of(args: argparse.Namespace, protocol) -> list[tuple[int, float]]:
    """(seed, lr) of each member: seeds 0, 1, ... crossed with the protocol's lrs."""
    lrs = list(protocol.lrs)
    return [(i // len(lrs), lrs[i % len(lrs)]) for i in range(args.members)]


def worker(args: argparse.Namespace) -> dict:
    """One mode, one (task, mechanism), in this fresh process: its figures."""
    import torch

    from synthbench.run import phases
    from synthbench.run.devices import resolve_device
    from synthbench.run.lr_selection import Budget
    from synthbench.run.packed import NotPacked, train_packed
    from synthbench.run.protocols import PROTOCOLS, curve_points
    from synthbench.run.spec import RunSpec
    from synthbench.run.train import measured_steps, train_eval

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    protocol = dataclasses.replace(PROTOCOLS.get(args.protocol), stop_at=0.0)
    steps = min(args.steps, protocol.steps)
    members = [
        (RunSpec.resolve(args.task, args.mech, protocol, seed, threads=args.threads), lr)
        for seed, lr in members_of(args, protocol)
    ]
    budgets = [Budget(steps=steps)] * len(members)
    os.environ[phases.ENV] = "measuring"  # the timer on; nothing written (unset below)
    notes: list[str] = []
    start = time.perf_counter()
    if args.worker == "packed":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = train_packed(members, device, budgets)
        notes = [str(w.message) for w in caught if issubclass(w.category, NotPacked)]
    else:
        rows = [
            train_eval(spec, lr, device, budget)
            for (spec, lr), budget in zip(members, budgets, strict=True)
        ]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    measured = time.perf_counter() - start
    os.environ.pop(phases.ENV)
    seconds = dict(phases._seconds)
    per_step = (seconds.get("training batches", 0) + seconds.get("training steps", 0)) / steps
    points_measured = len(measured_steps(protocol, steps))
    per_point = seconds.get("curve points", 0) / points_measured
    predicted = (
        measured
        + per_step * (protocol.steps - steps)
        + per_point * (len(curve_points(protocol.steps)) - points_measured)
    )
    return {
        "mode": args.worker,
        "measured_seconds": measured,
        "predicted_seconds": predicted,
        "seconds_per_step": per_step,  # all members' batches and steps
        "phase_seconds": seconds,
        "statuses": [r["status"] for r in rows],
        "errors": sorted({r["error"] for r in rows if r["error"]}),
        "notes": notes,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_max_allocated_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "device": str(device),
    }


def run_worker(args: argparse.Namespace, mode: str, task: str, mech: str) -> dict:
    command = [sys.executable, __file__, "--worker", mode, "--task", task, "--mech", mech,
               "--protocol", args.protocol, "--members", str(args.members),
               "--steps", str(args.steps), "--device", args.device,
               "--threads", str(args.threads)]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": path}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"{mode} {task}/{mech} failed (exit {done.returncode}): {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="quick")
    parser.add_argument("--tasks", default="copy")
    parser.add_argument("--mechs", default="softmax")
    parser.add_argument("--members", type=int, default=6, help="trainings packed: seeds x lrs")
    parser.add_argument("--steps", type=int, default=50, help="the measured prefix")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--mech", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.members < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--members, --steps and --repeats must be >= 1")
    if args.worker:
        print(json.dumps(worker(args)))
        return

    from synthbench.run.devices import resolve_device

    args.device = str(resolve_device(args.device))
    cases = []
    print(f"{args.protocol}, {args.members} members, {args.steps} measured steps, "
          f"{args.repeats} repeats, {args.device}, {args.threads} thread(s)")  # fmt: skip
    header = ("task", "mechanism", "packed s", "unpacked s", "runs/h packed", "runs/h unpacked",
              "ratio", "step ratio", "RSS MiB packed", "RSS MiB unpacked")  # fmt: skip
    print("{:<14}{:<16}{:>10}{:>12}{:>15}{:>17}{:>7}{:>12}{:>16}{:>18}".format(*header))
    for task in args.tasks.split(","):
        for mech in args.mechs.split(","):
            figures: dict[str, list[dict]] = {mode: [] for mode in MODES}
            for _ in range(args.repeats):  # A B A B
                for mode in MODES:
                    figures[mode].append(run_worker(args, mode, task, mech))
            case = {"task": task, "mechanism": mech}
            for mode in MODES:
                predicted = [f["predicted_seconds"] for f in figures[mode]]
                case[f"{mode}_seconds"] = predicted
                case[f"{mode}_measured_seconds"] = [f["measured_seconds"] for f in figures[mode]]
                case[f"{mode}_runs_per_hour"] = args.members * 3600 / statistics.median(predicted)
                case[f"{mode}_peak_rss_mib"] = max(f["peak_rss_mib"] for f in figures[mode])
                cuda = [f["cuda_max_allocated_mib"] for f in figures[mode]]
                case[f"{mode}_cuda_max_allocated_mib"] = None if None in cuda else max(cuda)
                case[f"{mode}_statuses"] = figures[mode][0]["statuses"]
            notes = figures["packed"][0]["notes"]
            case["packed"] = not notes
            case["note"] = notes[0] if notes else None
            case["ratio"] = case["packed_runs_per_hour"] / case["unpacked_runs_per_hour"]
            per_step = {
                mode: statistics.median(f["seconds_per_step"] for f in figures[mode])
                for mode in MODES
            }
            case["seconds_per_step"] = per_step  # a step of every member
            case["step_ratio"] = per_step["unpacked"] / per_step["packed"]
            case["phase_seconds"] = {mode: figures[mode][0]["phase_seconds"] for mode in MODES}
            cases.append(case)
            print(f"{task:<14}{mech:<16}{statistics.median(case['packed_seconds']):>10.1f}"
                  f"{statistics.median(case['unpacked_seconds']):>12.1f}"
                  f"{case['packed_runs_per_hour']:>15.0f}{case['unpacked_runs_per_hour']:>17.0f}"
                  f"{case['ratio']:>7.2f}{case['step_ratio']:>12.2f}"
                  f"{case['packed_peak_rss_mib']:>16.0f}"
                  f"{case['unpacked_peak_rss_mib']:>18.0f}")  # fmt: skip
            if notes:
                print(f"  {notes[0]}")
    # the runs per hour of the whole list: members x cases over the summed median seconds
    total = {
        mode: len(cases)
        * args.members
        * 3600
        / sum(statistics.median(c[f"{mode}_seconds"]) for c in cases)
        for mode in MODES
    }
    print(f"all cases: {total['packed']:.0f} runs/h packed, {total['unpacked']:.0f} unpacked, "
          f"ratio {total['packed'] / total['unpacked']:.2f}")  # fmt: skip
    report = {
        "protocol": args.protocol, "members": args.members, "steps": args.steps,
        "repeats": args.repeats, "device": args.device, "threads": args.threads,
        "platform": platform.platform(), "cases": cases,
        "runs_per_hour": total, "ratio": total["packed"] / total["unpacked"],
        "peak_rss_mib": {mode: max(c[f"{mode}_peak_rss_mib"] for c in cases) for mode in MODES},
    }  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
