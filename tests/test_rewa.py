"""rewa-geometric, rewa-rff and rewa-operator (REWA 002) against references written here from
the definitions: the Poincare distance against its arccosh and Mobius-addition forms, the
mechanisms against naive forms that build every pairwise difference, the spherical-only
setting against cosine attention, the RFF estimate against the Gaussian kernel; finiteness
at q = k and at the edge of the ball; causality with trained-looking parameters; the
initial weights; parameter checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_mechanisms import assert_matches_reference

from synthbench.core.mechanism import MECHANISMS, mechanism_params
from synthbench.mechanisms.rewa import (
    GEOMETRIES,
    PARTS,
    ball_max_norm,
    poincare_distance,
    to_poincare_ball,
)

B, H, L, D = 2, 3, 23, 8
CLOSE = {"atol": 1e-10, "rtol": 1e-9}


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The models here are tiny: one intra-op thread is faster on a shared machine."""


def qkv(length=L, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (scale * torch.randn(B, H, length, D, generator=g, dtype=dtype)).requires_grad_(
            requires_grad
        )
        for _ in range(3)
    )


def build(name, **params):
    torch.manual_seed(0)
    return MECHANISMS.get(name)(D, H, **params)


def perturb(mechanism, seed=1, scale=0.5):
    """Move every learned parameter away from its initial value, differently per head."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mechanism.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return mechanism


def causal_mask(length):
    return torch.ones(length, length, dtype=torch.bool).tril()


def attend(distance, tau, v, causal):
    """softmax(-distance / tau) v, tau per head, with the causal mask."""
    logits = -distance / tau.view(-1, 1, 1)
    if causal:
        logits = logits.masked_fill(~causal_mask(logits.shape[-1]), float("-inf"))
    return logits.softmax(-1) @ v


def pairwise_differences(a, b):
    """(..., L, p), (..., S, p) -> (..., L, S, p): a_i - b_j, every pair built explicitly."""
    return a.unsqueeze(-2) - b.unsqueeze(-3)


def ball_points(n, p, seed, max_radius=0.999):
    """n random points of the open p-ball, radii spread up to max_radius, float64."""
    g = torch.Generator().manual_seed(seed)
    direction = F.normalize(torch.randn(n, p, generator=g, dtype=torch.float64), dim=-1)
    radius = max_radius * torch.rand(n, 1, generator=g, dtype=torch.float64) ** 0.5
    return direction * radius


# -- the Poincare distance ------------------------------------------------------------------


def mobius_add(x, y):
    """x (+) y in the Poincare ball of curvature -1."""
    xy = (x * y).sum(-1, keepdim=True)
    x2, y2 = (x * x).sum(-1, keepdim=True), (y * y).sum(-1, keepdim=True)
    return ((1 + 2 * xy + y2) * x + (1 - x2) * y) / (1 + 2 * xy + x2 * y2)


def test_poincare_distance_matches_arccosh_and_mobius_forms():
    u, w = ball_points(40, 5, seed=1), ball_points(30, 5, seed=2)
    w[:5] = u[:5] + 1e-3 * ball_points(5, 5, seed=3)  # close pairs too
    distance = poincare_distance(u, w)

    sq = pairwise_differences(u, w).square().sum(-1)
    gap_u, gap_w = 1 - (u * u).sum(-1), 1 - (w * w).sum(-1)
    arccosh_form = torch.acosh(1 + 2 * sq / (gap_u[:, None] * gap_w[None, :]))
    torch.testing.assert_close(distance, arccosh_form, **CLOSE)

    mobius = mobius_add(-u.unsqueeze(1), w.unsqueeze(0))  # (-u_i) (+) w_j
    mobius_form = 2 * torch.atanh(torch.linalg.vector_norm(mobius, dim=-1))
    torch.testing.assert_close(distance, mobius_form, atol=1e-9, rtol=1e-9)
    assert distance.diagonal()[:5].min() > 0  # distinct close points stay apart


def test_exponential_map_lands_in_the_ball():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64) * torch.logspace(-3, 4, 200)[:, None]
    u = to_poincare_ball(x)
    norm = torch.linalg.vector_norm(u, dim=-1)
    max_norm = ball_max_norm(torch.float64)
    expected = torch.tanh(torch.linalg.vector_norm(x, dim=-1)).clamp(max=max_norm)
    torch.testing.assert_close(norm, expected, **CLOSE)
    torch.testing.assert_close(F.normalize(u, dim=-1), F.normalize(x, dim=-1), **CLOSE)
    assert torch.equal(to_poincare_ball(torch.zeros(6)), torch.zeros(6))
    assert norm[-1].item() == pytest.approx(max_norm, abs=1e-12)  # huge input: the clamp
    assert 1 - ball_max_norm(torch.float32) > 1e-3 > 1 - max_norm  # float32 stays further in


# -- finite values and gradients at the singular points ------------------------------------


SINGULAR_INPUTS = {"zero": 0.0, "unit": 1.0, "huge": 1e4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", SINGULAR_INPUTS.values(), ids=SINGULAR_INPUTS.keys())
@pytest.mark.parametrize("part", PARTS)
def test_part_distance_finite_with_finite_gradients_at_equal_points(part, scale, dtype):
    """d(a, a) (a clamped arccos argument, sqrt of ~0, the ball's clamp for huge inputs) is
    finite with finite gradients, and small next to the distances between other points."""
    to_space, distance = GEOMETRIES[part]
    x = scale * torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(5), dtype=dtype)
    x.requires_grad_(True)
    a = to_space(x)
    d = distance(a, a)
    (grad,) = torch.autograd.grad(d.sum(), x)
    assert d.isfinite().all() and grad.isfinite().all()
    if scale:  # (0 has no direction: the spherical part puts it at pi/2 from everything)
        off_diagonal = d.masked_select(~torch.eye(7, dtype=torch.bool))
        assert d.diagonal(dim1=-2, dim2=-1).max() <= 0.05 * off_diagonal.median() + 2e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", SINGULAR_INPUTS.values(), ids=SINGULAR_INPUTS.keys())
@pytest.mark.parametrize("name", ["rewa-geometric", "rewa-rff", "rewa-operator"])
def test_mechanism_finite_with_finite_gradients_at_q_equal_k(name, scale, dtype):
    """q = k with the key maps set to the query maps (every witness pair equal on the
    diagonal), for zero, ordinary and huge inputs (the last on the ball's clamp)."""
    mechanism = build(name)
    with torch.no_grad():
        for key, param in mechanism.named_parameters():
            if "key_map" in key:
                param.copy_(mechanism.get_parameter(key.replace("key_map", "query_map")))
    q, _, v = qkv(seed=6, dtype=dtype, scale=scale)
    q, v = q.requires_grad_(True), v.requires_grad_(True)
    k = q.detach().clone().requires_grad_(True)
    params = list(mechanism.parameters())
    out = mechanism(q, k, v, causal=True)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *params], allow_unused=True)
    assert out.isfinite().all()
    assert all(g is None or g.isfinite().all() for g in grads)


