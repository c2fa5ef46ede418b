"""Where the time of a ``synthbench run`` goes: process start, planning, the leak guard, model
builds, data, training steps, curve points, the checks and evaluation after training, and
writing.

    python benchmarks/cost_breakdown.py --protocol slay-paper --tasks all \\
        --mechs softmax,slay --jobs 1 --out /somewhere/outside/the/tree

Runs the command once, into a fresh results folder under ``--out``, with
``SYNTHBENCH_PHASES`` set (synthbench/run/phases.py): every process of the command writes the
seconds of each phase it timed. Prints the command's wall time and each phase's seconds,
summed over the processes (with ``--jobs 2`` two workers train at once, so the sums can
exceed the wall time), and the share of the whole that is not a training step: the overhead.
``--threads`` is 1 unless given, as the project measures. Writes the figures to
OUT/breakdown.json too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from synthbench.run.phases import ENV
from synthbench.run.store import ResultStore

TRAINING_STEPS = "training steps"  # the compute a verdict needs; everything else is overhead
ORDER = (
    "process start and imports", "planning", "leak guard", "model build", "evaluation data",
    "training batches", TRAINING_STEPS, "curve points", "causality after training",
    "test evaluation", "chance", "writing", "driver, other",
)  # fmt: skip


def run_command(args: argparse.Namespace, out: Path) -> tuple[float, int, list[dict]]:
    """Run the command once; its wall seconds, the driver's pid and every process's record."""
    results, phase_dir = out / "results", out / "phases"
    for folder in (results, phase_dir):
        shutil.rmtree(folder, ignore_errors=True)
    exe = shutil.which("synthbench") or sys.exit("synthbench is not installed")
    command = [exe, "run", "--task", args.tasks, "--mech", args.mechs, "--protocol",
               args.protocol, "--jobs", str(args.jobs), "--threads", str(args.threads),
               "--results", str(results)]  # fmt: skip
    if args.seeds:
        command += ["--seeds", str(args.seeds)]
    env = {**os.environ, ENV: str(phase_dir), "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = process.communicate()
    wall = time.perf_counter() - start
    if process.returncode:
        sys.exit(f"the run failed (exit {process.returncode}): {err.decode().strip()[-500:]}")
    records = [json.loads(path.read_text()) for path in sorted(phase_dir.glob("*.json"))]
    return wall, process.pid, records


def breakdown(wall: float, driver_pid: int, records: list[dict]) -> dict[str, float]:
    """Seconds per phase, summed over the processes, with the driver's untimed time split
    into its start (before synthbench's run modules were imported) and the rest."""
    seconds: dict[str, float] = {}
    for record in records:
        for name, value in record["seconds"].items():
            seconds[name] = seconds.get(name, 0.0) + value
    driver = next(r for r in records if r["pid"] == driver_pid)
    seconds["process start and imports"] = wall - driver["timed_from_import"]
    driver_timed = sum(driver["seconds"].values())
    seconds["driver, other"] = driver["timed_from_import"] - driver_timed
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="slay-paper")
    parser.add_argument("--tasks", default="all")
    parser.add_argument("--mechs", default="softmax,slay")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wall, pid, records = run_command(args, args.out)
    seconds = breakdown(wall, pid, records)
    rows = ResultStore(args.out / "results").load(["wall_seconds"]).rows
    trainings = len(rows)
    total = sum(seconds.values())
    print(f"synthbench run --task {args.tasks} --mech {args.mechs} --protocol {args.protocol} "
          f"--jobs {args.jobs} --threads {args.threads}: {wall:.1f} s wall, {trainings} "
          f"trainings, rows' wall_seconds {rows['wall_seconds'].sum():.1f} s")  # fmt: skip
    print(f"{'phase':<28}{'seconds':>10}{'share':>8}")
    for name in [*ORDER, *sorted(set(seconds) - set(ORDER))]:
        if name in seconds:
            print(f"{name:<28}{seconds[name]:>10.1f}{seconds[name] / total:>8.1%}")
    steps = seconds.get(TRAINING_STEPS, 0.0)
    overhead = 1 - steps / total
    print(f"{'overhead (all but steps)':<28}{total - steps:>10.1f}{overhead:>8.1%}")
    report = {"command": vars(args) | {"out": str(args.out)}, "wall_seconds": wall,
              "trainings": trainings, "rows_wall_seconds": float(rows["wall_seconds"].sum()),
              "seconds": seconds, "overhead_share": overhead}  # fmt: skip
    (args.out / "breakdown.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
