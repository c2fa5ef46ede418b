"""Paired wall time of the main job (`synthbench run`: softmax, quick, 3 seeds) under two
installs of synthbench, or in the two tracks of one install, task by task.

    python benchmarks/suite_time.py --base /path/to/old/bin/synthbench \\
        --new /path/to/new/bin/synthbench --out /somewhere/outside/the/tree [--tasks copy,sort]
    python benchmarks/suite_time.py --base synthbench --new synthbench --new-track block \\
        --mech deltanet --seeds 1 --out /somewhere/outside/the/tree

``--base-track`` and ``--new-track`` run a side in that track (``synthbench run --track``):
the block track's cost beside the core track's.

For each task the two installs run the same command back to back, one training at a time on
one thread (so that a busy machine slows both alike), the side that goes first alternating
by task. Each leg writes its results under ``--out`` and its time to ``--out/times.jsonl``;
a leg already timed there is kept, so a killed measurement resumes. Prints each task's two
times and their ratio, and the totals over the tasks both sides have.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path


def timed_leg(exe: str, task: str, mech: str, results: Path, options: list[str]) -> float:
    shutil.rmtree(results, ignore_errors=True)
    start = time.perf_counter()
    command = [exe, "run", "--task", task, "--mech", mech, "--jobs", "1", "--threads", "1"]
    command += options
    done = subprocess.run([*command, "--results", str(results)], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SystemExit(f"error: {exe} run --task {task} exited {done.returncode}: {last}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the baseline's synthbench executable")
    parser.add_argument("--new", required=True, help="the candidate's synthbench executable")
    parser.add_argument("--out", required=True, type=Path, help="results and times (resumed)")
    parser.add_argument("--tasks", default="", help="comma-separated (default: every task)")
    parser.add_argument("--mech", default="softmax")
    parser.add_argument("--seeds", type=int, help="seeds 0..N-1 (default: the protocol's)")
    for side in ("base", "new"):
        parser.add_argument(f"--{side}-track", choices=("core", "block"), default="core")
    args = parser.parse_args()
    options = {side: ["--track", getattr(args, f"{side}_track")] for side in ("base", "new")}
    for side in options:
        options[side] += ["--seeds", str(args.seeds)] if args.seeds else []
    for exe in (args.base, args.new):
        if not shutil.which(exe):
            raise SystemExit(f"error: {exe} is not an executable (give the path of a synthbench)")
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks:
        listing = subprocess.run([args.new, "list", "tasks", "--json"], capture_output=True)
        if listing.returncode:
            raise SystemExit(f"error: {args.new} list tasks --json exited {listing.returncode}")
        tasks = [entry["name"] for entry in json.loads(listing.stdout)]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "times.jsonl"
    times = {}
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line)
            times[row["side"], row["task"]] = row["seconds"]
    for i, task in enumerate(tasks):
        for side in ("base", "new") if i % 2 == 0 else ("new", "base"):
            if (side, task) in times:
                continue
            results = args.out / f"{side}-{task}"
            seconds = timed_leg(getattr(args, side), task, args.mech, results, options[side])
            times[side, task] = seconds
            with log.open("a") as f:
                f.write(json.dumps({"side": side, "task": task, "seconds": seconds}) + "\n")
    total = {"base": 0.0, "new": 0.0}
    for task in tasks:
        base, new = times[("base", task)], times[("new", task)]
        total["base"] += base
        total["new"] += new
        print(f"{task:16s} base {base:8.1f} s  new {new:8.1f} s  x{new / base:.2f}")
    print(
        f"total ({len(tasks)} tasks): base {total['base']:.0f} s, new {total['new']:.0f} s, "
        f"x{total['new'] / total['base']:.2f}"
    )


if __name__ == "__main__":
    main()