# -- causality and the initial values -------------------------------------------------------


@pytest.mark.parametrize("t", [0, 9, 21])
def test_geometric_causal_with_perturbed_parameters(t):
    mechanism = perturb(build("rewa-geometric"))
    inputs = qkv(seed=7)
    perturbed = [x.clone() for x in inputs]
    g = torch.Generator().manual_seed(t)
    for x in perturbed:
        x[:, :, t + 1 :] = 3 * torch.randn(x[:, :, t + 1 :].shape, generator=g, dtype=x.dtype)
    out, out_perturbed = mechanism(*inputs), mechanism(*perturbed)
    torch.testing.assert_close(out_perturbed[:, :, : t + 1], out[:, :, : t + 1], atol=0, rtol=0)
    assert not torch.allclose(out_perturbed[:, :, t + 1 :], out[:, :, t + 1 :])


def test_geometric_starts_at_the_papers_intended_weights():
    """002 eqs. 100-102 after the softplus (not softplus of them, as 002's code does)."""
    mechanism = build("rewa-geometric", euclidean_dim=16, hyperbolic_dim=9, tau=0.5)
    expected = {"euclidean": 1 / 4, "spherical": 1.0, "hyperbolic": 1 / 3}
    for part, value in expected.items():
        torch.testing.assert_close(mechanism.weight(part), torch.full((H,), value))
    torch.testing.assert_close(mechanism.tau, torch.full((H,), 0.5))
    assert mechanism.query_maps["euclidean"].shape == (H, D, 16)
    assert mechanism.key_maps["spherical"].shape == (H, D, D)  # None: head_dim
    assert mechanism.query_maps["euclidean"] is not mechanism.key_maps["euclidean"]


def test_defaults():
    assert mechanism_params(MECHANISMS.get("rewa-geometric")) == {
        "parts": PARTS,
        "euclidean_dim": None,
        "spherical_dim": None,
        "hyperbolic_dim": None,
        "tau": 1.0,
    }
    assert mechanism_params(MECHANISMS.get("rewa-rff")) == {
        "nb_features": 256,
        "bandwidth": None,
        "tau": 0.1,
        "seed": None,
    }
    assert mechanism_params(MECHANISMS.get("rewa-operator")) == {"m": 4, "tau": None}
    torch.testing.assert_close(build("rewa-operator", m=3).tau, torch.full((H,), 3.0))
    for alias in ("rewa", "geometric-rewa", "rewa-functional", "operator-rewa"):
        assert MECHANISMS.canonical(alias).startswith("rewa-")


