"""REWA attention (Phadke 2025, 002): softmax over how close a query's "witness" is to a
key's, out_i = sum_j softmax_j(s(q_i, k_j) / tau) v_j. Three variants, all quadratic:

rewa-geometric (002 sec. 4, eqs. 8-11, Algorithm 3): s = -d on R^m x S^(n-1) x B^p,
    d = alpha |a_q - a_k| + beta arccos(b_q . b_k) + gamma d_H(c_q, c_k),
a = U_R x (Euclidean), b = U_S x / |U_S x| (unit sphere), c = exp_0(U_H x) (Poincare ball),
    d_H(u, w) = arccosh(1 + 2 |u - w|^2 / ((1 - |u|^2)(1 - |w|^2))),
computed as 2 asinh(sqrt(z / 2)), z = 2 |u - w|^2 / (...), the same function (cosh 2t = 1 +
2 sinh^2 t) without arccosh's loss of precision near 1. The maps U are learned per head;
alpha, beta, gamma and tau are learned per head as softplus of a raw parameter. ``parts``
keeps a subset of the three terms.

rewa-rff (002 sec. 5.3.4, Algorithm 5): s = phi(q) . phi(k), the random Fourier feature
estimate of the Gaussian kernel exp(-|q - k|^2 / (2 sigma^2)), put through a softmax with
temperature tau as 002 does (so quadratic; the ``rff`` mechanism is the linear,
kernel-normalised form).

rewa-operator (002 sec. 6, Algorithm 6): s = -|A_q - A_k|_F^2, the squared Hilbert-Schmidt
distance between per-token m x m operators A = reshape(U x).

Where this differs from 002, and why:
- Separate witness maps for queries and keys. 002 maps every token x with one map W and
  scores W(x_i) against W(x_j); a distance is 0 only between a witness and itself, so every
  token would attend most to itself. Here queries and keys get their own learned maps
  (U^q q_i against U^k k_j) on top of the model's separate q and k projections. rewa-rff has
  no learned map (002's Algorithm 5 has none): its random features must be shared for the
  kernel estimate, and q, k already differ.
- The Poincare distance is the arccosh form above. 002's "stable" forms (eqs. 99 and 125,
  2 artanh(|u - w| / (1 -+ u.w))) are wrong: the right one is 2 artanh(|(-u) (+) w|) with
  the Mobius addition (+).
- Points enter the ball by the exponential map at 0, exp_0(x) = tanh(|x|) x / |x| (curvature
  -1), clamped to norm <= 1 - 4e-3 (float32) or 1 - 1e-5 (float64). 002's elementwise tanh
  leaves the ball (its norm reaches sqrt(p)).
- Initial values as 002 intends them: alpha = 1/sqrt(m), beta = 1, gamma = 1/sqrt(p), tau = 1
  (eqs. 100-102). 002's code stores those numbers as the raw parameters and then applies
  softplus, so it really starts at softplus(1/sqrt(m)) ~ 0.72 (m 256), softplus(1) ~ 1.31;
  here the raw parameter is softplus^-1 of the intended value.
- RFF normalisation: 002's phi = [cos(Z); sin(Z)] / sqrt(D) with D/2 frequencies (Algorithm
  5) estimates half the kernel, and sqrt(2/D) on D (cos, sin) pairs (eq. 127) twice the
  kernel. Here phi(x) = sqrt(2/D) cos(W x / sigma + b), D frequencies w ~ N(0, I), phases
  b ~ U[0, 2 pi): E[phi(q) . phi(k)] = exp(-|q - k|^2 / (2 sigma^2)) exactly.

Numerics: distances are computed in at least float32 (float64 for float64 inputs), every
pairwise distance by the matmul form |a|^2 + |b|^2 - 2 a.b clamped at 0 (no (L, L, dim)
tensor), square roots of values floored at SQRT_FLOOR and arccos of values clamped to
[-1 + ARCCOS_EPS, 1 - ARCCOS_EPS], so outputs and gradients stay finite at q = k, at 0 and at
the edge of the ball. Causal masking puts -inf before the softmax; the diagonal is always
allowed, so no row is empty.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.linear_attention import compute_dtype
from synthbench.core.mechanism import MECHANISMS, Mechanism, random_generator
from synthbench.core.params import check_int, check_positive

REFERENCE = "Phadke 2025, The Universal REWA Attention Framework"
PARTS = ("euclidean", "spherical", "hyperbolic")
# How far inside the unit sphere ball points stay (the hyperbolic-network convention, as in
# HGCN's BALL_EPS): near the edge the metric grows like 2 / (1 - |u|^2), so the rounding of
# |u - w|^2 (about 1e-7 in float32) reads as distance; 1 - |u| >= 4e-3 keeps that below about
# 0.15 in float32, 1e-5 below about 0.01 in float64.
BALL_EPS = {torch.float32: 4e-3, torch.float64: 1e-5}
SQRT_FLOOR = 1e-12  # sqrt'(x) = 1 / (2 sqrt(x)) is at most 5e5 above the floor, 0 below
ARCCOS_EPS = 1e-6  # arccos' is at most 1 / sqrt(2e-6) ~ 707; above float32 rounding of a.b


# -- geometry -------------------------------------------------------------------------------


def safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt(max(x, SQRT_FLOOR)): a finite gradient at 0 (there 0)."""
    return x.clamp(min=SQRT_FLOOR).sqrt()


