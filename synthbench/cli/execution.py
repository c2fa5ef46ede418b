"""The options of how `run`, `sweep` and `facts run` execute their trainings (where, how
many at once, how each trains), shared so that each says the same."""

from __future__ import annotations

from typing import Annotated

import typer

from synthbench.run.limits import MAX_RUNS

JobsOption = Annotated[
    int | None,
    typer.Option(
        help="Trainings at once. Local: worker processes (default: one per core on the CPU, "
        "up to 4 per GPU); 1 trains in this process. Ray: at most this many tasks."
    ),
]
ThreadsOption = Annotated[
    int,
    typer.Option(
        help="Torch threads per training (part of the run's config: it changes "
        "the floating-point sums)."
    ),
]
ExecutorOption = Annotated[str, typer.Option(help="local (this machine) or ray (a Ray cluster).")]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        help="Join this Ray cluster (e.g. ray://head:10001, auto); default: a local Ray instance."
    ),
]
CpusPerRunOption = Annotated[
    float | None, typer.Option(help="Ray: CPUs a training asks for (default: --threads).")
]
GpusPerRunOption = Annotated[
    float, typer.Option(help="Ray: GPUs a training asks for (a fraction shares one).")
]
PackOption = Annotated[
    int | None,
    typer.Option(
        help="Train up to N trainings of one task and mechanism (its seeds and lrs) as one "
        "batched model; 1: never. Default: 16 on a GPU, 1 on the CPU (measured slower "
        "there: docs/BENCHMARKS.md)."
    ),
]
CompileOption = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Train with torch.compile: faster steps once compiled (measured: docs/BENCHMARKS.md), "
        "the same function rounded differently, so the same run id; each row says which. "
        "One training at a time (no --pack).",
    ),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Run again even if already stored.")]
YesOption = Annotated[
    bool,
    typer.Option("--yes", help=f"Plan a grid of more than {MAX_RUNS:,} runs (refused without)."),
]
MaxSecondsOption = Annotated[
    float | None,
    typer.Option(
        help="Stop a training still running after this many seconds and store it as an "
        "error naming where it was (it reruns next time); trains in a worker process even "
        "with --jobs 1. Default: no limit.",
        show_default=False,
    ),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan and its estimated cost, then stop: nothing is trained or written.",
    ),
]
