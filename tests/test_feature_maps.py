"""performer, performer-relu, rff and cosformer against references written from their
formulas: exact kernels they estimate (convergence as the number of random features grows),
explicit quadratic forms, the orthogonal draws, seeds, parameters, and cosFormer's horizon."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_mechanisms import assert_matches_reference

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model
from synthbench.mechanisms.performer import KEY_LOGIT_BOUND, orthogonal_gaussian

B, H, D = 1, 2, 8
TIGHT = {"atol": 1e-10, "rtol": 1e-10}
RANDOM_FEATURE_MECHANISMS = ["performer", "performer-relu", "rff"]


def qkv(length: int, seed: int = 0, scale: float = 1.0, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, H, length, D, generator=g, dtype=torch.float64) for _ in "qk")
    v = torch.randn(B, H, length, D, generator=g, dtype=torch.float64)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def build(name: str, **params):
    return MECHANISMS.get(name)(D, H, **params)


def normalised(scores: torch.Tensor, v: torch.Tensor, causal: bool, eps: float = 0.0):
    """sum_j s_ij v_j / (sum_j s_ij + eps) over the (masked) explicit L x L scores."""
    if causal:
        scores = scores * torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return (scores @ v) / (scores.sum(-1, keepdim=True) + eps)


def softmax_attention(q, k, v, causal):
    return normalised(torch.exp(q @ k.transpose(-1, -2) / math.sqrt(D)), v, causal)


def gaussian_kernel_attention(q, k, v, causal, bandwidth):
    sq_dist = (q.unsqueeze(-2) - k.unsqueeze(-3)).square().sum(-1)
    return normalised(torch.exp(-sq_dist / (2 * bandwidth**2)), v, causal)


def arccos_kernel_attention(q, k, v, causal):
    """First-order arc-cosine kernel |q||k| (sin t + (pi - t) cos t) / (2 pi) (Cho & Saul)."""
    nq, nk = q.norm(dim=-1, keepdim=True), k.norm(dim=-1, keepdim=True)
    cos = ((q / nq) @ (k / nk).transpose(-1, -2)).clamp(-1, 1)
    t = torch.arccos(cos)
    kernel = nq * nk.transpose(-1, -2) * (torch.sin(t) + (math.pi - t) * cos) / (2 * math.pi)
    return normalised(kernel, v, causal)


# -- convergence to the kernels they estimate -----------------------------------------------

FEATURE_COUNTS = [64, 256, 1024, 4096]
SEEDS = range(8)


def mean_error(name, reference, causal, **params):
    """Mean absolute output error per feature count, averaged over SEEDS."""
    errors = []
    for nb_features in FEATURE_COUNTS:
        per_seed = []
        for seed in SEEDS:
            q, k, v = qkv(24, seed=100 + seed, scale=0.7)
            mechanism = build(name, nb_features=nb_features, seed=seed, **params)
            out = mechanism(q, k, v, causal=causal)
            per_seed.append((out - reference(q, k, v, causal)).abs().mean().item())
        errors.append(sum(per_seed) / len(per_seed))
    return errors


def assert_converges(errors):
    """Error falls at every step, and by at least 3x from 64 to 4096 features (Monte Carlo
    error ~ 1/sqrt(M) predicts 8x; performer gets about 4.5x at these sizes)."""
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < errors[0] / 3, errors


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_performer_converges_to_softmax_attention(causal):
    errors = mean_error("performer", softmax_attention, causal)
    assert_converges(errors)
    assert errors[-1] < 0.02, errors


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rff_converges_to_gaussian_kernel_attention(causal):
    def reference(q, k, v, causal):
        return gaussian_kernel_attention(q, k, v, causal, bandwidth=D**0.25)

    errors = mean_error("rff", reference, causal)
    assert_converges(errors)
    assert errors[-1] < 0.02, errors


def test_rff_bandwidth_parameter_sets_the_kernel():
    def reference(q, k, v, causal):
        return gaussian_kernel_attention(q, k, v, causal, bandwidth=3.0)

    assert_converges(mean_error("rff", reference, False, bandwidth=3.0))


def test_performer_relu_converges_to_arccos_kernel_attention():
    errors = mean_error("performer-relu", arccos_kernel_attention, causal=False)
    assert_converges(errors)
    assert errors[-1] < 0.02, errors


# -- explicit forms with the drawn projections ------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_performer_stabilisation_cancels_exactly(causal):
    """With eps = 0 the output equals the unstabilised FAVOR+ formula on the same draw:
    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(M), x' = x d^(-1/4), forward and backward."""
    mechanism = build("performer", seed=1, eps=0.0)
    w = mechanism.projection.double()
    inputs = qkv(70, seed=2, requires_grad=True)

    def reference(q, k, v, causal):
        def phi(x):
            x = x * D**-0.25
            return torch.exp(x @ w.T - x.square().sum(-1, keepdim=True) / 2) / math.sqrt(64)

        return normalised(phi(q) @ phi(k).transpose(-1, -2), v, causal)

    assert_matches_reference(mechanism, reference, causal, inputs=inputs)


