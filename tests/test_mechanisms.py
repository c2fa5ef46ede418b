"""Every registered mechanism: shape, causality, finiteness; softmax and linear against
explicit references; mechanism_params."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from synthbench.mechanism import MECHANISMS, FeatureMapMechanism, Mechanism, mechanism_params

B, H, L, D = 2, 3, 70, 8  # L crosses the default 64-position chunk of the linear core
TIGHT = {"atol": 1e-10, "rtol": 1e-10}
ALL_MECHANISMS = MECHANISMS.names()


def qkv(length: int = L, seed: int = 0, dtype=torch.float64, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, H, length, D, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def build(name: str) -> torch.nn.Module:
    return MECHANISMS.get(name)(D, H)


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
    q, k, v = qkv(dtype=dtype)
    out = build(name)(q * 4, k * 4, v, causal=causal)  # larger logits too
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
    out = mechanism(*inputs, causal=True)
    out_perturbed = mechanism(*perturbed, causal=True)
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


def assert_matches_reference(mechanism, reference, causal):
    """Forward and backward (a random linear functional of the output) in float64."""
    inputs = qkv(seed=2, requires_grad=True)
    weight = torch.randn(B, H, L, D, dtype=torch.float64)
    results = []
    for fn in (mechanism, reference):
        out = fn(*inputs, causal=causal)
        results.append((out, torch.autograd.grad((out * weight).sum(), inputs)))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected, **TIGHT)
    for name, grad, expected_grad in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


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
