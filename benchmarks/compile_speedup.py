"""A training step with torch.compile against the same step eager (`run --compile`).

    OMP_NUM_THREADS=1 python benchmarks/compile_speedup.py [--mechs softmax,gla] \\
        [--track core|block] [--task kv_recall] [--rounds 7] [--steps 5] [--trainings 0]

For each mechanism it builds the model of a quick training (``--track core``) or a
quick-block one (``--track block``) twice from the same seed, as step_speedup.py's ``Side``
does (the forward, the cross-entropy, the backward, the gradient norm and its clipping, fused
AdamW, the lr schedule; one torch thread), and compiles one of them in place
(``train.compile_in_place``, as a training under ``--compile`` is). It prints:

- ``compile s``: the seconds of the compiled side's first 3 steps, where it compiles (with
  inductor's on-disk cache as this machine has it: a first run pays more);
- ``loss diff``: the two sides' losses on the first batch, relative: the same function,
  rounded differently;
- the milliseconds of a step on each side, alternated (eager, compiled, eager, ...) for
  ``--rounds`` rounds of ``--steps`` steps, each side's median of this thread's CPU time, and
  eager / compiled.

With ``--trainings N`` it also times N whole trainings of each side at lr 1e-2 (quick's
schedule, evaluations and early stop included), alternated, after one compiled training
that warms the compiled graphs; each training's process CPU seconds and its steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_speedup import Side  # noqa: E402

from synthbench.run import train  # noqa: E402
from synthbench.run.protocols import protocol_of_track  # noqa: E402
from synthbench.run.spec import RunSpec  # noqa: E402

WARM_STEPS = 3


def ms_per_step(side: Side, steps: int) -> float:
    start = time.thread_time()
    for _ in range(steps):
        side.step()
    return (time.thread_time() - start) / steps * 1e3


def first_loss(side: Side) -> float:
    with torch.no_grad():
        return float(side.loss(side.batches[0]))


def training_seconds(spec: RunSpec) -> tuple[float, int]:
    start = time.process_time()
    row = train.train_eval(spec, 0.01, torch.device("cpu"))
    return time.process_time() - start, int(row["steps_done"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechs", default="softmax,linear,deltanet,gated-deltanet,mamba2,gla")
    parser.add_argument("--track", choices=("core", "block"), default="core")
    parser.add_argument("--task", default="kv_recall")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps per side and round")
    parser.add_argument("--trainings", type=int, default=0, help="whole trainings per side")
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol = protocol_of_track("quick", args.track)
    print(f"{args.track} track, {args.task}, one thread, medians of {args.rounds} rounds")
    print(f"{'mechanism':<16} {'compile s':>9} {'loss diff':>9} {'eager ms':>9} "
          f"{'compiled ms':>11} {'ratio':>6}")  # fmt: skip
    for mech in args.mechs.split(","):
        spec = RunSpec.resolve(args.task, mech, protocol, 0)
        eager, compiled = Side(spec, track=args.track), Side(spec, track=args.track)
        train.compile_in_place(compiled.model)
        diff = abs(first_loss(compiled) / first_loss(eager) - 1)
        start = time.perf_counter()
        for _ in range(WARM_STEPS):
            compiled.step()
        compile_seconds = time.perf_counter() - start
        for _ in range(WARM_STEPS):
            eager.step()
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(args.rounds):
            times["eager"].append(ms_per_step(eager, args.steps))
            times["compiled"].append(ms_per_step(compiled, args.steps))
        e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
        print(f"{mech:<16} {compile_seconds:>9.1f} {diff:>9.1e} {e:>9.1f} {c:>11.1f} "
              f"{e / c:>5.2f}x", flush=True)  # fmt: skip
        if args.trainings:
            compiled_spec = RunSpec.resolve(args.task, mech, protocol, 0, compiled=True)
            training_seconds(compiled_spec)  # its graphs compiled once, as a worker's first
            whole: dict[str, list[float]] = {"eager": [], "compiled": []}
            for _ in range(args.trainings):
                for name, run in (("eager", spec), ("compiled", compiled_spec)):
                    seconds, steps = training_seconds(run)
                    whole[name].append(seconds)
            e, c = statistics.median(whole["eager"]), statistics.median(whole["compiled"])
            print(f"{'':<16} whole trainings ({steps} steps): eager {e:.1f} s, compiled "
                  f"{c:.1f} s, {e / c:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
