"""The SLAY family against references written here from the formulas of SLAY 001 (sec. 2.3-2.5,
App. C, F, I): the quadrature, the PRF identity, the polynomial factors' expectations and
exactness, each variant's kernel rebuilt from its random buffers, the expectation over draws,
convergence to exact spherical Yat attention, signed variants, seeds and parameters."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
import torch
from test_mechanisms import assert_matches_reference

from synthbench.core import linear_attention
from synthbench.core.linear_attention import attend_to_scores
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, mechanism_params

B, H, L, D = 2, 2, 21, 6
CLOSE = {"atol": 1e-10, "rtol": 1e-9}
POSITIVE = ["slay", "slay-laplace", "slay-hadamard"]  # non-negative features
EXACT = ["slay-exact-poly"]  # signed features, non-negative scores
SIGNED = ["slay-nystrom", "slay-tensorsketch", "slay-maclaurin"]
ALL = POSITIVE + EXACT + SIGNED


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The models here are tiny: one intra-op thread is faster on a shared machine."""


def build(name, head_dim=D, **params):
    return MECHANISMS.get(name)(head_dim, H, **params)


def qkv(length=L, seed=0, dtype=torch.float64, requires_grad=False, head_dim=D):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, H, length, head_dim, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def unit(x):
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def quadrature(quad_nodes, eps):
    """s_r = t_r / C, w_r = a_r / C from the Gauss-Laguerre rule, C = 2 + eps (001 sec. 2.4.1)."""
    t, a = np.polynomial.laguerre.laggauss(quad_nodes)
    return t / (2 + eps), a / (2 + eps)


def pairs_with_cosines(cosines, dim=8, seed=1):
    """Unit vectors u_i, v_i with u_i . v_i = cosines[i], in a random orientation."""
    x = torch.tensor(cosines, dtype=torch.float64)
    basis, _ = torch.linalg.qr(
        torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    )
    u = basis[:, 0].expand(len(x), dim)
    v = x[:, None] * basis[:, 0] + torch.sqrt(1 - x**2)[:, None] * basis[:, 1]
    return u, v, x


def pair_kernel(mechanism, u, v):
    """phi(u_i) . phi(v_i) for rows i."""
    fu = mechanism.feature_map(u[None, None], is_query=True)[0, 0]
    fv = mechanism.feature_map(v[None, None], is_query=False)[0, 0]
    return (fu * fv).sum(-1)


# -- explicit kernels from the formulas and the module's random draws ---------------------


def prf_kernels(m, u, v):
    """(R, ..., Lq, Lk): (1/M) sum_m exp(sqrt(2 s_r) w_m.(u + v) - 2 s_r) for unit u, v."""
    s, _ = quadrature(m.quad_nodes, m.kernel_eps)
    pu, pv = u @ m.omega, v @ m.omega  # (..., L, M)
    out = []
    for s_r in s:
        c = math.sqrt(2 * s_r)
        out.append(torch.einsum("...im,...jm->...ij", torch.exp(c * pu), torch.exp(c * pv)))
    scale = torch.tensor(np.exp(-2 * s) / m.prf_features).reshape(-1, *[1] * pu.dim())
    return torch.stack(out) * scale


def tensorsketch(u, sketch_1, sketch_2):
    """Degree-2 TensorSketch by its definition (no FFT): bucket (h1(i) + h2(j)) mod P of
    u (x) u with sign s1(i) s2(j), hashes and signs read off the count-sketch matrices."""
    P = sketch_1.shape[1]
    h1, h2 = sketch_1.abs().argmax(1), sketch_2.abs().argmax(1)
    s1, s2 = sketch_1.sum(1), sketch_2.sum(1)
    out = torch.zeros(*u.shape[:-1], P, dtype=u.dtype)
    for i, j in product(range(u.shape[-1]), repeat=2):
        bucket = int((h1[i] + h2[j]) % P)
        out[..., bucket] += s1[i] * s2[j] * u[..., i] * u[..., j]
    return out