def test_performer_large_queries_do_not_underflow():
    """A query of norm 1e3 would have every raw feature exp(w.q' - |q'|^2/2) underflow to 0
    in float32; shifted by its own maximum its largest feature is exactly 1 / sqrt(M)."""
    mechanism = build("performer", seed=1)
    q = 1e3 * torch.randn(B, H, 5, D)
    features = mechanism.feature_map(q, is_query=True)
    torch.testing.assert_close(features.amax(-1), torch.full((B, H, 5), 1 / math.sqrt(64)))
    q, k, v = (t.float() for t in qkv(5, seed=3))
    out = mechanism(1e3 * q, k, v)
    assert bool(out.isfinite().all()) and bool((out != 0).any())


def test_performer_key_logits_are_clamped():
    """At head_dim 128 a row has |w|^2/2 well above the bound; the key k' = w reaches it, and
    its feature is clamped at exp(KEY_LOGIT_BOUND) / sqrt(M) instead of overflowing."""
    d = 128
    mechanism = MECHANISMS.get("performer")(d, 1, seed=0)
    w = mechanism.projection.double()
    row = int(w.square().sum(-1).argmax())
    assert w[row].square().sum() / 2 > KEY_LOGIT_BOUND + 10
    key = (w[row] * d**0.25).float().reshape(1, 1, 1, d)
    features = mechanism.feature_map(key, is_query=False)
    assert bool(features.isfinite().all())
    torch.testing.assert_close(
        features[0, 0, 0, row], torch.tensor(math.exp(KEY_LOGIT_BOUND) / math.sqrt(64))
    )


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_performer_relu_explicit_form(causal):
    mechanism = build("performer-relu", seed=3)
    w = mechanism.projection.double()
    q, k, v = qkv(40, seed=4)
    scores = F.relu(q @ w.T) @ F.relu(k @ w.T).transpose(-1, -2) / 64
    expected = normalised(scores, v, causal, eps=mechanism.eps)
    torch.testing.assert_close(mechanism(q, k, v, causal=causal), expected, **TIGHT)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rff_explicit_form_with_signed_guard(causal):
    """Scores (1/M) sum_m cos(w_m . (q_i - k_j) / s), of either sign, normalised with the
    denominator pushed to magnitude >= eps with its sign kept."""
    mechanism = build("rff", seed=5, nb_features=16)
    w = mechanism.projection.double()
    q, k, v = qkv(40, seed=6, scale=2.0)
    diff = (q.unsqueeze(-2) - k.unsqueeze(-3)) / D**0.25  # (B, H, L, L, D)
    scores = torch.cos(diff @ w.T).mean(-1)
    assert bool((scores < 0).any())
    if causal:
        scores = scores * torch.ones(40, 40, dtype=torch.bool).tril()
    den = scores.sum(-1, keepdim=True)
    eps = mechanism.eps
    den = torch.where(den < 0, den.clamp(max=-eps), den.clamp(min=eps))
    expected = (scores @ v) / den
    torch.testing.assert_close(mechanism(q, k, v, causal=causal), expected, **TIGHT)


# -- the draws ----------------------------------------------------------------------------


def test_orthogonal_blocks_are_orthogonal():
    """Rows of each d x d block are mutually orthogonal (the last block truncated), with
    norms that differ (chi-distributed), and the blocks are independent of one another."""
    w = orthogonal_gaussian(20, D, torch.Generator().manual_seed(0))
    assert w.shape == (20, D) and w.dtype == torch.float64
    for start in range(0, 20, D):
        block = w[start : start + D]
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)), atol=1e-12, rtol=0)
        assert torch.diagonal(gram).std() > 0.1  # norms resampled, not all equal
    cross = w[:D] @ w[D : 2 * D].T
    assert cross.abs().max() > 0.1  # different blocks are not orthogonal to each other


def test_mechanism_buffers_hold_orthogonal_blocks():
    mechanism = build("performer", nb_features=20, seed=0)
    w = mechanism.projection.double()
    for start in range(0, 20, D):
        unit = F.normalize(w[start : start + D], dim=-1)
        torch.testing.assert_close(
            unit @ unit.T, torch.eye(len(unit), dtype=torch.float64), atol=1e-6, rtol=0
        )


def test_orthogonal_rows_are_gaussian():
    """Marginally each row is N(0, I_d): mean 0, covariance I, E|w|^2 = d (20000 rows)."""
    w = orthogonal_gaussian(20000, 4, torch.Generator().manual_seed(1))
    assert w.mean(0).abs().max() < 0.05
    torch.testing.assert_close(
        w.T @ w / len(w), torch.eye(4, dtype=torch.float64), atol=0.05, rtol=0
    )
    # chi(4) norms: E|w|^4 = d (d + 2) = 24 (a fixed norm sqrt(d) would give 16)
    assert abs(w.square().sum(-1).square().mean().item() - 24) < 1.5


