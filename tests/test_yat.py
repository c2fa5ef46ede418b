"""yat and yat-spherical against explicit references written here from the formulas, and the
kernels' properties: symmetry, zero for orthogonal vectors, the value at q = k, the true
supremum of the Yat product (not 003's bound), the spherical bound 1/eps, finite gradients."""

from __future__ import annotations

import pytest
import torch
from test_mechanisms import assert_matches_reference

from synthbench.core.mechanism import MECHANISMS, mechanism_params

B, H, L, D = 2, 3, 37, 8
CLOSE = {"atol": 1e-10, "rtol": 1e-9}


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The models here are tiny: one intra-op thread is faster on a shared machine."""


def qkv(length=L, seed=0, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, H, length, D, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def yat_kernel(q, k, eps):
    return MECHANISMS.get("yat")(D, H, eps=eps).kernel(q, k)


def spherical_yat_kernel(q, k, eps):
    return MECHANISMS.get("yat-spherical")(D, H, eps=eps).kernel(q, k)


def causal_mask(length):
    return torch.ones(length, length, dtype=torch.bool).tril()


def reference_yat(q, k, v, causal, eps):
    """Pairwise differences (not the |q|^2 + |k|^2 - 2 q.k expansion the module uses)."""
    dot = torch.einsum("bhid,bhjd->bhij", q, k)
    distance = (q.unsqueeze(-2) - k.unsqueeze(-3)).square().sum(-1)
    scores = dot.square() / (distance + eps)
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2]), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def reference_spherical(q, k, v, causal, eps, delta):
    u = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    w = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    x = torch.einsum("bhid,bhjd->bhij", u, w)
    kernel = x.square() / (2 + eps - 2 * x)
    if causal:
        kernel = kernel * causal_mask(q.shape[-2])
    return (kernel @ v) / (kernel.sum(-1, keepdim=True) + delta)


def assert_matches(mechanism, reference, causal, seed=2, tol=CLOSE):
    """Output and the gradients of a random linear functional of it, in float64."""
    assert_matches_reference(
        mechanism,
        reference,
        causal,
        inputs=qkv(seed=seed, requires_grad=True),
        weight=torch.randn(
            B, H, L, D, generator=torch.Generator().manual_seed(99), dtype=torch.float64
        ),
        tol=tol,
    )


# -- yat ----------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-3, 0.5])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_yat_matches_explicit_reference(causal, eps):
    mechanism = MECHANISMS.get("yat")(D, H, eps=eps)
    scale = 0.3  # keeps the softmax from being one-hot, so the values and gradients say more

    def scaled(fn):
        return lambda q, k, v, causal: fn(q * scale, k * scale, v, causal)

    assert_matches(
        scaled(mechanism),
        scaled(lambda q, k, v, causal: reference_yat(q, k, v, causal, eps)),
        causal,
    )


def test_yat_defaults():
    assert mechanism_params(MECHANISMS.get("yat")) == {"eps": 1e-3}  # 001 Table 9
    assert MECHANISMS.entry("yat").metadata["complexity"] == "quadratic"


def test_yat_kernel_is_symmetric():
    q, k, _ = qkv(seed=3)
    torch.testing.assert_close(yat_kernel(q, k, 1e-3), yat_kernel(k, q, 1e-3).transpose(-1, -2))


def test_yat_kernel_is_zero_for_orthogonal_vectors():
    w = torch.tensor([[3.0, -1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    x = torch.tensor([[1.0, 3.0, 5.0, 0.0], [7.0, 1.0, 0.0, -2.0]], dtype=torch.float64)
    assert (w * x).sum(-1).abs().max() == 0
    assert torch.equal(yat_kernel(w, x, 1e-3).diagonal(), torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("eps", [1e-3, 0.1])
def test_yat_kernel_at_identity_is_norm4_over_eps(eps):
    w = torch.randn(6, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = torch.linalg.vector_norm(w, dim=-1) ** 4 / eps
    torch.testing.assert_close(yat_kernel(w, w, eps).diagonal(), expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0])
@pytest.mark.parametrize("norm", [0.5, 1.0, 3.0])
def test_yat_supremum_exceeds_the_bound_claimed_in_003(norm, eps):
    """SEEDS.md: sup_x Yat(w, x) = |w|^2 (|w|^2 + eps) / eps, reached at x* = (1 + eps/|w|^2) w,
    above 003's claimed bound |w|^4 / eps; no other point goes higher."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(1, D, generator=g, dtype=torch.float64)
    w = w / torch.linalg.vector_norm(w) * norm
    supremum = norm**2 * (norm**2 + eps) / eps
    x_star = (1 + eps / norm**2) * w
    at_star = yat_kernel(w, x_star, eps).item()
    assert at_star == pytest.approx(supremum, rel=1e-9)
    assert at_star > norm**4 / eps * (1 + 0.5 * eps / norm**2)  # strictly above 003's bound
    # random points, points along the ray through w and points near x*: none above the sup
    ray = torch.linspace(0.01, 4.0, 4001, dtype=torch.float64).unsqueeze(-1) * w
    near = x_star + 0.01 * norm * torch.randn(2000, D, generator=g, dtype=torch.float64)
    far = norm * 2 * torch.randn(2000, D, generator=g, dtype=torch.float64)
    values = yat_kernel(w, torch.cat([ray, near, far]), eps)
    assert values.max().item() <= supremum * (1 + 1e-12)


