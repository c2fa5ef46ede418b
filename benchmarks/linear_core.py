"""Speed and memory of the shared causal linear-attention core against non-causal linear
attention on the same shapes.

    python benchmarks/linear_core.py [--lengths 1024 2048 ...] [--device cpu|cuda]

For each length L (default 1K, 2K, ..., 64K): batch 1, 8 heads, head_dim 32, 256 features,
float32, positive random features. It times forward + backward (of the sum of the output)
of ``linear_attention(..., causal=True)`` (the chunked core) and of
``linear_attention(..., causal=False)`` (two matrix products, the floor for any linear
attention), and prints their ratio and the peak memory of each above its inputs.

Timing: the two modes alternate on the same inputs in one process (after a warm-up of
each), so that a busy machine slows both alike; the median of ``--repeats`` is reported.

Peak memory (``synthbench.bench.memory.peak_bytes``, shared with ``synthbench bench
scaling``): on CUDA ``torch.cuda.max_memory_allocated`` above what was allocated before the
call. On CPU torch keeps no allocator statistics, so every (length, mode) runs once in a
fresh Python process (no memory cached by earlier measurements) that reports how far its
resident set size peaks above its level just before one forward + backward, after a small
warm-up call and the creation of the inputs. On Linux the peak (VmHWM) is reset at that
point through /proc/self/clear_refs; elsewhere ``resource.getrusage(...).ru_maxrss`` stands
in, which also counts earlier peaks. Large tensors are mmap-ed by the C allocator and
returned when freed, so this tracks the tensors' peak closely (a few MB of noise at the
shortest lengths).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from synthbench.bench.memory import peak_bytes  # noqa: E402
from synthbench.core.linear_attention import STRATEGIES, linear_attention  # noqa: E402

BATCH, HEADS, HEAD_DIM, FEATURES = 1, 8, 32, 256
DEFAULT_LENGTHS = [1024 * 2**i for i in range(7)]  # 1K ... 64K
MODES = ("causal", "noncausal")


def make_inputs(length: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    shape = (BATCH, HEADS, length)
    phi_q = torch.rand(*shape, FEATURES, generator=g, device=device)
    phi_k = torch.rand(*shape, FEATURES, generator=g, device=device)
    v = torch.randn(*shape, HEAD_DIM, generator=g, device=device)
    return [t.requires_grad_(True) for t in (phi_q, phi_k, v)]


def step(inputs: list[torch.Tensor], mode: str, args: argparse.Namespace) -> None:
    """One forward + backward."""
    out = linear_attention(
        *inputs, causal=mode == "causal", chunk_size=args.chunk_size, strategy=args.strategy
    )
    out.sum().backward()
    for t in inputs:
        t.grad = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(length: int, mode: str, device: torch.device, args) -> int:
    """Bytes above the inputs at the peak of one forward + backward."""
    step(make_inputs(256, device), mode, args)  # load what a first call loads
    inputs = make_inputs(length, device)
    return peak_bytes(lambda: step(inputs, mode, args), device)


def peak_memory_in_subprocess(length: int, mode: str, args) -> int:
    """A fresh process per measurement, so that the CPU peak RSS is this one's alone."""
    command = [sys.executable, __file__, "--_memory", str(length), mode, "--device", args.device]
    command += ["--chunk-size", str(args.chunk_size), "--strategy", args.strategy]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"L={length} {mode} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def times(length: int, device: torch.device, args) -> dict[str, float]:
    """Median seconds of forward + backward per mode, the modes alternating."""
    inputs = make_inputs(length, device)
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for mode in MODES:
            sync(device)
            start = time.perf_counter()
            step(inputs, mode, args)
            sync(device)
            if repeat:
                seconds[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(s) for mode, s in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median)")
    parser.add_argument("--chunk-size", type=int, default=64, help="the core's chunk_size")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto", help="causal strategy")
    parser.add_argument("--_memory", nargs=2, metavar=("LENGTH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    device = torch.device(args.device)

    if args._memory:
        print(json.dumps(peak_memory(int(args._memory[0]), args._memory[1], device, args)))
        return

    print(
        f"linear core on {args.device}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); batch "
        f"{BATCH}, {HEADS} heads, head_dim {HEAD_DIM}, {FEATURES} features, float32, "
        f"chunk_size {args.chunk_size}, strategy {args.strategy}; forward + backward, median "
        f"of {args.repeats}"
    )
    print(
        f"{'L':>7} {'causal ms':>10} {'non-causal ms':>14} {'ratio':>6} {'causal MiB':>11} "
        f"{'non-causal MiB':>15} {'causal KiB/token':>17}"
    )
    for length in args.lengths:
        seconds = times(length, device, args)
        if device.type == "cuda":
            memory = {mode: peak_memory(length, mode, device, args) for mode in MODES}
        else:
            memory = {mode: peak_memory_in_subprocess(length, mode, args) for mode in MODES}
        print(
            f"{length:>7} {seconds['causal'] * 1e3:>10.1f} {seconds['noncausal'] * 1e3:>14.1f} "
            f"{seconds['causal'] / seconds['noncausal']:>6.2f} "
            f"{memory['causal'] / 2**20:>11.1f} {memory['noncausal'] / 2**20:>15.1f} "
            f"{memory['causal'] / length / 2**10:>17.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
