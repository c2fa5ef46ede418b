"""The chunked causal linear-attention core against its quadratic reference."""

from __future__ import annotations

import pytest
import torch

from synthbench.linear_attention import linear_attention, linear_attention_reference

B, H, F, D = 2, 3, 4, 5  # features != head_dim, to catch a transposed contraction
LENGTHS = [1, 5, 64, 100, 130]
CHUNKS = [1, 7, 16, 64, 256]
TIGHT = {"atol": 1e-10, "rtol": 1e-10}


def make_inputs(length: int, seed: int = 0, dtype=torch.float64, requires_grad=False):
    """Positive features (elu + 1 of a normal draw and a uniform draw) and values."""
    g = torch.Generator().manual_seed(seed)
    phi_q = torch.nn.functional.elu(torch.randn(B, H, length, F, generator=g, dtype=dtype)) + 1
    phi_k = torch.rand(B, H, length, F, generator=g, dtype=dtype)
    v = torch.randn(B, H, length, D, generator=g, dtype=dtype)
    return tuple(t.detach().requires_grad_(requires_grad) for t in (phi_q, phi_k, v))


def output_and_grads(fn, inputs, weight):
    """fn's output and the gradients of the linear functional <weight, output>."""
    out = fn(*inputs)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    return out, grads


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("length", LENGTHS)
def test_chunked_matches_reference_forward_and_backward(length, chunk_size, causal):
    inputs = make_inputs(length, seed=length * 1000 + chunk_size, requires_grad=True)
    weight = torch.randn(B, H, length, D, dtype=torch.float64)

    out, grads = output_and_grads(
        lambda q, k, v: linear_attention(q, k, v, causal=causal, chunk_size=chunk_size),
        inputs,
        weight,
    )
    ref, ref_grads = output_and_grads(
        lambda q, k, v: linear_attention_reference(q, k, v, causal=causal), inputs, weight
    )

    assert out.shape == (B, H, length, D) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, **TIGHT)
    for name, grad, ref_grad in zip(("phi_q", "phi_k", "v"), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("chunk_size", [7, 64])
@pytest.mark.parametrize("length", [5, 100])
def test_eps_zero_gives_finite_matching_gradients(length, chunk_size):
    """eps = 0 is a valid setting (FeatureMapMechanism accepts eps >= 0); with positive
    features every real position has a positive denominator, so the result is well defined."""
    inputs = make_inputs(length, seed=3, requires_grad=True)
    weight = torch.randn(B, H, length, D, dtype=torch.float64)
    out, grads = output_and_grads(
        lambda q, k, v: linear_attention(q, k, v, eps=0.0, chunk_size=chunk_size), inputs, weight
    )
    ref, ref_grads = output_and_grads(
        lambda q, k, v: linear_attention_reference(q, k, v, eps=0.0), inputs, weight
    )
    torch.testing.assert_close(out, ref, **TIGHT)
    for name, grad, ref_grad in zip(("phi_q", "phi_k", "v"), grads, ref_grads, strict=True):
        n_bad = int((~grad.isfinite()).sum())
        assert n_bad == 0, f"{n_bad} of {grad.numel()} gradients w.r.t. {name} are not finite"
        torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["float32", "bfloat16"]
)
def test_low_precision_keeps_dtype_and_stays_close(dtype, tol, causal):
    inputs = [t.to(dtype) for t in make_inputs(100, seed=1)]
    out = linear_attention(*inputs, causal=causal, chunk_size=16)
    assert out.dtype == dtype
    # the same (rounded) inputs in float64
    expected = linear_attention_reference(*(t.double() for t in inputs), causal=causal)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_output_takes_the_dtype_of_v():
    phi_q, phi_k, v = make_inputs(20, dtype=torch.float32)
    assert linear_attention(phi_q, phi_k, v.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 256])
@pytest.mark.parametrize("t", [0, 6, 7, 15, 50, 98])
def test_causal_output_ignores_the_future(t, chunk_size):
    length = 100
    inputs = make_inputs(length, seed=2)
    perturbed = [x.clone() for x in inputs]
    g = torch.Generator().manual_seed(t)
    for x in perturbed:
        x[:, :, t + 1 :] = torch.rand(x[:, :, t + 1 :].shape, generator=g, dtype=x.dtype) * 5
    out = linear_attention(*inputs, chunk_size=chunk_size)
    out_perturbed = linear_attention(*perturbed, chunk_size=chunk_size)
    torch.testing.assert_close(out_perturbed[:, :, : t + 1], out[:, :, : t + 1], **TIGHT)
    assert not torch.allclose(out_perturbed[:, :, t + 1 :], out[:, :, t + 1 :])