@pytest.mark.parametrize("name", RANDOM_FEATURE_MECHANISMS)
def test_seed_determinism(name):
    same = [build(name, seed=7).projection for _ in range(2)]
    other = build(name, seed=8).projection
    assert torch.equal(same[0], same[1])
    assert not torch.equal(same[0], other)
    torch.manual_seed(3)
    first = build(name).projection  # seed None: the global RNG
    torch.manual_seed(3)
    assert torch.equal(first, build(name).projection)
    assert not torch.equal(first, build(name).projection)  # the RNG moved on: a new draw


def test_performer_variants_share_their_draws():
    assert torch.equal(
        build("performer", seed=4).projection, build("performer-relu", seed=4).projection
    )


def test_feature_dims():
    assert build("performer", nb_features=10).feature_dim == 10
    assert build("performer-relu", nb_features=10).feature_dim == 10
    assert build("rff", nb_features=10).feature_dim == 20
    assert build("cosformer").feature_dim == 2 * D
    assert MECHANISMS.get("rff").signed and not MECHANISMS.get("performer").signed


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("performer", {"nb_features": 0}),
        ("performer", {"nb_features": 2.5}),
        ("performer", {"seed": -1}),
        ("performer", {"seed": True}),
        ("performer-relu", {"seed": "1"}),
        ("rff", {"bandwidth": 0.0}),
        ("rff", {"bandwidth": float("inf")}),
        ("rff", {"nb_features": -3}),
        ("cosformer", {"horizon": 0}),
        ("cosformer", {"horizon": 10.0}),
        ("cosformer", {"eps": -1.0}),
    ],
)
def test_invalid_parameters_are_refused(name, params):
    with pytest.raises(ValueError):
        build(name, **params)


# -- cosFormer ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("horizon", "max_len", "M"),
    [(None, None, 70), (None, 90, 90), (70, None, 70), (100, 200, 100), (1024, None, 1024)],
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_cosformer_matches_its_formula(causal, horizon, max_len, M):
    """relu(q_i) . relu(k_j) cos(pi (i - j) / 2M), normalised with eps; forward and backward.
    M is the explicit horizon, else the model's max length, else the call's length (L 70)."""
    mechanism = build("cosformer", horizon=horizon)
    if max_len is not None:
        mechanism.set_max_len(max_len)
    inputs = qkv(70, seed=8, requires_grad=True)

    def reference(q, k, v, causal):
        i = torch.arange(70, dtype=torch.float64)
        reweight = torch.cos(math.pi * (i.unsqueeze(1) - i.unsqueeze(0)) / (2 * M))
        scores = (F.relu(q) @ F.relu(k).transpose(-1, -2)) * reweight
        return normalised(scores, v, causal, eps=mechanism.eps)

    assert_matches_reference(mechanism, reference, causal, inputs=inputs)


def test_cosformer_features_do_not_depend_on_the_length():
    """A position's features, and the causal outputs of a prefix, are the same whatever the
    length of the sequence they come from."""
    mechanism = build("cosformer")
    mechanism.set_max_len(300)  # as the model does
    q, k, v = qkv(300, seed=9)
    for length in (1, 10, 100):
        short = mechanism.feature_map(q[:, :, :length], is_query=True)
        torch.testing.assert_close(short, mechanism.feature_map(q, True)[:, :, :length], **TIGHT)
        prefix_out = mechanism(q[:, :, :length], k[:, :, :length], v[:, :, :length])
        torch.testing.assert_close(prefix_out, mechanism(q, k, v)[:, :, :length], **TIGHT)


def test_cosformer_refuses_sequences_beyond_its_horizon():
    mechanism = build("cosformer", horizon=16)
    q, k, v = qkv(16)
    assert bool(mechanism(q, k, v).isfinite().all())  # up to the horizon: fine
    phi_q, phi_k = mechanism.feature_map(q.abs(), True), mechanism.feature_map(k.abs(), False)
    assert bool((phi_q @ phi_k.transpose(-1, -2) > 0).all())  # even at distance M - 1
    q, k, v = qkv(17)
    with pytest.raises(ValueError, match="exceeds horizon=16"):
        mechanism(q, k, v)


def test_the_model_gives_cosformer_its_max_length_as_the_horizon():
    model = Model(8, 48, lambda: build("cosformer"), d_model=16, n_heads=2)
    assert [b.attn.mechanism.max_len for b in model.blocks] == [48, 48]
    fixed = Model(8, 48, lambda: build("cosformer", horizon=1024), d_model=16, n_heads=2)
    mechanism = fixed.blocks[0].attn.mechanism
    q = torch.rand(1, 2, 48, 8, dtype=torch.float64)
    angle = mechanism.feature_map(q, True)[..., 8:] / q  # the sin half: sin(pi i / 2M)
    assert math.isclose(angle[0, 0, 47, 0].item(), math.sin(math.pi * 47 / 2048))


def test_cosformer_refuses_sequences_beyond_the_models_length():
    mechanism = build("cosformer")
    mechanism.set_max_len(16)
    with pytest.raises(ValueError, match="exceeds the model's max length=16"):
        mechanism(*qkv(17))