def test_yat_gradients_finite_and_exact_for_q_equal_k():
    """At x = w the distance's gradient vanishes: dYat/dx = 2 |w|^2 w / eps."""
    eps = 1e-3
    w = torch.randn(4, D, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    x = w.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(yat_kernel(w, x, eps).diagonal().sum(), x)
    expected = 2 * (w * w).sum(-1, keepdim=True) * w / eps
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=0)

    mechanism = MECHANISMS.get("yat")(D, H)
    for dtype in (torch.float32, torch.float64):
        q, _, v = qkv(seed=7, dtype=dtype)
        q, v = (0.3 * q).requires_grad_(True), v.requires_grad_(True)
        k = q.detach().clone().requires_grad_(True)
        out = mechanism(q, k, v, causal=True)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        assert out.isfinite().all() and all(g.isfinite().all() for g in grads)


# -- yat-spherical ------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-3, 1.0])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_spherical_matches_explicit_reference(causal, eps):
    mechanism = MECHANISMS.get("yat-spherical")(D, H, eps=eps)
    assert mechanism.delta == 1e-6

    def reference(q, k, v, causal):
        return reference_spherical(q, k, v, causal, eps, mechanism.delta)

    assert_matches(mechanism, reference, causal)


def test_spherical_defaults():
    assert mechanism_params(MECHANISMS.get("yat-spherical")) == {"eps": 1e-3, "delta": 1e-6}


def test_spherical_is_invariant_to_the_scale_of_q_and_k():
    q, k, v = qkv(seed=8)
    mechanism = MECHANISMS.get("yat-spherical")(D, H)
    torch.testing.assert_close(mechanism(3 * q, 0.2 * k, v), mechanism(q, k, v), **CLOSE)


@pytest.mark.parametrize("eps", [1e-3, 0.1])
def test_spherical_kernel_bounded_by_one_over_eps(eps):
    g = torch.Generator().manual_seed(9)
    q = torch.randn(300, D, generator=g, dtype=torch.float64)
    near = q + 1e-3 * torch.randn(300, D, generator=g, dtype=torch.float64)
    keys = torch.cat([torch.randn(300, D, generator=g, dtype=torch.float64), near, 2.5 * q, -q])
    values = spherical_yat_kernel(q, keys, eps)
    assert values.min() >= 0 and values.max() <= 1 / eps * (1 + 1e-12)
    # reached at x = 1 (any positive multiple of q), symmetric, zero when orthogonal
    torch.testing.assert_close(
        spherical_yat_kernel(q, 2.5 * q, eps).diagonal(),
        torch.full((300,), 1 / eps, dtype=torch.float64),
    )
    torch.testing.assert_close(values[:, :300], spherical_yat_kernel(keys[:300], q, eps).T)
    e = torch.eye(D, dtype=torch.float64)
    assert spherical_yat_kernel(e[:1], e[1:2], eps).item() == 0


def test_spherical_gradients_finite_for_q_equal_k():
    mechanism = MECHANISMS.get("yat-spherical")(D, H)
    for dtype in (torch.float32, torch.float64):
        q, _, v = qkv(seed=10, dtype=dtype)
        q, v = q.requires_grad_(True), v.requires_grad_(True)
        k = q.detach().clone().requires_grad_(True)
        out = mechanism(q, k, v, causal=True)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        assert out.isfinite().all() and all(g.isfinite().all() for g in grads)


# -- both ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["yat", "yat-spherical"])
def test_bfloat16_inputs_return_bfloat16(name):
    q, k, v = (t.to(torch.bfloat16) for t in qkv(seed=11, dtype=torch.float32))
    out = MECHANISMS.get(name)(D, H)(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("yat", {"eps": 0.0}),
        ("yat", {"eps": -1e-3}),
        ("yat", {"eps": "small"}),
        ("yat-spherical", {"eps": 0.0}),
        ("yat-spherical", {"delta": 0.0}),
        ("yat-spherical", {"delta": -1.0}),
    ],
)
def test_invalid_parameters_are_refused(name, params):
    with pytest.raises(ValueError):
        MECHANISMS.get(name)(D, H, **params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["yat", "yat-spherical"])
def test_cuda_matches_cpu(name):
    q, k, v = qkv(seed=12, dtype=torch.float32)
    q, k = 0.3 * q, 0.3 * k
    mechanism = MECHANISMS.get(name)(D, H)
    expected = mechanism(q, k, v, causal=True)
    out = mechanism.to("cuda")(q.cuda(), k.cuda(), v.cuda(), causal=True)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)
    bf16 = mechanism(*(t.cuda().to(torch.bfloat16) for t in (q, k, v)), causal=True)
    assert bf16.dtype == torch.bfloat16 and bf16.isfinite().all()