# -- rewa-geometric against explicit references ---------------------------------------------


def reference_geometric(mechanism, q, k, v, causal):
    """Every part from the raw parameters with explicit (L, L, dim) differences."""
    total = 0
    for part in mechanism.parts:
        a = torch.einsum("bhld,hdp->bhlp", q, mechanism.query_maps[part].double())
        b = torch.einsum("bhld,hdp->bhlp", k, mechanism.key_maps[part].double())
        if part == "euclidean":
            distance = torch.linalg.vector_norm(pairwise_differences(a, b), dim=-1)
        elif part == "spherical":
            products = a.unsqueeze(-2) * b.unsqueeze(-3)
            norms = torch.linalg.vector_norm(a, dim=-1)[..., :, None]
            norms = norms * torch.linalg.vector_norm(b, dim=-1)[..., None, :]
            distance = torch.acos(products.sum(-1) / norms)
        else:
            u, w = (
                torch.tanh(x.norm(dim=-1, keepdim=True)) * F.normalize(x, dim=-1) for x in (a, b)
            )
            assert max(u.norm(dim=-1).max(), w.norm(dim=-1).max()) < ball_max_norm(u.dtype)
            sq = pairwise_differences(u, w).square().sum(-1)
            gaps = (1 - u.square().sum(-1))[..., :, None] * (1 - w.square().sum(-1))[..., None, :]
            distance = torch.acosh(1 + 2 * sq / gaps)
        total = total + F.softplus(mechanism.raw_weights[part].double()).view(-1, 1, 1) * distance
    return attend(total, F.softplus(mechanism.raw_tau.double()), v, causal)


@pytest.mark.parametrize("parts", [PARTS, ("hyperbolic",), ("euclidean", "spherical")])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_geometric_matches_explicit_reference(causal, parts):
    """Forward and backward (q, k, v) in float64, parameters moved off their initial values."""
    mechanism = perturb(build("rewa-geometric", parts=parts, euclidean_dim=5, hyperbolic_dim=3))
    assert_matches_reference(
        mechanism,
        lambda q, k, v, causal: reference_geometric(mechanism, q, k, v, causal),
        causal,
        inputs=qkv(seed=8, requires_grad=True, scale=0.5),
        tol=CLOSE,
    )


def test_spherical_only_is_cosine_attention():
    """parts=("spherical",): softmax(-beta arccos(cos) / tau), cos between the query's and
    the key's witnesses, and weights ranked exactly as the cosines."""
    mechanism = perturb(build("rewa-geometric", parts="spherical"))
    assert set(mechanism.raw_weights) == {"spherical"}
    q, k, _ = qkv(seed=9)
    a = F.normalize(q @ mechanism.query_maps["spherical"].double(), dim=-1)
    b = F.normalize(k @ mechanism.key_maps["spherical"].double(), dim=-1)
    cosine = a @ b.transpose(-1, -2)
    beta = F.softplus(mechanism.raw_weights["spherical"].double()).view(-1, 1, 1)
    tau = F.softplus(mechanism.raw_tau.double())
    weights = torch.eye(L, dtype=torch.float64).expand(B, H, L, L)  # v = I: out = weights
    for causal in (True, False):
        out = mechanism(q, k, weights, causal=causal)
        expected = attend(beta * torch.acos(cosine), tau, weights, causal)
        torch.testing.assert_close(out, expected, **CLOSE)
    out = mechanism(q, k, weights, causal=False)
    assert torch.equal(out.argsort(dim=-1), cosine.argsort(dim=-1))


# -- rewa-rff ---------------------------------------------------------------------------------


def gaussian_kernel(x, y, bandwidth):
    return torch.exp(-pairwise_differences(x, y).square().sum(-1) / (2 * bandwidth**2))


def rff_estimate(nb_features, seed, x, y, bandwidth=1.5):
    mechanism = MECHANISMS.get("rewa-rff")(
        D, H, nb_features=nb_features, bandwidth=bandwidth, seed=seed
    )
    return mechanism.feature_map(x) @ mechanism.feature_map(y).T