def pairwise_sq_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., L, p), (..., S, p) -> (..., L, S): |a_i - b_j|^2 = |a_i|^2 + |b_j|^2 - 2 a_i.b_j,
    clamped at 0 (rounding can make it slightly negative)."""
    sq_a = a.square().sum(-1, keepdim=True)
    sq_b = b.square().sum(-1).unsqueeze(-2)
    return (sq_a + sq_b - 2 * a @ b.transpose(-1, -2)).clamp(min=0)


def euclidean_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise |a_i - b_j|."""
    return safe_sqrt(pairwise_sq_distance(a, b))


def spherical_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise great-circle distance arccos(a_i . b_j) between unit vectors."""
    cosine = a @ b.transpose(-1, -2)
    return torch.arccos(cosine.clamp(-1 + ARCCOS_EPS, 1 - ARCCOS_EPS))


def ball_max_norm(dtype: torch.dtype) -> float:
    """The largest norm of a ball point computed in ``dtype`` (float32 or float64)."""
    return 1 - BALL_EPS[torch.float64 if dtype == torch.float64 else torch.float32]


def to_poincare_ball(x: torch.Tensor) -> torch.Tensor:
    """The exponential map at 0 of the Poincare ball (curvature -1), tanh(|x|) x / |x|, with
    the norm clamped at ball_max_norm; 0 stays 0."""
    norm = safe_sqrt(x.square().sum(-1, keepdim=True))
    return x * (torch.tanh(norm).clamp(max=ball_max_norm(x.dtype)) / norm)


def poincare_distance(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Pairwise distance in the Poincare ball, arccosh(1 + z), z = 2 |u - w|^2 / ((1 - |u|^2)
    (1 - |w|^2)), evaluated as 2 asinh(sqrt(z / 2)). Points beyond ball_max_norm count as
    on that sphere in the denominator."""
    floor = 1 - ball_max_norm(u.dtype) ** 2
    gap_u = (1 - u.square().sum(-1, keepdim=True)).clamp(min=floor)
    gap_w = (1 - w.square().sum(-1)).clamp(min=floor).unsqueeze(-2)
    z = 2 * pairwise_sq_distance(u, w) / (gap_u * gap_w)
    return 2 * torch.asinh(safe_sqrt(z / 2))


def unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


# part -> (map of a projected point into the part's space, pairwise distance there)
GEOMETRIES = {
    "euclidean": (identity, euclidean_distance),
    "spherical": (unit, spherical_distance),
    "hyperbolic": (to_poincare_ball, poincare_distance),
}


# -- learned pieces ---------------------------------------------------------------------------


def check_finite_positive(**values: float) -> None:
    """Raise ValueError naming the first of ``values`` that is not a finite number > 0."""
    check_positive(**values)
    for name, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def positive_parameter(value: float, n_heads: int) -> nn.Parameter:
    """A raw per-head parameter whose softplus is ``value``: softplus^-1(y) = y +
    log(1 - e^-y), written so that it stays accurate for small and large y."""
    return nn.Parameter(torch.full((n_heads,), value + math.log(-math.expm1(-value))))


def witness_map(n_heads: int, head_dim: int, dim: int) -> nn.Parameter:
    """A learned linear map head_dim -> dim per head, (n_heads, head_dim, dim), entries
    N(0, 1/head_dim): a witness coordinate starts at the scale of an input coordinate, the
    scale 002's initial weights (1/sqrt(m), 1/sqrt(p)) assume."""
    return nn.Parameter(torch.randn(n_heads, head_dim, dim) / math.sqrt(head_dim))


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d) @ (H, d, p) -> (B, H, L, p), in x's dtype."""
    return x @ weight.to(x.dtype)


