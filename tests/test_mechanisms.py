"""Every registered mechanism, picked up from the registry: shape, dtype, finiteness,
exact causality, the feature-map mechanisms against the quadratic reference on their own
features, non-negativity of the features that claim it, bfloat16 against float32, CUDA,
state size, seeds; softmax and linear against explicit references; mechanism_params.
Tests of particular feature maps live in test_feature_maps.py."""

from __future__ import annotations

import inspect
import math
import sys

import hypothesis.extra.numpy as hnp
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthbench.core.linear_attention import linear_attention_reference
from synthbench.core.mechanism import (
    MECHANISMS,
    FeatureMapMechanism,
    Mechanism,
    extra_inputs,
    mechanism_params,
)

B, H, L, D = 2, 3, 70, 8  # L crosses the default 64-position chunk of the linear core
TIGHT = {"atol": 1e-10, "rtol": 1e-10}
ALL_MECHANISMS = MECHANISMS.names()
FEATURE_MAP_MECHANISMS = [
    name for name in ALL_MECHANISMS if issubclass(MECHANISMS.get(name), FeatureMapMechanism)
]
SIGNED_MECHANISMS = [name for name in FEATURE_MAP_MECHANISMS if MECHANISMS.get(name).signed]
# Mechanisms whose scores must never be negative. Names registered by modules still being
# written are skipped (with a reason) until they exist; every registered feature-map
# mechanism that does not declare signed = True is checked as well.
MUST_BE_NON_NEGATIVE = [
    "cosformer",
    "linear",
    "performer",
    "slay",
    "slay-exact-poly",
    "slay-hadamard",
    "slay-laplace",
]
NON_NEGATIVE = sorted(
    set(MUST_BE_NON_NEGATIVE) | (set(FEATURE_MAP_MECHANISMS) - set(SIGNED_MECHANISMS))
)
# Non-negative scores from features of either sign: the product of the features is.
FEATURES_OF_EITHER_SIGN = {
    "slay-exact-poly": "vec(u u^T) has entries of either sign; its scores (u.v)^2 PRF are not",
}


def qkv(length: int = L, seed: int = 0, dtype=torch.float64, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, H, length, D, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def build(name: str) -> torch.nn.Module:
    """The mechanism with its defaults; random draws from a fixed global seed, so that a test
    does not depend on the order the tests run in."""
    torch.manual_seed(0)
    return MECHANISMS.get(name)(D, H)


def call(mechanism, q, k, v, causal=True):
    """The mechanism on q, k, v and, for one that reads them (Mechanism.extra_inputs),
    standard-normal extra inputs of its widths, the same for the same q (seeded)."""
    g = torch.Generator().manual_seed(1234)
    extra = {
        name: torch.randn(*q.shape[:-1], width, generator=g, dtype=torch.float64).to(q.dtype)
        for name, width in extra_inputs(mechanism).items()
    }
    return mechanism(q, k, v, causal=causal, **extra)


def skip_if_causal_only(name: str, causal: bool) -> None:
    if not causal and MECHANISMS.get(name).causal_only:
        pytest.skip(f"{name} is causal only")


def causal_mask(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def reference_softmax(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2]), float("-inf"))
    return scores.softmax(dim=-1) @ v


def reference_elu_linear(q, k, v, causal, eps):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    kernel = phi_q @ phi_k.transpose(-1, -2)
    if causal:
        kernel = kernel * causal_mask(q.shape[-2])
    return (kernel @ v) / (kernel.sum(dim=-1, keepdim=True) + eps)


# -- every mechanism ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_output_shape_dtype_and_finite(name, causal, dtype):
    skip_if_causal_only(name, causal)
    q, k, v = qkv(dtype=dtype)
    out = call(build(name), q * 4, k * 4, v, causal=causal)  # larger logits too
    assert out.shape == v.shape and out.dtype == dtype
    assert bool(out.isfinite().all())


@pytest.mark.parametrize("t", [0, 10, 63, 64, 68])
@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_causal_output_ignores_the_future(name, t):
    mechanism = build(name)
    inputs = qkv(seed=1)
    perturbed = [x.clone() for x in inputs]
    g = torch.Generator().manual_seed(t)
    for x in perturbed:
        x[:, :, t + 1 :] = 3 * torch.randn(x[:, :, t + 1 :].shape, generator=g, dtype=x.dtype)
    out = call(mechanism, *inputs, causal=True)
    out_perturbed = call(mechanism, *perturbed, causal=True)
    torch.testing.assert_close(out_perturbed[:, :, : t + 1], out[:, :, : t + 1], **TIGHT)
    if name != "none":  # the floor mixes nothing, so its output ignores every input
        assert not torch.allclose(out_perturbed[:, :, t + 1 :], out[:, :, t + 1 :])


