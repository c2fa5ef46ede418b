"""The two exact forms of Based's Taylor linear attention (mechanisms/based.py
``taylor_attention``), forward + backward, side by side.

    OMP_NUM_THREADS=1 python benchmarks/taylor_forms.py [--lengths 64 111 256] [--rounds 7]

For each length L: batch 32, 4 heads, d 16 (273 features a position), values 16 wide,
float32, the quick protocol's shapes. It times the backward of the sum of the output of

- the scores: ``taylor_attention``, which takes them up to 1 + d + d^2 positions (1 + s +
  s^2 / 2, 64 queries at a time);
- the features: phi(q), phi(k) (``taylor_feature_map``) through the shared chunked core
  (``linear_attention``, chunks of 64), what ``taylor_attention`` takes past that length;

after checking in float64 that the two agree (forward and gradients, to 1e-10). The two
alternate (A B A B ...) on the same inputs, one torch thread, so that a busy machine slows
both alike; the figure is the median over ``--rounds``. Prints milliseconds of each and
features / scores.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from synthbench.bench.common import timed_ms
from synthbench.core.linear_attention import linear_attention
from synthbench.mechanisms.based import BASED_EPS, taylor_attention, taylor_feature_map

BATCH, HEADS, D, WIDTH = 32, 4, 16, 16
CPU = torch.device("cpu")


def scores_form(q, k, v):
    return taylor_attention(q, k, v, D, BASED_EPS)


def features_form(q, k, v):
    phi_q, phi_k = taylor_feature_map(q, D), taylor_feature_map(k, D)
    return linear_attention(phi_q, phi_k, v, eps=BASED_EPS)


FORMS = {"scores": scores_form, "features": features_form}


def inputs(length: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(BATCH, HEADS, length, D)] * 2 + [(BATCH, HEADS, length, WIDTH)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def check_agree(length: int) -> None:
    """Both forms in float64: the same output and the same gradients."""
    results = []
    for form in FORMS.values():
        q, k, v = inputs(length, torch.float64, seed=1)
        out = form(q, k, v)
        results.append((out, torch.autograd.grad(out.square().sum(), (q, k, v))))
    (a, grads_a), (b, grads_b) = results
    for x, y in zip((a, *grads_a), (b, *grads_b), strict=True):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


def step_ms(form, tensors) -> float:
    return timed_ms(lambda: form(*tensors).sum().backward(), CPU)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 111, 256])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if max(args.lengths) > 1 + D + D * D or min(args.lengths) < 1:
        parser.error(f"lengths are 1 to {1 + D + D * D}: past that, the features are taken")
    torch.set_num_threads(1)
    print(f"batch {BATCH}, {HEADS} heads, d {D}, values {WIDTH}, float32; ms forward + backward")
    for length in args.lengths:
        check_agree(length)
        tensors = inputs(length, torch.float32)
        times: dict[str, list[float]] = {name: [] for name in FORMS}
        for form in FORMS.values():  # warm-up
            step_ms(form, tensors)
        for i in range(args.rounds):
            for name in FORMS if i % 2 == 0 else reversed(FORMS):
                times[name].append(step_ms(FORMS[name], tensors))
        ms = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"L {length:4d}  scores {ms['scores']:8.1f}  features {ms['features']:8.1f}"
            f"  features / scores {ms['features'] / ms['scores']:.2f}"
        )


if __name__ == "__main__":
    main()