def poly_kernel(name, m, u, v):
    """(..., Lq, Lk) polynomial factor for unit u, v."""
    if name == "slay":
        return torch.einsum(
            "...ip,...jp->...ij", (u @ m.anchors.T) ** 2, (v @ m.anchors.T) ** 2
        ) / (m.poly_features)
    if name == "slay-exact-poly":
        return (u @ v.transpose(-1, -2)) ** 2
    if name == "slay-nystrom":
        gram = (m.anchors @ m.anchors.T) ** 2
        reg = gram + m.ridge * gram.diagonal().mean() * torch.eye(m.poly_features, dtype=gram.dtype)
        ku, kv = (u @ m.anchors.T) ** 2, (v @ m.anchors.T) ** 2
        return ku @ torch.linalg.solve(reg, kv.transpose(-1, -2))
    if name == "slay-maclaurin":
        r, s = m.maclaurin_r, m.maclaurin_s
        fu, fv = (u @ r.T) * (u @ s.T), (v @ r.T) * (v @ s.T)
        return fu @ fv.transpose(-1, -2) / m.poly_features
    if name == "slay-tensorsketch":
        fu = tensorsketch(u, m.count_sketch_1, m.count_sketch_2)
        fv = tensorsketch(v, m.count_sketch_1, m.count_sketch_2)
        return fu @ fv.transpose(-1, -2)
    raise KeyError(name)


def explicit_kernel(name, m, q, k):
    """The variant's score matrix phi(q_i) . phi(k_j), rebuilt from the formulas."""
    u, v = unit(q), unit(k)
    _, w = quadrature(m.quad_nodes, m.kernel_eps)
    w = torch.tensor(w).reshape(-1, *[1] * q.dim())
    if name == "slay-laplace":
        return (w * prf_kernels(m, u, v)).sum(0)
    if name == "slay-hadamard":
        s, _ = quadrature(m.quad_nodes, m.kernel_eps)
        pu, pv = u @ m.omega, v @ m.omega
        total = 0
        for s_r, w_r in zip(s, w.flatten().tolist(), strict=True):
            c = math.sqrt(2 * s_r)
            fu, fv = pu**2 * torch.exp(c * pu - s_r), pv**2 * torch.exp(c * pv - s_r)
            total = total + w_r * torch.einsum("...im,...jm->...ij", fu, fv) / m.prf_features
        return total
    return (w * prf_kernels(m, u, v)).sum(0) * poly_kernel(name, m, u, v)


def explicit_attention(name, m, q, k, v, causal):
    kernel = explicit_kernel(name, m, q, k)
    if causal:
        kernel = kernel * torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
    den = kernel.sum(-1, keepdim=True)
    if name in SIGNED:  # keep the sign, at least delta away from zero
        den = torch.where(den < 0, den.clamp(max=-m.delta), den.clamp(min=m.delta))
    else:
        den = den + m.delta
    return kernel @ v / den


# -- quadrature ---------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-3, 1.0])
@pytest.mark.parametrize("quad_nodes", [1, 2, 3, 5, 8])
def test_gauss_laguerre_integrates_moments_exactly(quad_nodes, eps):
    """sum_r w_r s_r^n = int_0^inf e^(-Cs) s^n ds = n! / C^(n+1) for n < 2R."""
    s, w = quadrature(quad_nodes, eps)
    C = 2 + eps
    for n in range(2 * quad_nodes):
        assert (w * s**n).sum() == pytest.approx(math.factorial(n) / C ** (n + 1), rel=1e-10)


def quadrature_errors(eps, xs, nodes=range(1, 9)):
    C = 2 + eps
    exact = xs**2 / (C - 2 * xs)
    errors = []
    for R in nodes:
        s, w = quadrature(R, eps)
        approx = (w[:, None] * xs**2 * np.exp(2 * s[:, None] * xs)).sum(0)
        errors.append(np.abs(approx - exact).max())
    return np.array(errors)


def test_quadrature_error_falls_geometrically_with_nodes():
    """x^2/(C - 2x) ~ sum_r w_r x^2 e^(2 s_r x) for R = 1..8 on x in [-1, 1]: at eps = 1 the
    worst error falls by more than 3x per node, to below 1e-4 at R = 8."""
    errors = quadrature_errors(1.0, np.linspace(-1, 1, 2001))
    assert np.all(np.diff(errors) < 0)
    assert np.all(errors[1:] / errors[:-1] < 0.33)
    assert errors[-1] < 1e-4


