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

A causal sequence up to feature_dim never forms it: its scores factorise, phi(u) . phi(v) =
(poly(u) . poly(v)) (prf(u) . prf(v)) (``score_factors``), which the core's
``attend_to_factored_scores`` takes a block of batch rows at a time; the features come from
one matrix product and exp2 with hand-written backwards (``unit_features``,
``score_factors_vjp``). The plain formulas' values to float rounding, in less time
(benchmarks/step_speedup.py).

Bias worth knowing (see docs): with eps = 1e-3 the R-point quadrature does not resolve the
1/eps peak at x = 1 (at R = 2 the discretised kernel reaches about 3 there, not 1000), and
anchor features estimate 1 + 2 (u.v)^2, not (u.v)^2.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from synthbench.core.linear_attention import compute_dtype, factored_scores, functorch_active
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, random_generator
from synthbench.core.params import check_int, check_positive

MAX_QUAD_NODES = 64  # beyond this Gauss-Laguerre weights underflow and add nothing
LOG2E = 1 / math.log(2)
NORM_EPS = 1e-12  # F.normalize's: x / max(|x|, NORM_EPS)
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
        self._feature_weights: dict[torch.dtype, tuple] = {}  # feature_weights' cache

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
        """x / |x| in at least float32 (a zero vector stays zero): ``unit_features``' u."""
        return F.normalize(x.to(compute_dtype(x)), dim=-1)

    def squared_projection(self) -> torch.Tensor | None:
        """(d, n) W of a polynomial factor built on (u W)^2, which ``unit_features`` forms in
        the PRF's matrix product (``polynomial_of`` uses it); None for another form."""
        return None

    def polynomial_of(self, u: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
        """``polynomial(u)``, given ``unit_features``' squared projections ``sq`` of u."""
        return self.polynomial(u)

    def feature_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``unit_features``' weight (d, n + R*M) and bias in ``dtype``: W (bias 0), then per
        node the PRF's exponent in base 2, sqrt(2 s_r) log2(e) w_i and log_scale_r log2(e).
        Formed in float64, kept until a buffer changes (storage or version)."""
        stamp = None if functorch_active() else [(t.data_ptr(), t._version) for t in self.buffers()]
        cached = self._feature_weights.get(dtype)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        weight = (self.omega.unsqueeze(-2) * (self.prf_coef * LOG2E).unsqueeze(-1)).flatten(-2)
        bias = (self.prf_log_scale * LOG2E).repeat_interleave(self.prf_features)
        poly = self.squared_projection()
        if poly is not None:
            weight = torch.cat([poly.to(weight.dtype), weight], dim=-1)
            bias = torch.cat([bias.new_zeros(poly.shape[-1]), bias])
        weights = (weight.to(dtype), bias.to(dtype))
        if stamp is not None and not torch.is_inference_mode_enabled():  # else not reusable
            self._feature_weights[dtype] = (stamp, weights)
        return weights

    def unit_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., d) -> (u, sq, prf), at least float32: the unit vectors (``unit``), (u W)^2
        (``squared_projection``; (..., 0) without) and the PRF features (..., R*M), node
        after node sqrt(w_r) exp(sqrt(2 s_r) w.u - s_r) / sqrt(M) as 2^((sqrt(2 s_r) w.u +
        log_scale_r) log2(e)) (torch's exp2 is several times faster than its exp on a CPU)."""
        dtype = compute_dtype(x)
        weight, bias = self.feature_weights(dtype)
        n = weight.shape[-1] - self.quad_nodes * self.prf_features
        if not functorch_active():
            return _UnitFeatures.apply(x.to(dtype), weight, bias, n)
        u = self.unit(x)  # plain operations, which vmap can batch (the buffers too)
        y = u @ weight + bias
        return u, y[..., :n].square(), y[..., n:].exp2()

    def feature_map(self, x, is_query):
        u, sq, prf = self.unit_features(x)
        poly = self.polynomial_of(u, sq)  # (..., P)
        prf = prf.unflatten(-1, (self.quad_nodes, self.prf_features))  # (..., R, M)
        return (poly[..., None, :, None] * prf[..., :, None, :]).flatten(-3)  # (..., R*P*M)

    @property
    def feature_dim(self) -> int:
        return self.quad_nodes * self.poly_dim * self.prf_features

    # -- the factorised kernel, for short sequences (FeatureMapMechanism.forward) -----------

    factored = True  # attend_to_factored_scores: blocks of scores from score_factors

    @staticmethod
    def stacked(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(2, ..., L, d): q and k in one tensor (at least float32), each feature one call."""
        dtype = compute_dtype(q, k)
        return torch.stack([q.to(dtype), k.to(dtype)])

    def factors_of(self, u, sq, prf) -> list[tuple[torch.Tensor, int]]:
        """phi(u) . phi(v) without the R*P*M features, from ``unit_features``: per node they
        are a tensor product, so phi(u) . phi(v) = (poly(u) . poly(v)) * sum_r prf_r(u) .
        prf_r(v), the sum over the nodes one product of the flattened (R*M) PRF features."""
        return [(self.polynomial_of(u, sq), 1), (prf, 1)]

    hand_gradients: bool = False  # feature_gradients differentiates factors_of by hand

    def feature_gradients(self, d_factors, u, sq, prf):
        """The gradients (du, dsq, dprf; None for one not used) of ``factors_of``'s inputs
        from its factors', by hand (``score_factors_vjp``), where ``hand_gradients``."""
        raise NotImplementedError

    def score_factors(self, q, k):
        return self.factors_of(*self.unit_features(self.stacked(q, k)))

    def score_factors_vjp(self, q, k):
        """``score_factors`` with their backward by hand; None without ``hand_gradients``."""
        if not self.hand_gradients or functorch_active():
            return None
        x = self.stacked(q, k)
        weight, bias = self.feature_weights(x.dtype)
        n = weight.shape[-1] - self.quad_nodes * self.prf_features
        shape = x.shape[:-1]
        u, norm, y = _unit_features(x.reshape(-1, x.shape[-1]), weight, bias, n)
        sq, prf = y[:, :n].square().view(*shape, n), y[:, n:].view(*shape, y.shape[1] - n)
        features = (u.view(x.shape), sq, prf)

        def vjp(d_factors):
            du, dsq, dprf = self.feature_gradients(d_factors, *features)
            dx = _unit_features_backward(u, norm, y, weight, n, du, dsq, dprf).view(x.shape)
            return dx[0], dx[1]

        return self.factors_of(*features), vjp

    def scores(self, q, k):
        return factored_scores(self.score_factors(q, k))


def _unit_features(x, weight, bias, n):
    """(N, d) -> u, norm, y: u = x / norm, norm = max(|x|, 1e-12) (F.normalize's), y = u
    weight + bias, 2^ in place past column n (the PRF); the squared projections y[:, :n]^2."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min_(NORM_EPS)
    u = x / norm
    y = torch.addmm(bias, u, weight)
    y[:, n:].exp2_()
    return u, norm, y


def _unit_features_backward(u, norm, y, weight, n, du, dsq, dprf):
    """dx (N, d) of _unit_features from the gradients (or None) of u, y[:, :n]^2 and the
    PRF features: dy = [2 y[:n] dsq, ln(2) prf dprf], du' = du + dy weight^T,
    dx = (du' - u (u . du')) / norm (without the second term where |x| <= 1e-12)."""
    N = u.shape[0]
    dy = torch.zeros_like(y) if dsq is None or dprf is None else torch.empty_like(y)
    if dsq is not None and n:
        torch.mul(y[:, :n], dsq.reshape(N, n), out=dy[:, :n])
    if dprf is not None:
        torch.mul(y[:, n:], dprf.reshape(N, y.shape[1] - n), out=dy[:, n:])
    # d sq / dy = 2 y and d prf / dy = ln(2) prf: folded into the weight's columns
    scale = torch.full_like(weight[0], math.log(2))
    scale[:n] = 2
    weight = weight * scale
    du = dy @ weight.mT if du is None else torch.addmm(du.reshape(N, -1), dy, weight.mT)
    dot = torch.linalg.vecdot(u, du).unsqueeze(-1).masked_fill_(norm <= NORM_EPS, 0)
    return torch.addcmul(du, u, dot, value=-1).div_(norm)


class _UnitFeatures(torch.autograd.Function):
    """_unit_features as one node (autograd's dozen nodes for these narrow tensors cost more
    than their arithmetic): x (..., d), weight, bias, n -> (u, sq, prf)."""

    @staticmethod
    def forward(ctx, x, weight, bias, n):
        shape, d = x.shape[:-1], x.shape[-1]
        u, norm, y = _unit_features(x.reshape(-1, d), weight, bias, n)
        ctx.save_for_backward(u, norm, y, weight)
        ctx.n, ctx.x_shape = n, x.shape
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        sq, prf = y[:, :n].square(), y[:, n:]
        return u.view(*shape, d), sq.view(*shape, n), prf.view(*shape, prf.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, du, dsq, dprf):
        u, norm, y, weight = ctx.saved_tensors
        dx = _unit_features_backward(u, norm, y, weight, ctx.n, du, dsq, dprf)
        return dx.view(ctx.x_shape), None, None, None


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

    def squared_projection(self):  # (u . a_i / P^(1/4))^2 = (a_i . u)^2 / sqrt(P)
        return self.anchors.T * self.poly_features**-0.25

    def polynomial_of(self, u, sq):
        return sq

    hand_gradients = True

    def feature_gradients(self, d_factors, u, sq, prf):
        d_poly, d_prf = d_factors
        return None, d_poly, d_prf


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

    def factors_of(self, u, sq, prf):
        return [(u, 2), (prf, 1)]  # the d(d+1)/2 features' inner product is (u.v)^2

    hand_gradients = True

    def feature_gradients(self, d_factors, u, sq, prf):
        du, d_prf = d_factors
        return du, None, d_prf


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
        return self.unit_features(x)[2]  # (..., R*M)

    def factors_of(self, u, sq, prf):
        return [(prf, 1)]

    hand_gradients = True

    def feature_gradients(self, d_factors, u, sq, prf):
        return None, None, d_factors[0]


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
        return self.factors_of(*self.unit_features(x))[0][0]

    def squared_projection(self):
        return self.omega

    def factors_of(self, u, sq, prf):  # the fusion is elementwise: its features are the factor
        nodes = prf.unflatten(-1, (self.quad_nodes, self.prf_features))  # (..., R, M)
        return [((nodes * sq.unsqueeze(-2)).flatten(-2), 1)]  # sq: (w_i . u)^2

    hand_gradients = True

    def feature_gradients(self, d_factors, u, sq, prf):
        d_nodes = d_factors[0].unflatten(-1, (self.quad_nodes, self.prf_features))
        nodes = prf.unflatten(-1, (self.quad_nodes, self.prf_features))
        return None, (d_nodes * nodes).sum(-2), (d_nodes * sq.unsqueeze(-2)).flatten(-2)


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

    def squared_projection(self):
        return self.anchors.T

    def polynomial_of(self, u, sq):
        return sq @ self.whitening.to(sq.dtype)

    def feature_gradients(self, d_factors, u, sq, prf):
        d_poly, d_prf = d_factors
        return None, d_poly @ self.whitening.to(d_poly.dtype).mT, d_prf


class _SketchedPolynomial:
    """Before SLAY in the bases of its variants without anchors: their polynomial factor
    comes from u by autograd, not from the anchors' squared projection."""

    squared_projection = _SLAYBase.squared_projection
    polynomial_of = _SLAYBase.polynomial_of
    hand_gradients = False


@MECHANISMS.register(
    "slay-tensorsketch",
    aliases=("slay-ts",),
    complexity="linear",
    family="slay",
    reference=REFERENCE,
)
class SLAYTensorSketch(_SketchedPolynomial, SLAY):
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
class SLAYMaclaurin(_SketchedPolynomial, SLAY):
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