@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_registered_with_complete_metadata(name):
    entry = MECHANISMS.entry(name)
    assert entry.metadata["complexity"] in ("linear", "quadratic")
    assert entry.metadata["family"] and entry.metadata["reference"]
    assert issubclass(entry.obj, Mechanism)
    mechanism_params(entry.obj)  # every parameter has a default


# -- explicit references ------------------------------------------------------------------


def assert_matches_reference(mechanism, reference, causal, inputs=None, weight=None, tol=TIGHT):
    """Forward and backward (the gradients w.r.t. q, k and v of a random linear functional
    ``weight`` of the output) of ``mechanism`` equal those of ``reference`` on ``inputs``
    (float64 q, k, v that require grad). Returns the mechanism's output."""
    if inputs is None:
        inputs = qkv(seed=2, requires_grad=True)
    if weight is None:
        weight = torch.randn(inputs[2].shape, dtype=torch.float64)
    results = []
    for fn in (mechanism, reference):
        out = fn(*inputs, causal=causal)
        results.append((out, torch.autograd.grad((out * weight).sum(), inputs)))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected, **tol)
    for name, grad, expected_grad in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, **tol, msg=f"gradient w.r.t. {name}")
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_softmax_matches_explicit_reference(causal):
    assert_matches_reference(build("softmax"), reference_softmax, causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_linear_matches_explicit_elu_reference(causal):
    mechanism = build("linear")
    assert isinstance(mechanism, FeatureMapMechanism)

    def reference(q, k, v, causal):
        return reference_elu_linear(q, k, v, causal, eps=mechanism.eps)

    assert_matches_reference(mechanism, reference, causal)


@pytest.mark.parametrize(
    ("alias", "name"),
    [("standard", "softmax"), ("sdpa", "softmax"), ("elu", "linear"), ("linear-elu", "linear")],
)
def test_aliases(alias, name):
    assert MECHANISMS.canonical(alias) == name


# -- parameters ---------------------------------------------------------------------------


def test_mechanism_params_defaults_and_overrides():
    linear, softmax = MECHANISMS.get("linear"), MECHANISMS.get("softmax")
    assert mechanism_params(linear) == {"eps": 1e-6, "chunk_size": 64}
    assert mechanism_params(linear, {"chunk_size": 16}) == {"eps": 1e-6, "chunk_size": 16}
    assert mechanism_params(softmax) == {}
    module = linear(D, H, **mechanism_params(linear, {"chunk_size": 16}))
    assert module.chunk_size == 16


def test_mechanism_params_unknown_key_is_named():
    with pytest.raises(ValueError, match="no parameter chunk_sise"):
        mechanism_params(MECHANISMS.get("linear"), {"chunk_sise": 8})
    with pytest.raises(ValueError, match="no parameter temperature"):
        mechanism_params(MECHANISMS.get("softmax"), {"temperature": 2.0})


def test_mechanism_params_missing_required_value_is_named():
    class NeedsRank(Mechanism):
        def __init__(self, head_dim, n_heads, rank, scale=1.0):
            super().__init__(head_dim, n_heads)

    with pytest.raises(ValueError, match="needs a value for rank"):
        mechanism_params(NeedsRank)
    assert mechanism_params(NeedsRank, {"rank": 4}) == {"rank": 4, "scale": 1.0}


@pytest.mark.parametrize("params", [{"eps": -1.0}, {"chunk_size": 0}])
def test_feature_map_mechanism_rejects_invalid_params(params):
    with pytest.raises(ValueError):
        MECHANISMS.get("linear")(D, H, **params)


# -- feature-map mechanisms on the shared core ---------------------------------------------


def features_and_reference(mechanism, q, k, v, causal):
    """The quadratic reference computed on the mechanism's own features."""
    phi_q = mechanism.feature_map(q, is_query=True)
    phi_k = mechanism.feature_map(k, is_query=False)
    return linear_attention_reference(
        phi_q, phi_k, v, causal=causal, eps=mechanism.eps, signed=mechanism.signed
    )


@pytest.mark.parametrize(
    ("length", "chunk_size"),
    [(1, 64), (64, 64), (70, 64), (48, 16), (37, 16)],
    ids=["L1", "L64-C64", "L70-C64", "L48-C16", "L37-C16"],
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", FEATURE_MAP_MECHANISMS)
def test_feature_map_mechanism_matches_reference_on_its_features(name, causal, length, chunk_size):
    """Forward and the gradients w.r.t. q, k and v, float64, for lengths that do and do not
    divide the chunk size."""
    mechanism = build(name)
    mechanism.chunk_size = chunk_size
    out = assert_matches_reference(
        mechanism,
        lambda q, k, v, causal: features_and_reference(mechanism, q, k, v, causal),
        causal,
        inputs=qkv(length, seed=3, requires_grad=True),
    )
    assert out.dtype == torch.float64


@pytest.mark.parametrize("offset", [0, 1], ids=["L=F-scores", "L=F+1-core"])
@pytest.mark.parametrize("name", FEATURE_MAP_MECHANISMS)
def test_causal_paths_either_side_of_the_feature_count(name, offset, monkeypatch):
    """Up to L = feature_dim the causal output comes from the (L x L) scores (a factorised
    kernel's own ``scores``), past it from the chunked core: both equal the reference on
    the explicit features, forward and backward, float64."""
    mechanism = build(name)
    mechanism.chunk_size = 16
    calls = []
    scores = mechanism.scores
    monkeypatch.setattr(mechanism, "scores", lambda q, k: calls.append(1) or scores(q, k))
    length = mechanism.feature_dim + offset
    assert_matches_reference(
        mechanism,
        lambda q, k, v, causal: features_and_reference(mechanism, q, k, v, causal),
        True,
        inputs=tuple(t[:1, :1].detach().requires_grad_() for t in qkv(length, seed=4)),
    )
    assert len(calls) == (offset == 0)


@pytest.mark.parametrize("name", FEATURE_MAP_MECHANISMS)
def test_scores_are_the_product_of_the_features(name):
    mechanism = build(name)
    q, k, _ = qkv(length=9, seed=5)
    phi_q, phi_k = mechanism.feature_map(q, is_query=True), mechanism.feature_map(k, False)
    torch.testing.assert_close(mechanism.scores(q, k), phi_q @ phi_k.mT, **TIGHT)


@pytest.mark.parametrize("name", FEATURE_MAP_MECHANISMS)
def test_feature_dim_matches_the_features(name):
    mechanism = build(name)
    q, k, _ = qkv(length=5)
    for x, is_query in ((q, True), (k, False)):
        assert mechanism.feature_map(x, is_query).shape == (B, H, 5, mechanism.feature_dim)


# -- signs of the scores -------------------------------------------------------------------


def _magnitude_scaled(draw_shape):
    """Arrays of q or k with entries from 1e-3 up to 1e4 in magnitude (and exact zeros)."""
    elements = st.floats(-1.0, 1.0, allow_nan=False, allow_infinity=False)
    return st.tuples(
        hnp.arrays("float64", draw_shape, elements=elements),
        st.sampled_from([1e-3, 1.0, 3.0, 30.0, 1e3, 1e4]),
    )


@pytest.mark.parametrize("name", NON_NEGATIVE)
def test_scores_and_denominators_are_non_negative(name):
    """Every feature (but see FEATURES_OF_EITHER_SIGN), every score phi(q_i) . phi(k_j) and
    every denominator (causal and full) is >= 0 and finite for any input, in float64 and
    float32, large magnitudes included, and the output is finite."""
    if name not in ALL_MECHANISMS:
        pytest.skip(f"{name} is not registered (yet)")
    cls = MECHANISMS.get(name)
    assert issubclass(cls, FeatureMapMechanism) and not cls.signed, (
        f"{name} must be a feature-map mechanism with non-negative features"
    )
    mechanism = build(name)

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def check(data):
        length = data.draw(st.integers(1, 6), label="length")
        (q, q_scale), (k, k_scale), (v, _) = (
            data.draw(_magnitude_scaled((1, H, length, D)), label=label) for label in "qkv"
        )
        q = torch.from_numpy(q) * q_scale
        k = torch.from_numpy(k) * k_scale
        v = torch.from_numpy(v)
        for dtype in (torch.float64, torch.float32):
            phi_q = mechanism.feature_map(q.to(dtype), is_query=True)
            phi_k = mechanism.feature_map(k.to(dtype), is_query=False)
            for what, t in (("query features", phi_q), ("key features", phi_k)):
                assert bool(t.isfinite().all()), f"{what} not finite ({dtype})"
                if name not in FEATURES_OF_EITHER_SIGN:
                    assert bool((t >= 0).all()), f"negative {what} ({dtype})"
            scores = phi_q @ phi_k.transpose(-1, -2)
            assert bool((scores >= 0).all()), f"negative score ({dtype})"
            assert bool((scores.tril().sum(-1) >= 0).all()), (
                f"negative causal denominator ({dtype})"
            )
            assert bool((scores.sum(-1) >= 0).all()), f"negative full denominator ({dtype})"
            for causal in (True, False):
                out = mechanism(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal)
                assert bool(out.isfinite().all()), f"output not finite ({dtype}, {causal=})"

    check()


@pytest.mark.parametrize("name", SIGNED_MECHANISMS or ["(none registered)"])
def test_signed_mechanisms_can_produce_negative_scores(name):
    """A mechanism declaring signed = True says (in its documentation) that its scores can
    be negative, and they can: some input gives a negative score phi(q_i) . phi(k_j)."""
    if name not in ALL_MECHANISMS:
        pytest.skip("no mechanism declares signed = True")
    cls = MECHANISMS.get(name)
    documentation = (inspect.getdoc(cls) or "") + (sys.modules[cls.__module__].__doc__ or "")
    assert "negative" in documentation.lower(), f"{name}'s documentation should say so"
    mechanism = build(name)
    g = torch.Generator().manual_seed(0)
    for scale in (0.3, 1.0, 3.0, 10.0):
        q, k = (scale * torch.randn(1, H, 32, D, generator=g, dtype=torch.float64) for _ in "qk")
        scores = mechanism.feature_map(q, True) @ mechanism.feature_map(k, False).transpose(-1, -2)
        if bool((scores < 0).any()):
            return
    pytest.fail(f"{name} declares signed = True but no score came out negative")


# -- precision and devices ------------------------------------------------------------------

# bfloat16 keeps 8 significant bits: rounding an O(1) output costs up to 2^-9 = 0.002; the
# mechanisms here stay below 0.004 (softmax computes in bfloat16 throughout).
BF16_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_bfloat16_forward_is_close_to_float32(name, causal):
    """The same (bfloat16-representable) inputs in bfloat16 and float32 give outputs within
    atol = rtol = 1e-2 (BF16_TOLERANCE), and the bfloat16 output comes back in bfloat16."""
    skip_if_causal_only(name, causal)
    mechanism = build(name)
    q, k, v = (t.to(torch.bfloat16) for t in qkv(dtype=torch.float32))
    out = call(mechanism, q, k, v, causal=causal)
    assert out.dtype == torch.bfloat16
    expected = call(mechanism, q.float(), k.float(), v.float(), causal=causal)
    torch.testing.assert_close(out.float(), expected, **BF16_TOLERANCE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_cuda_forward_matches_cpu(name, causal, dtype):
    skip_if_causal_only(name, causal)
    mechanism = build(name)
    q, k, v = (t.to(dtype) for t in qkv(dtype=torch.float32))
    expected = call(mechanism, q, k, v, causal=causal).float()
    out = call(mechanism.cuda(), q.cuda(), k.cuda(), v.cuda(), causal=causal)
    assert out.device.type == "cuda" and out.dtype == dtype
    tolerance = {"atol": 1e-3, "rtol": 1e-3} if dtype == torch.float32 else BF16_TOLERANCE
    torch.testing.assert_close(out.float().cpu(), expected, **tolerance)


# -- state size and random draws ------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MECHANISMS)
def test_state_size(name):
    """Linear mechanisms carry a state independent of L (a feature-map mechanism: features x
    (head_dim + 1)); quadratic ones keep keys and values, 2 L d."""
    mechanism = build(name)
    sizes = [mechanism.state_size(length) for length in (1, 64, 1000)]
    if MECHANISMS.entry(name).metadata["complexity"] == "linear":
        assert len(set(sizes)) == 1 and sizes[0] >= 0
        if isinstance(mechanism, FeatureMapMechanism):
            assert sizes[0] == mechanism.feature_dim * (D + 1)
    else:
        assert sizes == [2 * length * D for length in (1, 64, 1000)]


SEEDED_MECHANISMS = [
    name
    for name in ALL_MECHANISMS
    if "seed" in inspect.signature(MECHANISMS.get(name).__init__).parameters
]


@pytest.mark.parametrize("name", SEEDED_MECHANISMS or ["(none registered)"])
def test_seed_fixes_the_random_draws(name):
    """seed=int: the same seed gives the same buffers, another seed other ones; seed=None
    draws from torch's global RNG, so torch.manual_seed makes it reproducible."""
    if name not in ALL_MECHANISMS:
        pytest.skip("no mechanism has a seed parameter")
    cls = MECHANISMS.get(name)

    def buffers(module):
        return {key: t.clone() for key, t in module.named_buffers()}

    first, again, other = (buffers(cls(D, H, seed=seed)) for seed in (1, 1, 2))
    assert first, f"{name} has a seed parameter but no buffers"
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert any(not torch.equal(first[key], other[key]) for key in first)
    torch.manual_seed(5)
    global_a = buffers(cls(D, H))
    torch.manual_seed(5)
    global_b = buffers(cls(D, H))
    assert all(torch.equal(global_a[key], global_b[key]) for key in global_a)


def test_docs_table_matches_the_code():
    from pathlib import Path

    from synthbench.core.mechanism import markdown_table

    doc = Path(__file__).resolve().parent.parent / "docs" / "MECHANISMS.md"
    assert markdown_table() in doc.read_text(), "regenerate docs/MECHANISMS.md's table"