def test_rff_estimate_converges_to_the_gaussian_kernel():
    g = torch.Generator().manual_seed(10)
    x, y = (torch.randn(12, D, generator=g, dtype=torch.float64) for _ in "xy")
    y[:4] = x[:4] + 0.3 * torch.randn(4, D, generator=g, dtype=torch.float64)
    kernel = gaussian_kernel(x, y, 1.5)
    errors = [
        max((rff_estimate(n, seed, x, y) - kernel).abs().max().item() for seed in range(3))
        for n in (64, 1024, 16384)
    ]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < errors[0] / 4 and errors[2] < 0.05  # about 1/sqrt(D): 16x smaller


def test_rff_estimate_is_unbiased_over_seeds():
    """The mean over 400 seeds of a 16-feature estimate sits within 5 standard errors of the
    kernel (002's eq. 127 scaling would sit at twice the kernel, Algorithm 5's at half)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, D, generator=g, dtype=torch.float64)
    y = x + torch.rand(6, 1, generator=g, dtype=torch.float64) * torch.randn(6, D, generator=g)
    kernel = gaussian_kernel(x, y, 1.5).diagonal()
    estimates = torch.stack([rff_estimate(16, seed, x, y).diagonal() for seed in range(400)])
    standard_error = estimates.std(dim=0) / math.sqrt(len(estimates))
    assert ((estimates.mean(dim=0) - kernel).abs() < 5 * standard_error).all()
    assert kernel.min() > 0.05  # pairs where a factor of 2 would show


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rff_matches_explicit_reference(causal):
    """softmax(phi(q) . phi(k) / tau) with phi written out from the frequencies and phases."""
    mechanism = perturb(build("rewa-rff", nb_features=32))
    W, b = mechanism.frequencies, mechanism.phases
    s = D**0.25

    def reference(q, k, v, causal):
        phi_q, phi_k = (math.sqrt(2 / 32) * torch.cos(x @ W.T / s + b) for x in (q, k))
        similarity = torch.einsum("bhif,bhjf->bhij", phi_q, phi_k)
        return attend(-similarity, F.softplus(mechanism.raw_tau.double()), v, causal)

    assert_matches_reference(
        mechanism, reference, causal, inputs=qkv(seed=12, requires_grad=True), tol=CLOSE
    )


# -- rewa-operator ----------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_operator_matches_frobenius_norm_of_explicit_differences(causal, m):
    mechanism = perturb(build("rewa-operator", m=m, tau=2.0))

    def reference(q, k, v, causal):
        a = (q @ mechanism.query_map.double()).unflatten(-1, (m, m))  # (B, H, L, m, m)
        b = (k @ mechanism.key_map.double()).unflatten(-1, (m, m))
        differences = a[:, :, :, None] - b[:, :, None, :]  # (B, H, L, L, m, m)
        distance = torch.linalg.matrix_norm(differences, ord="fro").square()
        return attend(distance, F.softplus(mechanism.raw_tau.double()), v, causal)

    assert_matches_reference(
        mechanism, reference, causal, inputs=qkv(seed=13, requires_grad=True), tol=CLOSE
    )
    assert mechanism.operators(qkv()[0], True).shape == (B, H, L, m, m)


# -- parameters -------------------------------------------------------------------------------


def test_parts_accepts_a_comma_separated_string():
    assert build("rewa-geometric", parts="euclidean, hyperbolic").parts == (
        "euclidean",
        "hyperbolic",
    )
    assert build("rewa-geometric", parts=["spherical"]).parts == ("spherical",)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("rewa-geometric", {"parts": ()}),
        ("rewa-geometric", {"parts": ("euclidean", "toroidal")}),
        ("rewa-geometric", {"parts": ("spherical", "spherical")}),
        ("rewa-geometric", {"parts": 3}),
        ("rewa-geometric", {"euclidean_dim": 0}),
        ("rewa-geometric", {"hyperbolic_dim": 2.5}),
        ("rewa-geometric", {"tau": 0.0}),
        ("rewa-geometric", {"tau": -1.0}),
        ("rewa-geometric", {"tau": math.inf}),
        ("rewa-geometric", {"tau": math.nan}),
        ("rewa-geometric", {"tau": "warm"}),
        ("rewa-rff", {"nb_features": 0}),
        ("rewa-rff", {"bandwidth": 0.0}),
        ("rewa-rff", {"bandwidth": math.inf}),
        ("rewa-rff", {"tau": 0.0}),
        ("rewa-rff", {"seed": -1}),
        ("rewa-operator", {"m": 0}),
        ("rewa-operator", {"m": True}),
        ("rewa-operator", {"tau": -2.0}),
    ],
)
def test_invalid_parameters_are_refused_in_one_line(name, params):
    with pytest.raises(ValueError) as error:
        MECHANISMS.get(name)(D, H, **params)
    message = str(error.value)
    assert message and "\n" not in message
    assert next(iter(params)) in message
