"""The short-sequence path of feature-map mechanisms against the chunked core.

    python benchmarks/short_scores.py [--mechs slay performer cosformer linear] [--rounds 5]

For each mechanism and each causal length L up to its ``feature_dim`` (where its forward
takes the (L x L) scores path: synthbench/core/mechanism.py), it times forward + backward (of the
sum of the output) of the mechanism's forward and of ``linear_attention`` on its explicit
features (the chunked core, what the forward did before the shortcut), batch 32, 4 heads,
head_dim 16, float32, one torch thread. The two alternate in one process (A B A B, after a
warm-up of each), so that a busy machine slows both alike; it prints the medians and the
median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from synthbench.core.linear_attention import linear_attention
from synthbench.core.mechanism import MECHANISMS

LENGTHS = (16, 32, 64, 128, 256)


def core(m, q, k, v):
    phi_q, phi_k = m.feature_map(q, is_query=True), m.feature_map(k, is_query=False)
    return linear_attention(phi_q, phi_k, v, True, m.eps, m.chunk_size, m.signed)


def ms_per_call(forward, inputs, repeats: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        forward(*inputs).sum().backward()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechs", nargs="+", default=["slay", "performer", "cosformer", "linear"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.mechs:
        torch.manual_seed(0)
        m = MECHANISMS.get(name)(16, 4)
        for length in (n for n in LENGTHS if n <= m.feature_dim):
            qkv = [torch.randn(32, 4, length, 16, requires_grad=True) for _ in range(3)]
            inputs = (m, *qkv)
            ms_per_call(core, inputs, 1)  # warm-up
            ms_per_call(m, qkv, 1)
            old, new = [], []
            for _ in range(args.rounds):
                old.append(ms_per_call(core, inputs))
                new.append(ms_per_call(m, qkv))
            ratio = statistics.median(a / b for a, b in zip(old, new, strict=True))
            print(
                f"{name:<10} L {length:>4}  core {statistics.median(old):8.2f} ms  "
                f"scores {statistics.median(new):8.2f} ms  core/scores {ratio:.2f}x"
            )


if __name__ == "__main__":
    main()
