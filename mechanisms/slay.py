"""SLAY: the spherical Yat kernel linearised with quadrature and random features (SLAY 001,
sec. 2.3-2.5, App. C, F, I), and its ablation variants (001 Table 2 / Table 6).

On the unit sphere, x = u . v, C = 2 + eps:
    x^2 / (C - 2x) = int_0^inf e^(-sC) x^2 e^(2sx) ds
                   ~ sum_r w_r x^2 e^(2 s_r x),     s_r = t_r / C, w_r = a_r / C,
with (t_r, a_r) the R-point Gauss-Laguerre rule for int_0^inf e^(-t) f(t) dt. Per node the
feature is sqrt(w_r) * (phi_poly(u) (x) phi_PRF(u; s_r)), concatenated over the R nodes, and the
attention is kernel-normalised on the shared linear core with delta in the denominator.

PRF: phi_PRF(u; s)_i = exp(sqrt(2s) w_i . u - s) / sqrt(M), w_i ~ N(0, I_d). For |u| = |v| = 1,
    E[e^(sqrt(2s) w.u - s) e^(sqrt(2s) w.v - s)] = e^(-2s) E[e^(sqrt(2s) w.(u + v))]
                                                 = e^(-2s) e^(s |u + v|^2) = e^(2s u.v),
the Gaussian moment generating function E[e^(b.w)] = e^(|b|^2 / 2) with |u + v|^2 = 2 + 2 u.v.
That is why u must be unit-normalised: otherwise the estimate is off by e^(s(|u|^2 + |v|^2 - 2)).

The projections w_i are shared by the R nodes (phi_PRF(.; s) in 001 eq. 9 has one set of w_i),
and every random draw (projections, anchors, sketches) is shared by the heads; all are drawn
once in __init__ (seed None: torch's global RNG; an int: a private generator) and kept as
buffers. The tensor product is formed explicitly (no sketch S of 001 eq. 10): its dimension
R * poly_dim * M is small at the defaults (2 * 8 * 16 = 256).

Bias worth knowing (see docs): with eps = 1e-3 the R-point quadrature does not resolve the
1/eps peak at x = 1 (at R = 2 the discretised kernel reaches about 3 there, not 1000), and
anchor features estimate 1 + 2 (u.v)^2, not (u.v)^2.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from synthbench.core.linear_attention import compute_dtype
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, random_generator
from synthbench.core.params import check_int, check_positive

MAX_QUAD_NODES = 64  # beyond this Gauss-Laguerre weights underflow and add nothing
REFERENCE = "Luna, Bouhsine & Choromanski 2026, SLAY"


def gauss_laguerre(quad_nodes: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(s_r, w_r), float64: sum_r w_r h(s_r) approximates int_0^inf e^(-sC) h(s) ds, C = 2 + eps."""
    t, a = np.polynomial.laguerre.laggauss(quad_nodes)
    c = 2.0 + eps
    return t / c, a / c


