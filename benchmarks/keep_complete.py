"""Copy the runs of a results tree that are done, and only those: what ``synthbench run``
would leave alone (synthbench/run/runner.py's ``stored_done``: the lr sweep complete, no lr
stored as an error, the selected lr marked).

    python benchmarks/keep_complete.py SRC --into DIR    # into another results tree
    python benchmarks/keep_complete.py SRC --tar FILE    # into one archive (a GPU lease)
    python benchmarks/keep_complete.py SRC --tar FILE --except SEED   # only what SEED lacks

A half-trained run, or one with an lr that raised, stays behind: it is not a result yet, and
the device that began it finishes it. A file that DIR already holds is never overwritten, so
two devices or two sessions never share a run. This is how the reference rebuild (issue 35)
survives a lost machine: the rows kept outside the work tree are copied into
benchmarks/runs/rebuild, which is committed, during and at the end of each session
(benchmarks/runs/README.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tarfile
from pathlib import Path

from synthbench.run.protocols import Protocol
from synthbench.run.runner import stored_done
from synthbench.run.store import ResultStore


def complete_runs(root: Path) -> tuple[list[tuple[str, str, Path]], int]:
    """(protocol, mechanism, file) of every done run under root, and how many runs began."""
    store = ResultStore(root)
    rows = store.load(warn=False).rows if root.is_dir() else None
    if rows is None or rows.empty:
        return [], 0
    complete = []
    for run_id, run in rows.groupby("run_id", sort=True):
        protocol, task, mech = run.iloc[0][["protocol", "task", "mechanism"]]
        # judged by the recipe it was trained under (a run of an older version is done by
        # that version's sweep, not today's)
        trained = Protocol.from_config(json.loads(run.iloc[0]["config"])["protocol"])
        if stored_done(trained, run.to_dict("records")):
            complete.append((protocol, mech, store.file_of(protocol, task, mech, run_id)))
    return complete, rows["run_id"].nunique()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="results tree to read")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--into", type=Path, help="results tree to copy into (never overwritten)")
    target.add_argument("--tar", type=Path, help="archive to write")
    parser.add_argument(
        "--except", dest="held", type=Path, help="leave out the runs this tree already holds"
    )
    args = parser.parse_args(argv)
    runs, started = complete_runs(args.src)
    if not runs:
        print(f"keep_complete: no complete run in {args.src}", file=sys.stderr)
        return 1
    copied = collections.Counter()
    tar = tarfile.open(args.tar, "w") if args.tar else None
    try:
        for protocol, mech, path in runs:
            relative = path.relative_to(args.src)
            if args.held is not None and (args.held / relative).exists():
                continue
            if tar is not None:
                tar.add(path, arcname=str(relative))
            else:
                target = args.into / relative
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
            copied[protocol, mech] += 1
    except OSError as error:
        print(f"keep_complete: {error}", file=sys.stderr)
        return 1
    finally:
        if tar is not None:
            tar.close()
    for (protocol, mech), n in sorted(copied.items()):
        print(f"{protocol:<12} {mech:<16} {n} complete runs")
    print(
        f"{len(runs)} complete of {started} runs started; {copied.total()} new in "
        f"{args.tar or args.into}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
