"""Random Fourier features for the Gaussian kernel on the shared linear core (Rahimi & Recht
2007; the RFF attention of REWA 002, Algorithm 5, kernel-normalised here instead of put
through a softmax, so that it stays linear in the length).

    phi(x) = [cos(W x / s), sin(W x / s)] / sqrt(M),   rows w_m ~ N(0, I_d),
    phi(q) . phi(k) = (1/M) sum_m cos(w_m . (q - k) / s)
    E[phi(q) . phi(k)] = exp(-|q - k|^2 / (2 s^2)),

the Gaussian kernel of bandwidth s (Bochner: the characteristic function of N(0, I)). M is
nb_features = 64 frequencies, so phi has 2M = 128 features. The default bandwidth is
s = d^(1/4), the scale at which performer and softmax see q.k / sqrt(d): then
exp(-|q - k|^2 / (2 sqrt(d))) = exp(q.k / sqrt(d)) exp(-|q|^2 / (2 sqrt(d)))
exp(-|k|^2 / (2 sqrt(d))), the softmax weight times a penalty on each norm. The frequencies
are drawn in orthogonal blocks (orthogonal random features, Yu et al. 2016), each row still
exactly N(0, I_d), as for performer.

Note on scaling: with one [cos, sin] pair per frequency the factor is 1/sqrt(M); REWA 002's
eq. 127 writes sqrt(2/D) with D pairs, which would estimate twice the kernel (that factor
belongs to the single-cosine form sqrt(2/D) cos(w.x + b) with a random phase b).

The estimate can be negative, so the scores and denominators can be too (``signed = True``):
the core keeps the denominator's sign and pushes it to magnitude at least eps instead of
adding eps (see synthbench/core/linear_attention.py). Where the estimated denominator comes close
to 0 the output can grow to |numerator| / eps; a larger eps bounds it.
"""

from __future__ import annotations

import math

import torch

from synthbench.core.mechanism import MECHANISMS

from .performer import RandomProjectionMechanism


@MECHANISMS.register(
    "rff",
    aliases=("random-fourier",),
    complexity="linear",
    family="random-features",
    reference="Rahimi & Recht 2007, Random Features for Large-Scale Kernel Machines",
)
class RFFAttention(RandomProjectionMechanism):
    """phi(x) = [cos(W x / s), sin(W x / s)] / sqrt(M): Gaussian-kernel attention,
    exp(-|q - k|^2 / (2 s^2)), kernel-normalised; M = nb_features = 64 frequencies (128
    features), s = bandwidth, None for d^(1/4). Signed."""

    signed = True

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        nb_features: int = 64,
        bandwidth: float | None = None,
        seed: int | None = None,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads, nb_features, seed, eps, chunk_size)
        if bandwidth is not None and (
            isinstance(bandwidth, bool)
            or not isinstance(bandwidth, int | float)
            or not math.isfinite(bandwidth)
            or bandwidth <= 0
        ):
            raise ValueError(f"bandwidth must be None or a finite number > 0, got {bandwidth!r}")
        self.bandwidth = head_dim**0.25 if bandwidth is None else float(bandwidth)

    def feature_map(self, x, is_query):
        angles = self.project(x, 1.0 / self.bandwidth)
        return torch.cat([angles.cos(), angles.sin()], dim=-1) / math.sqrt(self.nb_features)

    @property
    def feature_dim(self) -> int:
        return 2 * self.nb_features