def _gaussian(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def _rademacher(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=generator).to(torch.float64) * 2 - 1


class _SLAYBase(FeatureMapMechanism):
    """Shared construction: validation, quadrature, PRF projections and the tensor-product
    fusion. Subclasses give the polynomial factor (``polynomial`` and ``poly_dim``) and may
    draw its randomness in ``_draw_polynomial``.

    The defaults are the paper's (R 2 from Table 6; M_PRF 16, P 8, eps 1e-3 from Table 9);
    ``poly_features`` None for a polynomial factor without a size of its own.
    ``eps`` is the kernel's epsilon (C = 2 + eps); ``delta`` is the denominator stabiliser of
    the kernel normalisation, which the shared core reads as ``self.eps`` (so after __init__
    ``self.eps == delta`` and ``self.kernel_eps == eps``).
    """

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        quad_nodes: int = 2,
        prf_features: int = 16,
        poly_features: int | None = 8,
        eps: float = 1e-3,
        delta: float = 1e-6,
        seed: int | None = None,
        chunk_size: int = 64,
    ):
        check_int("quad_nodes", quad_nodes, 1, MAX_QUAD_NODES)
        check_int("prf_features", prf_features, 1)
        if poly_features is not None:
            check_int("poly_features", poly_features, 1)
        check_positive(eps=eps, delta=delta)
        super().__init__(head_dim, n_heads, eps=float(delta), chunk_size=chunk_size)
        self.kernel_eps, self.delta = float(eps), float(delta)
        self.quad_nodes, self.prf_features, self.poly_features = (
            quad_nodes,
            prf_features,
            poly_features,
        )
        self.seed = seed

        nodes, weights = gauss_laguerre(quad_nodes, eps)
        # per node r: phi = exp(sqrt(2 s_r) w.u + log_scale_r), sqrt(w_r / M) folded in
        log_scale = 0.5 * np.log(weights) - 0.5 * math.log(prf_features) - nodes
        self.register_buffer("prf_coef", torch.tensor(np.sqrt(2 * nodes)), persistent=False)
        self.register_buffer("prf_log_scale", torch.tensor(log_scale), persistent=False)

        generator = random_generator(seed)
        self.register_buffer("omega", _gaussian((head_dim, prf_features), generator))
        self._draw_polynomial(generator)

    # -- the polynomial factor (subclasses) ------------------------------------------------

    def _draw_polynomial(self, generator: torch.Generator | None) -> None:
        """Draw and register the polynomial factor's random buffers (none by default)."""

    @property
    def poly_dim(self) -> int:
        raise NotImplementedError

    def polynomial(self, u: torch.Tensor) -> torch.Tensor:
        """(..., d) unit vectors -> (..., poly_dim) polynomial features."""
        raise NotImplementedError

    # -- shared parts ----------------------------------------------------------------------

    @staticmethod
    def unit(x: torch.Tensor) -> torch.Tensor:
        """x / |x| in at least float32 (a zero vector stays zero)."""
        return F.normalize(x.to(compute_dtype(x)), dim=-1)

    def projection(self, u: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., M): w_i . u."""
        return u @ self.omega.to(u.dtype)

    def prf(self, projection: torch.Tensor) -> torch.Tensor:
        """(..., M) projections -> (..., R, M): sqrt(w_r) exp(sqrt(2 s_r) w.u - s_r) / sqrt(M)."""
        coef = self.prf_coef.to(projection.dtype).unsqueeze(-1)  # (R, 1)
        log_scale = self.prf_log_scale.to(projection.dtype).unsqueeze(-1)
        return torch.exp(projection.unsqueeze(-2) * coef + log_scale)

    def feature_map(self, x, is_query):
        u = self.unit(x)
        poly = self.polynomial(u)  # (..., P)
        prf = self.prf(self.projection(u))  # (..., R, M)
        return (poly[..., None, :, None] * prf[..., :, None, :]).flatten(-3)  # (..., R*P*M)

    @property
    def feature_dim(self) -> int:
        return self.quad_nodes * self.poly_dim * self.prf_features

    # -- the factorised kernel, for short sequences (FeatureMapMechanism.forward) -----------

    def scores(self, q, k):
        """phi(q) . phi(k) without the R*P*M features: per node they are a tensor product, so
        phi(u) . phi(v) = (poly(u) . poly(v)) * sum_r prf_r(u) . prf_r(v), and the sum over
        the nodes is one product of the flattened (R*M) PRF features."""
        u_q, u_k = self.unit(q), self.unit(k)
        return self.polynomial_scores(u_q, u_k) * self.prf_scores(u_q, u_k)

    def polynomial_scores(self, u_q: torch.Tensor, u_k: torch.Tensor) -> torch.Tensor:
        """poly(u_q) . poly(u_k), (..., L, L)."""
        return self.polynomial(u_q) @ self.polynomial(u_k).mT

    def prf_scores(self, u_q: torch.Tensor, u_k: torch.Tensor) -> torch.Tensor:
        """sum_r prf_r(u_q) . prf_r(u_k), (..., L, L)."""
        prf_q = self.prf(self.projection(u_q)).flatten(-2)
        return prf_q @ self.prf(self.projection(u_k)).flatten(-2).mT


@MECHANISMS.register(
    "slay",
    aliases=("slay-anchor",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAY(_SLAYBase):
    """SLAY with anchor polynomial features (the paper's default): phi_poly(u) =
    [(a_i . u)^2]_i / sqrt(P), anchors a_i ~ N(0, I_d).

    Features are non-negative. E over anchors of phi_poly(u).phi_poly(v) = |u|^2 |v|^2 +
    2 (u.v)^2 = 1 + 2x^2, so the expected kernel is sum_r w_r (1 + 2x^2) e^(2 s_r x), which
    approximates (1 + 2x^2) / (C - 2x), not x^2 / (C - 2x). Defaults: R = 2 (Table 6),
    M_PRF = 16, P = 8, eps = 1e-3 (Table 9).
    """

    def _draw_polynomial(self, generator):
        self.register_buffer("anchors", _gaussian((self.poly_features, self.head_dim), generator))

    @property
    def poly_dim(self) -> int:
        return self.poly_features

    def polynomial(self, u):
        return (u @ self.anchors.to(u.dtype).T).square() / math.sqrt(self.poly_features)


class _SLAYWithoutPolySize(_SLAYBase):
    """The variants whose polynomial factor has no size of its own (exact, absent, fused)."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        quad_nodes: int = 2,
        prf_features: int = 16,
        eps: float = 1e-3,
        delta: float = 1e-6,
        seed: int | None = None,
        chunk_size: int = 64,
    ):
        super().__init__(
            head_dim,
            n_heads,
            quad_nodes=quad_nodes,
            prf_features=prf_features,
            poly_features=None,
            eps=eps,
            delta=delta,
            seed=seed,
            chunk_size=chunk_size,
        )