def positive(raw: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """softplus of a raw (H,) parameter as (H, 1, 1) in like's dtype (computed there, so that
    float64 inputs get float64 weights), to scale (B, H, L, S) scores head by head."""
    return F.softplus(raw.to(like.dtype)).view(-1, 1, 1)


class WitnessAttention(Mechanism):
    """softmax_j(scores(q_i, k_j) / tau) v, tau > 0 learned per head (softplus of a raw
    parameter initialised at ``tau``). Subclasses give ``scores`` in at least float32."""

    def __init__(self, head_dim: int, n_heads: int, tau: float):
        super().__init__(head_dim, n_heads)
        check_finite_positive(tau=tau)
        self.raw_tau = positive_parameter(float(tau), n_heads)

    @property
    def tau(self) -> torch.Tensor:
        return F.softplus(self.raw_tau)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, H, L, d), (B, H, S, d) -> (B, H, L, S) similarities before the temperature."""
        raise NotImplementedError

    def forward(self, q, k, v, causal: bool = True):
        scores = self.scores(q, k)
        logits = scores / positive(self.raw_tau, scores)
        if causal:
            L, S = logits.shape[-2:]
            allowed = torch.ones(L, S, dtype=torch.bool, device=logits.device).tril()
            logits = logits.masked_fill(~allowed, float("-inf"))
        return (logits.softmax(dim=-1) @ v.to(logits.dtype)).to(v.dtype)


# -- the mechanisms ---------------------------------------------------------------------------


def parse_parts(parts: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A non-empty selection of PARTS, as a sequence or a comma-separated string."""
    if isinstance(parts, str):
        parts = [p.strip() for p in parts.split(",")]
    if (
        not isinstance(parts, tuple | list)
        or not parts
        or any(p not in PARTS for p in parts)
        or len(set(parts)) != len(parts)
    ):
        raise ValueError(f"parts must be distinct names among {', '.join(PARTS)}, got {parts!r}")
    return tuple(parts)


def initial_weight(part: str, dim: int) -> float:
    """alpha = 1/sqrt(m), beta = 1, gamma = 1/sqrt(p) (002 eqs. 100-102): a Euclidean or
    hyperbolic distance grows like sqrt(dim), an angle does not."""
    return 1.0 if part == "spherical" else dim**-0.5


@MECHANISMS.register(
    "rewa-geometric",
    aliases=("rewa", "geometric-rewa"),
    complexity="quadratic",
    family="rewa",
    reference=REFERENCE + " (sec. 4, geometric REWA)",
)
class GeometricREWA(WitnessAttention):
    """softmax(-(alpha |a_q - a_k| + beta arccos(b_q . b_k) + gamma d_H(c_q, c_k)) / tau) on
    witnesses in R^m x S^(n-1) x B^p, separate learned maps for queries and keys. Part dims
    None: head_dim. Starts at alpha = 1/sqrt(m), beta = 1, gamma = 1/sqrt(p), tau = ``tau``."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        parts: tuple[str, ...] = PARTS,
        euclidean_dim: int | None = None,
        spherical_dim: int | None = None,
        hyperbolic_dim: int | None = None,
        tau: float = 1.0,
    ):
        super().__init__(head_dim, n_heads, tau)
        self.parts = parse_parts(parts)
        dims = dict(zip(PARTS, (euclidean_dim, spherical_dim, hyperbolic_dim), strict=True))
        for part, dim in dims.items():
            if dim is not None:
                check_int(f"{part}_dim", dim, 1)
        self.dims = {part: head_dim if dims[part] is None else dims[part] for part in self.parts}
        self.query_maps = nn.ParameterDict(
            {part: witness_map(n_heads, head_dim, dim) for part, dim in self.dims.items()}
        )
        self.key_maps = nn.ParameterDict(
            {part: witness_map(n_heads, head_dim, dim) for part, dim in self.dims.items()}
        )
        self.raw_weights = nn.ParameterDict(
            {
                part: positive_parameter(initial_weight(part, dim), n_heads)
                for part, dim in self.dims.items()
            }
        )

    def weight(self, part: str) -> torch.Tensor:
        """The (n_heads,) weight of a part: alpha, beta or gamma."""
        return F.softplus(self.raw_weights[part])

    def witnesses(self, x: torch.Tensor, is_query: bool) -> dict[str, torch.Tensor]:
        """(B, H, L, d) -> per part the (B, H, L, dim) witness points in its space."""
        maps = self.query_maps if is_query else self.key_maps
        return {part: GEOMETRIES[part][0](project(x, maps[part])) for part in self.parts}

    def distances(self, q: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per part the (B, H, L, S) pairwise distances, unweighted, in at least float32."""
        dtype = compute_dtype(q, k)
        a, b = self.witnesses(q.to(dtype), True), self.witnesses(k.to(dtype), False)
        return {part: GEOMETRIES[part][1](a[part], b[part]) for part in self.parts}

    def scores(self, q, k):
        distances = self.distances(q, k)
        return -sum(positive(self.raw_weights[part], d) * d for part, d in distances.items())