def test_quadrature_at_default_eps_converges_away_from_the_peak_only():
    """At eps = 1e-3 the rate depends on x: for |x| <= 0.5 the error falls below 1e-7 by
    R = 8, but near x = 1 the integrand e^(-t (1 - 2x/C)) decays too slowly for any small R:
    the worst error over [-1, 1] stays near the whole peak 1/eps (documented limitation)."""
    inner = quadrature_errors(1e-3, np.linspace(-0.5, 0.5, 1001))
    assert np.all(np.diff(inner) < 0) and inner[-1] < 1e-7
    whole = quadrature_errors(1e-3, np.linspace(-1, 1, 2001))
    assert np.all(np.diff(whole) < 0) and whole[-1] > 0.98 / 1e-3
    s, w = quadrature(2, 1e-3)  # the default R = 2: the discretised kernel at x = 1
    assert (w * np.exp(2 * s)).sum() < 3.0  # against 1 / eps = 1000 for the exact kernel


# -- the PRF identity and the polynomial factors ------------------------------------------


@pytest.mark.parametrize("s", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("cosine", [-0.7, 0.0, 0.4, 0.9])
def test_prf_identity_monte_carlo(cosine, s):
    """E_w[exp(sqrt(2s) w.u - s) exp(sqrt(2s) w.v - s)] = exp(2s u.v) for unit u, v: the
    Gaussian MGF gives e^(-2s) e^(s |u + v|^2) and |u + v|^2 = 2 + 2 u.v."""
    u, v, _ = pairs_with_cosines([cosine])
    w = torch.randn(400_000, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    c = math.sqrt(2 * s)
    samples = torch.exp(c * (w @ u[0]) - s) * torch.exp(c * (w @ v[0]) - s)
    target = math.exp(2 * s * cosine)
    se = samples.std().item() / math.sqrt(len(samples))
    assert se < 0.03 * target  # the check has teeth
    assert abs(samples.mean().item() - target) < 4.5 * se


def test_prf_needs_unit_vectors():
    """Off the sphere the same estimator targets e^(2s u.v + s(|u|^2 + |v|^2 - 2)) instead."""
    s = 0.5
    u, v, x = pairs_with_cosines([0.3])
    u = 1.3 * u
    w = torch.randn(400_000, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    c = math.sqrt(2 * s)
    samples = torch.exp(c * (w @ u[0]) - s) * torch.exp(c * (w @ v[0]) - s)
    off_sphere = math.exp(2 * s * 1.3 * 0.3 + s * (1.3**2 - 1))
    se = samples.std().item() / math.sqrt(len(samples))
    assert abs(samples.mean().item() - off_sphere) < 4.5 * se
    assert abs(off_sphere - math.exp(2 * s * 1.3 * 0.3)) > 20 * se


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("slay", lambda x: 1 + 2 * x**2),  # anchors N(0, I): |u|^2 |v|^2 + 2 (u.v)^2
        ("slay-maclaurin", lambda x: x**2),
        ("slay-tensorsketch", lambda x: x**2),
    ],
)
def test_polynomial_factor_expectation_over_draws(name, expected):
    u, v, x = pairs_with_cosines([-0.6, 0.0, 0.5, 0.9])
    draws = torch.stack(
        [
            (lambda m: (m.polynomial(u) * m.polynomial(v)).sum(-1))(
                build(name, 8, poly_features=64, prf_features=1, seed=seed)
            )
            for seed in range(300)
        ]
    )
    se = draws.std(0) / math.sqrt(len(draws))
    assert torch.all((draws.mean(0) - expected(x)).abs() <= 4.5 * se + 1e-12)
    assert torch.all(se < 0.05 * (1 + expected(x)))  # the check has teeth


def test_exact_polynomial_map_reproduces_the_squared_dot_product():
    m = build("slay-exact-poly", 7)
    g = torch.Generator().manual_seed(5)
    u, v = (torch.randn(9, 7, generator=g, dtype=torch.float64) for _ in range(2))
    assert m.polynomial(u).shape[-1] == m.poly_dim == 7 * 8 // 2
    torch.testing.assert_close(m.polynomial(u) @ m.polynomial(v).T, (u @ v.T) ** 2, **CLOSE)


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_nystrom_is_exact_with_enough_anchors_and_a_projection_otherwise(seed):
    """Nystrom projects (u.v)^2 onto span{a_i a_i^T}: exact once P >= d(d+1)/2, up to a bias
    of about ridge x cond(K_AA) (these seeds' anchor Gram matrices have cond < 1e5); with fewer
    anchors it never overshoots the diagonal (u.u)^2."""
    d = 5
    g = torch.Generator().manual_seed(seed)
    u, v = (torch.randn(9, d, generator=g, dtype=torch.float64) for _ in range(2))
    full = build("slay-nystrom", d, poly_features=d * (d + 1) // 2, ridge=1e-12, seed=seed)
    exact = (u @ v.T) ** 2
    error = (full.polynomial(u) @ full.polynomial(v).T - exact).abs() / (1 + exact)
    assert error.max() < 1e-6
    few = build("slay-nystrom", d, poly_features=6, seed=seed)
    diagonal = (few.polynomial(u) ** 2).sum(-1)
    assert torch.all(diagonal <= (u * u).sum(-1) ** 2 * (1 + 1e-9))


# -- each variant against its explicit kernel ---------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ALL)
def test_matches_explicit_kernel_attention(name, causal):
    """Output and gradients equal kernel-normalised attention with the variant's kernel built
    here from the formulas and the module's draws; chunk_size 8 crosses chunks."""
    params = {"seed": 7, "chunk_size": 8, "quad_nodes": 3}
    m = build(name, **params)
    assert_matches_reference(
        m,
        lambda q, k, v, causal: explicit_attention(name, m, q, k, v, causal),
        causal,
        inputs=qkv(seed=2, requires_grad=True),
        weight=torch.randn(
            B, H, L, D, generator=torch.Generator().manual_seed(8), dtype=torch.float64
        ),
        tol=CLOSE,
    )


# -- the blocked short path (attend_to_factored_scores) ------------------------------------

BLOCKINGS = {
    "one-block": {},  # the defaults: all 3 batch rows in a block, rows 64 at a time past 96
    "row-by-row": {"BLOCK_BYTES": 1},  # one batch row per block
    "chunked": {"BLOCK_BYTES": 1, "ROW_CHUNK": 8, "ROW_CHUNK_FROM": 16},  # rows 8 at a time
}


def blocking(monkeypatch, layout):
    for attribute, value in BLOCKINGS[layout].items():
        monkeypatch.setattr(linear_attention, attribute, value)


@pytest.mark.parametrize("layout", sorted(BLOCKINGS))
@pytest.mark.parametrize("length", [1, 2, 16, 17, 47, 97, 130])
@pytest.mark.parametrize("name", ALL)
def test_blocked_short_path_matches_explicit_kernel(name, length, layout, monkeypatch):
    """The causal short path, block by block of batch rows and (in the backward) chunk by
    chunk of query rows, equals attention with the kernel built from the formulas, forward
    and backward, float64: lengths on both sides of a chunk's edge (16, 17), a last chunk
    of 1 row (17 at chunks of 8) and lengths past the default chunking (97, 130: 64 + 33,
    64 + 64 + 2), with 3 batch rows split into blocks of one."""
    blocking(monkeypatch, layout)
    m = build(name, seed=7, quad_nodes=3, prf_features=48)  # feature_dim >= 144
    assert length <= m.feature_dim
    g = torch.Generator().manual_seed(length)
    inputs = tuple(
        torch.randn(3, H, length, D, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    )
    assert_matches_reference(
        m,
        lambda q, k, v, causal: explicit_attention(name, m, q, k, v, causal),
        True,
        inputs=inputs,
        weight=torch.randn(3, H, length, D, generator=g, dtype=torch.float64),
        tol=CLOSE,
    )


@pytest.mark.parametrize("wanted", ["q", "k", "v", "qk", "kv"])
@pytest.mark.parametrize("name", ["slay", "slay-exact-poly", "slay-laplace", "slay-maclaurin"])
def test_blocked_short_path_equals_the_plain_scores_path(name, wanted, monkeypatch):
    """The previous short path, autograd through ``attend_to_scores(scores(q, k), ...)``
    on the whole batch's (L x L) scores, and the blocked one agree in float64, forward and
    for any subset of the inputs asking for a gradient."""
    blocking(monkeypatch, "chunked")
    m = build(name, seed=3)
    q, k, v = qkv(length=37, seed=11)
    inputs = {
        n: t.clone().requires_grad_(n in wanted) for n, t in zip("qkv", (q, k, v), strict=True)
    }
    leaves = [inputs[n] for n in wanted]
    weight = torch.randn(B, H, 37, D, generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    blocked = m(*inputs.values())
    plain = attend_to_scores(m.scores(inputs["q"], inputs["k"]), inputs["v"], True, m.eps, m.signed)
    torch.testing.assert_close(blocked, plain, **CLOSE)
    for a, b in zip(
        torch.autograd.grad((blocked * weight).sum(), leaves),
        torch.autograd.grad((plain * weight).sum(), leaves),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **CLOSE)


@pytest.mark.parametrize("name", ALL)
def test_hand_written_factor_gradients_equal_autograd(name, monkeypatch):
    """The blocked backward takes the factors' gradient to q and k by hand where a variant
    has it (``score_factors_vjp``; not Maclaurin's or TensorSketch's polynomial), else by
    autograd through ``score_factors``: both give the same gradients, float64."""
    blocking(monkeypatch, "row-by-row")
    m = build(name, seed=9)
    assert (m.score_factors_vjp(*qkv(length=3)[:2]) is not None) == m.hand_gradients
    assert m.hand_gradients == (name not in ("slay-maclaurin", "slay-tensorsketch"))
    inputs = qkv(length=29, seed=12, requires_grad=True)
    weight = torch.randn(
        B, H, 29, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    hand = torch.autograd.grad((m(*inputs) * weight).sum(), inputs)
    monkeypatch.setattr(m, "score_factors_vjp", lambda q, k: None)
    by_autograd = torch.autograd.grad((m(*inputs) * weight).sum(), inputs)
    for a, b in zip(hand, by_autograd, strict=True):
        torch.testing.assert_close(a, b, **CLOSE)


@pytest.mark.parametrize("offset", [-1, 0, 1], ids=["F-1", "F", "F+1"])
@pytest.mark.parametrize("name", ALL)
def test_both_sides_of_the_feature_count_match_explicit_kernel(name, offset):
    """Up to L = feature_dim the blocked short path, past it the chunked core on the
    explicit features: both equal the kernel from the formulas, forward and backward."""
    m = build(name, seed=5)
    length = m.feature_dim + offset
    g = torch.Generator().manual_seed(2)
    inputs = tuple(
        torch.randn(1, 1, length, D, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    )
    assert_matches_reference(
        m,
        lambda q, k, v, causal: explicit_attention(name, m, q, k, v, causal),
        True,
        inputs=inputs,
        tol=CLOSE,
    )


def plain_unit_features(m, x):
    """unit_features written with autograd's own operations: F.normalize, exp."""
    u = torch.nn.functional.normalize(x, dim=-1)
    s, w = quadrature(m.quad_nodes, m.kernel_eps)
    projection = u @ m.omega
    prf = torch.cat(
        [torch.exp(math.sqrt(2 * s_r) * projection - s_r) * math.sqrt(w_r / m.prf_features)
         for s_r, w_r in zip(s, w, strict=True)],
        dim=-1,
    )  # fmt: skip
    poly = m.squared_projection()
    sq = (u @ poly) ** 2 if poly is not None else u[..., :0]
    return u, sq, prf


@pytest.mark.parametrize("name", ["slay", "slay-nystrom", "slay-hadamard", "slay-laplace"])
def test_unit_features_match_autograd_of_the_plain_formulas(name):
    """unit_features' hand-written backward equals autograd through F.normalize, the
    projections and exp (the PRF in base e), float64, with a zero row (F.normalize's clamp:
    there the gradient is du / 1e-12) and rows of very different norms."""
    m = build(name, seed=4)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 9, D, generator=g, dtype=torch.float64)
    x[0, 0, 0] = 0
    x[0, 1, 2] *= 1e-6
    x[1, 2, 3] *= 1e6
    poly = m.squared_projection()
    widths = [D, 0 if poly is None else poly.shape[-1], m.quad_nodes * m.prf_features]
    weights = [torch.randn(2, 3, 9, n, generator=g, dtype=torch.float64) for n in widths]
    results = []
    for features in (m.unit_features, lambda x: plain_unit_features(m, x)):
        leaf = x.clone().requires_grad_()
        outputs = features(leaf)
        total = sum((o * w).sum() for o, w in zip(outputs, weights, strict=True))
        results.append((outputs, torch.autograd.grad(total, leaf)[0]))
    (ours, our_grad), (plain, plain_grad) = results
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b, **CLOSE)
    scale = plain_grad.abs().amax(-1, keepdim=True)  # rows from 1e-6 to 1e12 in size
    assert scale[0, 0, 0].item() > 1e10  # the zero row: du / 1e-12
    torch.testing.assert_close(our_grad / scale, plain_grad / scale, **CLOSE)


def test_feature_weights_follow_the_buffers():
    """unit_features keeps its weights between calls: loading another draw's buffers (in
    place) or moving to float64 must not reuse stale ones."""
    q, k, v = (t.float() for t in qkv(seed=13))
    a, b = build("slay", seed=1), build("slay", seed=2)
    before = a(q, k, v)
    a.load_state_dict(b.state_dict())
    torch.testing.assert_close(a(q, k, v), b(q, k, v), rtol=0, atol=0)
    assert not torch.allclose(a(q, k, v), before)
    q64, k64, v64 = qkv(seed=13)
    torch.testing.assert_close(a.double()(q64, k64, v64), b.double()(q64, k64, v64), **CLOSE)


@pytest.mark.parametrize("name", ALL)
def test_feature_dim_state_size_and_flags(name):
    m = build(name)
    assert isinstance(m, FeatureMapMechanism)
    phi = m.feature_map(qkv(seed=1)[0], is_query=True)
    poly = {"slay-exact-poly": D * (D + 1) // 2, "slay-laplace": 1, "slay-hadamard": 1}
    assert phi.shape == (B, H, L, m.feature_dim)
    assert m.feature_dim == 2 * poly.get(name, 8) * 16  # R = 2, P = 8, M = 16
    assert m.state_size(10_000) == m.feature_dim * (D + 1)
    assert m.signed == (name in SIGNED)
    assert MECHANISMS.entry(name).metadata["complexity"] == "linear"


def test_defaults_follow_the_paper():
    """001 Table 9 (eps 1e-3, M_PRF 16, M_poly 8) and Table 6 (R = 2)."""
    common = {"quad_nodes": 2, "prf_features": 16, "eps": 1e-3, "delta": 1e-6, "seed": None}
    common["chunk_size"] = 64
    assert mechanism_params(MECHANISMS.get("slay")) == {**common, "poly_features": 8}
    assert mechanism_params(MECHANISMS.get("slay-nystrom")) == {
        **common,
        "poly_features": 8,
        "ridge": 1e-3,
    }
    for name in ["slay-exact-poly", "slay-laplace", "slay-hadamard"]:
        assert mechanism_params(MECHANISMS.get(name)) == common
    m = build("slay")
    assert (m.kernel_eps, m.delta, m.eps) == (1e-3, 1e-6, 1e-6)  # the core divides by eps = delta


# -- expectation over draws and convergence -----------------------------------------------


def expected_kernels(quad_nodes, eps, x):
    """E over all draws of phi(u).phi(v), per variant, as sums over the quadrature nodes."""
    s, w = quadrature(quad_nodes, eps)

    def mix(factor):
        return sum(
            w_r * factor(s_r) * torch.exp(2 * s_r * x) for s_r, w_r in zip(s, w, strict=True)
        )

    quadrature_yat = mix(lambda s_r: x**2)  # the discretised spherical Yat kernel
    return {
        "slay-exact-poly": quadrature_yat,
        "slay-maclaurin": quadrature_yat,
        "slay-tensorsketch": quadrature_yat,
        "slay": mix(lambda s_r: 1 + 2 * x**2),
        "slay-laplace": mix(lambda s_r: 1),
        "slay-hadamard": mix(
            lambda s: 1 + 2 * x**2 + 2 * s * (1 + x) ** 2 * (2 + 4 * x) + 4 * s**2 * (1 + x) ** 4
        ),
    }


@pytest.mark.parametrize(
    ("quad_nodes", "cosines"),
    [(1, [-0.6, 0.0, 0.3, 0.8, 0.95]), (2, [-0.6, -0.2, 0.0])],
    ids=["R1", "R2"],
)
@pytest.mark.parametrize("name", POSITIVE + EXACT + ["slay-maclaurin", "slay-tensorsketch"])
def test_kernel_expectation_over_seeds(name, quad_nodes, cosines):
    """The mean over 300 seeds of phi(u).phi(v) matches the expected kernel to within 4.5
    standard errors, and the spread shrinks as the features grow. For exact-poly (only PRF
    noise), Maclaurin and TensorSketch the target is the quadrature-discretised spherical Yat
    kernel; anchors add 1 + 2x^2 in place of x^2; Hadamard its own kernel (see its class).
    (Near x = 1 at the larger node the lognormal PRF tails need far more draws than a test
    affords, hence the smaller cosines at R = 2.)"""
    u, v, x = pairs_with_cosines(cosines)
    target = expected_kernels(quad_nodes, 1e-3, x)[name]
    spread = {}
    for prf_features, poly_features in [(16, 8), (256, 64)]:
        params = {"quad_nodes": quad_nodes, "prf_features": prf_features}
        if name in ("slay", "slay-maclaurin", "slay-tensorsketch"):
            params["poly_features"] = poly_features
        draws = torch.stack(
            [pair_kernel(build(name, 8, seed=seed, **params), u, v) for seed in range(300)]
        )
        se = draws.std(0) / math.sqrt(len(draws))
        assert torch.all((draws.mean(0) - target).abs() <= 4.5 * se + 1e-12), (prf_features, se)
        spread[prf_features] = draws.std(0)
    assert torch.all(spread[256] <= spread[16] / 2 + 1e-12)


def reference_spherical(q, k, v, causal, kernel_of_cosine, delta=1e-6):
    x = unit(q) @ unit(k).transpose(-1, -2)
    kernel = kernel_of_cosine(x)
    if causal:
        kernel = kernel * torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
    return kernel @ v / (kernel.sum(-1, keepdim=True) + delta)


def relative_error(a, b):
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_exact_poly_approaches_spherical_yat_attention(causal):
    """eps = 1 (where R = 4 nodes resolve the kernel to 5e-4): with more PRF features the
    outputs approach exact spherical Yat attention x^2 / (3 - 2x)."""
    d, eps = 4, 1.0
    q, k, v = (t[:1] for t in qkv(length=16, seed=3, head_dim=d))

    def exact(x):
        return x**2 / (2 + eps - 2 * x)

    expected = reference_spherical(q, k, v, causal, exact)
    errors = {
        features: np.mean(
            [
                relative_error(
                    build(
                        "slay-exact-poly", d, quad_nodes=4, prf_features=features, eps=eps, seed=s
                    )(q, k, v, causal),
                    expected,
                )
                for s in range(2)
            ]
        )
        for features in (64, 4096)
    }
    assert errors[4096] < 0.08 and errors[4096] < errors[64] / 2.5, errors


def test_anchor_slay_approaches_its_own_kernel_not_spherical_yat():
    """Anchor features estimate 1 + 2x^2, so with many anchors and PRFs slay's outputs approach
    attention with the kernel (1 + 2x^2) / (C - 2x), not x^2 / (C - 2x)."""
    d, eps = 4, 1.0
    C = 2 + eps
    q, k, v = (t[:1] for t in qkv(length=16, seed=3, head_dim=d))
    m = build("slay", d, quad_nodes=4, prf_features=256, poly_features=256, eps=eps, seed=0)
    out = m(q, k, v, True)
    to_anchor = relative_error(
        out, reference_spherical(q, k, v, True, lambda x: (1 + 2 * x**2) / (C - 2 * x))
    )
    to_yat = relative_error(out, reference_spherical(q, k, v, True, lambda x: x**2 / (C - 2 * x)))
    assert to_anchor < 0.2 and to_yat > 2 * to_anchor


# -- signs --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", POSITIVE)
def test_features_are_non_negative(name):
    q, k, _ = qkv(seed=4)
    m = build(name, seed=0)
    for x in (q, 5 * k, torch.zeros_like(q)):
        assert m.feature_map(x, is_query=True).min() >= 0


def test_exact_poly_scores_are_non_negative():
    """vec(u u^T) has signed entries, but its scores (u.v)^2 times PRF kernels are >= 0."""
    q, k, _ = qkv(seed=5)
    m = build("slay-exact-poly", seed=0)
    scores = m.feature_map(q, True) @ m.feature_map(k, False).transpose(-1, -2)
    assert scores.min() >= -1e-12 * scores.abs().max()
    assert m.feature_map(q, True).min() < 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", SIGNED)
def test_signed_variants_give_negative_scores_and_stay_finite(name, dtype):
    q, k, v = qkv(seed=6, dtype=dtype)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    negative_scores = negative_denominators = False
    for seed in range(4):
        m = build(name, seed=seed)
        phi_q, phi_k = m.feature_map(q, True), m.feature_map(k, False)
        scores = (phi_q @ phi_k.transpose(-1, -2)).tril()
        negative_scores |= bool((scores < 0).any())
        negative_denominators |= bool((scores.sum(-1) < 0).any())
        for causal in (True, False):
            out = m(q, k, v, causal=causal)
            grads = torch.autograd.grad(out.sum(), (q, k, v))
            assert out.isfinite().all() and all(g.isfinite().all() for g in grads)
    assert negative_scores and negative_denominators


# -- seeds, parameters, dtypes, devices ---------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_seed_determinism(name):
    q, k, v = qkv(seed=9)
    a, b, c = build(name, seed=3), build(name, seed=3), build(name, seed=4)
    assert a.state_dict().keys() == b.state_dict().keys() and "omega" in a.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert not torch.equal(a.omega, c.omega)
    assert torch.equal(a(q, k, v), b(q, k, v))
    # seed None draws from torch's global RNG: reproducible after torch.manual_seed
    with torch.random.fork_rng():
        torch.manual_seed(11)
        first = build(name)
        torch.manual_seed(11)
        second, third = build(name), build(name)
    assert torch.equal(first.omega, second.omega) and not torch.equal(first.omega, third.omega)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "params",
    [
        {"quad_nodes": 0},
        {"quad_nodes": 65},
        {"quad_nodes": 2.0},
        {"quad_nodes": True},
        {"prf_features": 0},
        {"eps": 0.0},
        {"eps": -1e-3},
        {"delta": 0.0},
        {"seed": -1},
        {"seed": 1.5},
        {"seed": "abc"},
        {"chunk_size": 0},
    ],
    ids=str,
)
def test_invalid_parameters_are_refused(name, params):
    with pytest.raises(ValueError):
        build(name, **params)


@pytest.mark.parametrize("name", ["slay", "slay-nystrom", "slay-tensorsketch", "slay-maclaurin"])
@pytest.mark.parametrize("value", [0, -3, 2.5])
def test_invalid_poly_features_are_refused(name, value):
    with pytest.raises(ValueError):
        build(name, poly_features=value)


@pytest.mark.parametrize("value", [0.0, -1e-3])
def test_invalid_ridge_is_refused(value):
    with pytest.raises(ValueError):
        build("slay-nystrom", ridge=value)


@pytest.mark.parametrize("name", ALL)
def test_bfloat16_inputs_return_bfloat16(name):
    q, k, v = (t.to(torch.bfloat16) for t in qkv(seed=10, dtype=torch.float32))
    out = build(name, seed=0)(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ALL)
def test_cuda_matches_cpu(name):
    q, k, v = qkv(seed=12, dtype=torch.float32)
    m = build(name, seed=0)
    expected = m(q, k, v, causal=True)
    out = m.to("cuda")(q.cuda(), k.cuda(), v.cuda(), causal=True)
    assert out.device.type == "cuda"
    tol = {"rtol": 1e-3, "atol": 1e-3} if name in SIGNED else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(out.cpu(), expected, **tol)
    bf16 = m(*(t.cuda().to(torch.bfloat16) for t in (q, k, v)), causal=True)
    assert bf16.dtype == torch.bfloat16 and bf16.isfinite().all()


def test_factored_mechanism_with_learnable_parameter_takes_the_plain_path():
    """The blocked short path differentiates q, k and v only. A factored mechanism that
    learns a parameter (a plugin subclassing SLAY with a learned query scale) must take the
    plain scores path, so that the parameter gets its gradient, equal in float64 to autograd
    through ``attend_to_scores``."""

    class ScaledSLAY(type(build("slay", seed=3))):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.scale = torch.nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

        def score_factors(self, q, k):
            return super().score_factors(q * self.scale, k)

        def scores(self, q, k):
            return super().scores(q * self.scale, k)

    m = ScaledSLAY(D, H, seed=3)
    q, k, v = qkv(length=19, seed=5)
    out = m(q, k, v)
    plain = attend_to_scores(m.scores(q, k), v, True, m.eps, m.signed)
    torch.testing.assert_close(out, plain, **CLOSE)
    (grad,) = torch.autograd.grad(out.sum(), [m.scale])
    (expected,) = torch.autograd.grad(plain.sum(), [m.scale])
    assert grad.abs() > 0
    torch.testing.assert_close(grad, expected, **CLOSE)
