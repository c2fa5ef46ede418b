"""Yat attention (exact, quadratic) and its spherical, kernel-normalised form.

yat (Bouhsine, No More DeLuLu, sec. 2.2): softmax over the scores
    S_ij = (q_i . k_j)^2 / (|q_i - k_j|^2 + eps),
eps 1e-3 (SLAY 001, Table 9; 003 gives no value). The squared distance is computed as
|q|^2 + |k|^2 - 2 q.k in at least float32 and clamped at 0 before eps is added, so rounding
can never make the denominator smaller than eps.

yat-spherical (SLAY 001, sec. 2.2): q and k normalised to the unit sphere, x = q^ . k^, and
    K(x) = x^2 / (C - 2x),  C = 2 + eps  (= x^2 / (|q^ - k^|^2 + eps)),
kernel-normalised instead of a softmax: out_i = sum_j K_ij v_j / (sum_j K_ij + delta) over
the allowed keys. 0 <= K <= 1/eps, the maximum at x = 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from synthbench.core.linear_attention import compute_dtype, normalise
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_positive


def yat_kernel(q: torch.Tensor, k: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., Lq, d), (..., Lk, d) -> (..., Lq, Lk): (q.k)^2 / (max(|q - k|^2, 0) + eps)."""
    dtype = compute_dtype(q, k)
    q, k = q.to(dtype), k.to(dtype)
    dot = q @ k.transpose(-1, -2)
    sq_q = (q * q).sum(-1, keepdim=True)
    sq_k = (k * k).sum(-1).unsqueeze(-2)
    distance = (sq_q + sq_k - 2 * dot).clamp(min=0)
    return dot.square() / (distance + eps)


def spherical_yat_kernel(q: torch.Tensor, k: torch.Tensor, eps: float) -> torch.Tensor:
    """x^2 / (C - 2x) on the unit-normalised q, k, x = q^ . k^, C = 2 + eps.

    Written as x^2 / (max(2 - 2x, 0) + eps): the same value, and rounding that pushes x just
    above 1 cannot drive the denominator below eps."""
    dtype = compute_dtype(q, k)
    u, w = F.normalize(q.to(dtype), dim=-1), F.normalize(k.to(dtype), dim=-1)
    x = u @ w.transpose(-1, -2)
    return x.square() / ((2 - 2 * x).clamp(min=0) + eps)


@MECHANISMS.register(
    "yat",
    aliases=("yat-exact",),
    complexity="quadratic",
    family="yat",
    reference="Bouhsine 2025, No More DeLuLu (Yat-product attention)",
)
class YatAttention(Mechanism):
    """softmax_j((q_i . k_j)^2 / (|q_i - k_j|^2 + eps)) v, no temperature (as in 003)."""

    def __init__(self, head_dim: int, n_heads: int, eps: float = 1e-3):
        super().__init__(head_dim, n_heads)
        check_positive(eps=eps)
        self.eps = float(eps)

    def kernel(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The (..., Lq, Lk) Yat scores, before the softmax."""
        return yat_kernel(q, k, self.eps)

    def forward(self, q, k, v, causal: bool = True):
        scores = self.kernel(q, k)
        if causal:
            L, S = scores.shape[-2:]
            allowed = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
            scores = scores.masked_fill(~allowed, float("-inf"))
        return (scores.softmax(dim=-1) @ v.to(scores.dtype)).to(v.dtype)


@MECHANISMS.register(
    "yat-spherical",
    aliases=("spherical-yat", "yat-sph"),
    complexity="quadratic",
    family="yat",
    reference="Luna, Bouhsine & Choromanski 2026, SLAY (sec. 2.2, spherical Yat)",
)
class SphericalYatAttention(Mechanism):
    """Exact spherical Yat attention, kernel-normalised: the target that SLAY linearises."""

    def __init__(self, head_dim: int, n_heads: int, eps: float = 1e-3, delta: float = 1e-6):
        super().__init__(head_dim, n_heads)
        check_positive(eps=eps, delta=delta)
        self.eps, self.delta = float(eps), float(delta)

    def kernel(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The (..., Lq, Lk) spherical Yat kernel, before the normalisation."""
        return spherical_yat_kernel(q, k, self.eps)

    def forward(self, q, k, v, causal: bool = True):
        kernel = self.kernel(q, k)
        if causal:
            kernel = kernel.tril()  # a zero weight for every key after its query
        out = normalise(kernel @ v.to(kernel.dtype), kernel.sum(dim=-1), self.delta, False)
        return out.to(v.dtype)