@MECHANISMS.register(
    "rewa-rff",
    aliases=("rewa-functional", "functional-rewa"),
    complexity="quadratic",
    family="rewa",
    reference=REFERENCE + " (sec. 5.3.4 / Algorithm 5, RFF attention)",
)
class RFFREWA(WitnessAttention):
    """softmax(phi(q) . phi(k) / tau), phi(x) = sqrt(2/D) cos(W x / sigma + b), D =
    nb_features frequencies w ~ N(0, I_d), phases b ~ U[0, 2 pi), drawn once (shared by the
    heads) and kept as buffers. phi(q) . phi(k) is unbiased for exp(-|q - k|^2 / (2 sigma^2));
    002's sqrt(2/D) on (cos, sin) pairs (eq. 127) estimates twice that and its Algorithm 5's
    1/sqrt(D) on D/2 pairs half of it, fixed here. bandwidth sigma None: d^(1/4), the scale at
    which the kernel is exp(q.k / sqrt(d)) times a factor per norm (as for ``rff``). tau 0.1:
    at tau 1 the kernel's range [0, 1] would allow weight ratios of little more than e (002
    sweeps tau over 0.01-1). The estimate can be negative; the softmax weights cannot."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        nb_features: int = 256,
        bandwidth: float | None = None,
        tau: float = 0.1,
        seed: int | None = None,
    ):
        super().__init__(head_dim, n_heads, tau)
        check_int("nb_features", nb_features, 1)
        if bandwidth is not None:
            check_finite_positive(bandwidth=bandwidth)
        self.nb_features, self.seed = nb_features, seed
        self.bandwidth = head_dim**0.25 if bandwidth is None else float(bandwidth)
        generator = random_generator(seed)
        frequencies = torch.randn(nb_features, head_dim, generator=generator, dtype=torch.float64)
        phases = 2 * math.pi * torch.rand(nb_features, generator=generator, dtype=torch.float64)
        self.register_buffer("frequencies", frequencies)
        self.register_buffer("phases", phases)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., D) features sqrt(2/D) cos(W x / sigma + b), at least float32."""
        dtype = compute_dtype(x)
        angles = (x.to(dtype) / self.bandwidth) @ self.frequencies.to(dtype).T
        return torch.cos(angles + self.phases.to(dtype)) * math.sqrt(2 / self.nb_features)

    def scores(self, q, k):
        return self.feature_map(q) @ self.feature_map(k).transpose(-1, -2)


@MECHANISMS.register(
    "rewa-operator",
    aliases=("operator-rewa",),
    complexity="quadratic",
    family="rewa",
    reference=REFERENCE + " (sec. 6 / Algorithm 6, operator REWA)",
)
class OperatorREWA(WitnessAttention):
    """softmax(-|A_q - A_k|_F^2 / tau), A = reshape(U x) an m x m operator per token,
    separate learned maps U for queries and keys. tau None: m. An operator entry starts at
    the scale c of an input coordinate, and -|A_q - A_k|^2 = 2 A_q.A_k - |A_k|^2 - |A_q|^2
    varies over the keys by about 3 m c^2, so tau = m keeps the initial logits O(1)."""

    def __init__(self, head_dim: int, n_heads: int, m: int = 4, tau: float | None = None):
        check_int("m", m, 1)
        super().__init__(head_dim, n_heads, float(m) if tau is None else tau)
        self.m = m
        self.query_map = witness_map(n_heads, head_dim, m * m)
        self.key_map = witness_map(n_heads, head_dim, m * m)

    def operators(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        """(B, H, L, d) -> (B, H, L, m, m), in at least float32."""
        flat = project(x.to(compute_dtype(x)), self.query_map if is_query else self.key_map)
        return flat.unflatten(-1, (self.m, self.m))

    def scores(self, q, k):
        # |A - B|_F^2 is the squared Euclidean distance of the flattened operators
        a, b = self.operators(q, True).flatten(-2), self.operators(k, False).flatten(-2)
        return -pairwise_sq_distance(a, b)