@MECHANISMS.register(
    "slay-exact-poly",
    aliases=("slay-exact",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYExactPoly(_SLAYWithoutPolySize):
    """SLAY with the exact polynomial map: the half-vectorisation of u u^T (u_i u_j for i <= j,
    off-diagonal entries times sqrt(2)), d(d+1)/2 features with the same inner products as
    vec(u u^T): exactly (u.v)^2. Unbiased for the quadrature-discretised spherical Yat kernel
    sum_r w_r x^2 e^(2 s_r x). Features have both signs, but every score is (u.v)^2 times a
    positive PRF kernel, so scores and denominators are non-negative."""

    def _draw_polynomial(self, generator):  # nothing random: the fixed upper-triangle map
        rows, cols = torch.triu_indices(self.head_dim, self.head_dim)
        scale = torch.full(rows.shape, math.sqrt(2.0), dtype=torch.float64)
        scale[rows == cols] = 1.0
        self.register_buffer("poly_rows", rows, persistent=False)
        self.register_buffer("poly_cols", cols, persistent=False)
        self.register_buffer("poly_scale", scale, persistent=False)

    @property
    def poly_dim(self) -> int:
        return self.head_dim * (self.head_dim + 1) // 2

    def polynomial(self, u):
        return u[..., self.poly_rows] * u[..., self.poly_cols] * self.poly_scale.to(u.dtype)

    def polynomial_scores(self, u_q, u_k):
        return (u_q @ u_k.mT).square()  # the d(d+1)/2 features' inner product, directly


@MECHANISMS.register(
    "slay-laplace",
    aliases=("slay-laplace-only",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYLaplace(_SLAYWithoutPolySize):
    """Laplace-only: the PRF part without a polynomial factor, sqrt(w_r) phi_PRF(u; s_r).

    Unbiased for sum_r w_r e^(2 s_r x), the quadrature of int_0^inf e^(-sC) e^(2sx) ds =
    1 / (C - 2x) = 1 / (|u - v|^2 + eps): inverse squared chordal distance, without the x^2
    numerator. By 001 App. F, x^2/(C - 2x) = (C^2/4) / (C - 2x) - C/4 - x/2, so it is the
    spherical Yat kernel up to that affine term. Features are positive."""

    @property
    def poly_dim(self) -> int:
        return 1

    def feature_map(self, x, is_query):
        return self.prf(self.projection(self.unit(x))).flatten(-2)  # (..., R*M)

    def scores(self, q, k):
        return self.prf_scores(self.unit(q), self.unit(k))


@MECHANISMS.register(
    "slay-hadamard",
    aliases=("slay-had",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYHadamard(_SLAYWithoutPolySize):
    """Hadamard fusion with shared projections (001 App. F, "Hadamard (shared w)" in Table 6):
    per node sqrt(w_r) (w_i . u)^2 exp(sqrt(2 s_r) w_i . u - s_r) / sqrt(M), i = 1..M, the
    same w_i in the polynomial and the PRF factor, R * M features, all non-negative.

    The literal elementwise product of phi_anc / sqrt(M) and phi_PRF / sqrt(M) would carry
    1/M twice; one 1/sqrt(M) is kept so that the inner product is a mean over the M draws.
    Its expectation (Gaussian tilting, E[f(w) e^(b.w)] = e^(|b|^2/2) E[f(w + b)] with
    b = sqrt(2s)(u + v)) is, per node,
        e^(2sx) [1 + 2x^2 + 2s (1 + x)^2 (2 + 4x) + 4 s^2 (1 + x)^4],
    not x^2 e^(2sx): a biased fast baseline, as 001 App. F says.
    """

    @property
    def poly_dim(self) -> int:
        return 1  # fused elementwise: R * M features

    def feature_map(self, x, is_query):
        projection = self.projection(self.unit(x))  # (..., M)
        return (self.prf(projection) * projection.square().unsqueeze(-2)).flatten(-2)

    scores = FeatureMapMechanism.scores  # the fusion is elementwise: no factorisation


@MECHANISMS.register(
    "slay-nystrom",
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYNystrom(SLAY):
    """SLAY with Nystrom polynomial features (001 App. C): phi(u) = K_uA (K_AA + lambda I)^(-1/2),
    K_uA = [(u . a_i)^2]_i, (K_AA)_ij = (a_i . a_j)^2, anchors a_i ~ N(0, I_d),
    lambda = ridge * mean(diag K_AA) (relative, so the ridge does not depend on the anchors'
    scale). Approximates (u.v)^2 by its projection on span{a_i a_i^T}: exact (up to the ridge)
    once P >= d(d+1)/2. Features and scores can be negative: signed core."""

    signed = True

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        quad_nodes: int = 2,
        prf_features: int = 16,
        poly_features: int = 8,
        ridge: float = 1e-3,
        eps: float = 1e-3,
        delta: float = 1e-6,
        seed: int | None = None,
        chunk_size: int = 64,
    ):
        check_positive(ridge=ridge)
        super().__init__(
            head_dim,
            n_heads,
            quad_nodes=quad_nodes,
            prf_features=prf_features,
            poly_features=poly_features,
            eps=eps,
            delta=delta,
            seed=seed,
            chunk_size=chunk_size,
        )
        self.ridge = float(ridge)
        gram = (self.anchors @ self.anchors.T).square()
        regularised = gram + ridge * gram.diagonal().mean() * torch.eye(
            poly_features, dtype=torch.float64
        )
        values, vectors = torch.linalg.eigh(regularised.to(torch.float64))
        self.register_buffer("whitening", (vectors * values.rsqrt()) @ vectors.T)

    def polynomial(self, u):
        return (u @ self.anchors.to(u.dtype).T).square() @ self.whitening.to(u.dtype)


@MECHANISMS.register(
    "slay-tensorsketch",
    aliases=("slay-ts",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYTensorSketch(SLAY):
    """SLAY with a degree-2 TensorSketch (Pham & Pagh 2013) as polynomial factor:
    TS(u) = IFFT(FFT(CS_1 u) * FFT(CS_2 u)), two independent count sketches to P buckets
    (hash h_j: [d] -> [P], signs s_j: [d] -> +-1), i.e. a count sketch of u (x) u with hash
    h_1(i) + h_2(j) mod P and sign s_1(i) s_2(j). Unbiased for (u.v)^2. Features and scores
    can be negative: signed core."""

    signed = True

    def _draw_polynomial(self, generator):
        for j in (1, 2):
            buckets = torch.randint(0, self.poly_features, (self.head_dim,), generator=generator)
            signs = _rademacher((self.head_dim,), generator)
            sketch = torch.zeros(self.head_dim, self.poly_features, dtype=torch.float64)
            sketch[torch.arange(self.head_dim), buckets] = signs
            self.register_buffer(f"count_sketch_{j}", sketch)

    def polynomial(self, u):
        a = torch.fft.rfft(u @ self.count_sketch_1.to(u.dtype), dim=-1)
        b = torch.fft.rfft(u @ self.count_sketch_2.to(u.dtype), dim=-1)
        return torch.fft.irfft(a * b, n=self.poly_features, dim=-1)


@MECHANISMS.register(
    "slay-maclaurin",
    aliases=("slay-rm", "slay-random-maclaurin"),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYMaclaurin(SLAY):
    """SLAY with degree-2 Random Maclaurin features (Kar & Karnick 2012, 001 App. C):
    phi(u) = [(r_i . u)(s_i . u)]_i / sqrt(P), r_i, s_i Rademacher in {+-1}^d. Unbiased for
    (u.v)^2. Features and scores can be negative: signed core."""

    signed = True

    def _draw_polynomial(self, generator):
        shape = (self.poly_features, self.head_dim)
        self.register_buffer("maclaurin_r", _rademacher(shape, generator))
        self.register_buffer("maclaurin_s", _rademacher(shape, generator))

    def polynomial(self, u):
        r, s = self.maclaurin_r.to(u.dtype), self.maclaurin_s.to(u.dtype)
        return (u @ r.T) * (u @ s.T) / math.sqrt(self.poly_features)
