"""The chunked causal linear-attention core (both strategies) against its quadratic
reference, the signed denominator guard, and the scan's partial gradients; attention on
factored scores, block by block, against attend_to_scores."""

from __future__ import annotations

import pytest
import torch

from synthbench.core import linear_attention as linear_attention_module
from synthbench.core.linear_attention import (
    attend_to_factored_scores,
    attend_to_scores,
    chunking,
    factored_scores,
    linear_attention,
    linear_attention_reference,
    normalise,
)

B, H, F, D = 2, 3, 4, 5  # features != head_dim, to catch a transposed contraction
LENGTHS = [1, 5, 64, 100, 130]
CHUNKS = [1, 7, 16, 64, 256]
TIGHT = {"atol": 1e-10, "rtol": 1e-10}
STRATEGIES = ["scan", "prefix"]


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


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("length", LENGTHS)
def test_chunked_matches_reference_forward_and_backward(length, chunk_size, causal, strategy):
    inputs = make_inputs(length, seed=length * 1000 + chunk_size, requires_grad=True)
    weight = torch.randn(B, H, length, D, dtype=torch.float64)

    out, grads = output_and_grads(
        lambda q, k, v: linear_attention(
            q, k, v, causal=causal, chunk_size=chunk_size, strategy=strategy
        ),
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


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("chunk_size", [7, 64])
@pytest.mark.parametrize("length", [5, 100])
def test_eps_zero_gives_finite_matching_gradients(length, chunk_size, strategy):
    """eps = 0 is a valid setting (FeatureMapMechanism accepts eps >= 0); with positive
    features every real position has a positive denominator, so the result is well defined."""
    inputs = make_inputs(length, seed=3, requires_grad=True)
    weight = torch.randn(B, H, length, D, dtype=torch.float64)
    out, grads = output_and_grads(
        lambda q, k, v: linear_attention(
            q, k, v, eps=0.0, chunk_size=chunk_size, strategy=strategy
        ),
        inputs,
        weight,
    )
    ref, ref_grads = output_and_grads(
        lambda q, k, v: linear_attention_reference(q, k, v, eps=0.0), inputs, weight
    )
    torch.testing.assert_close(out, ref, **TIGHT)
    for name, grad, ref_grad in zip(("phi_q", "phi_k", "v"), grads, ref_grads, strict=True):
        n_bad = int((~grad.isfinite()).sum())
        assert n_bad == 0, f"{n_bad} of {grad.numel()} gradients w.r.t. {name} are not finite"
        torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["float32", "bfloat16"]
)
def test_low_precision_keeps_dtype_and_stays_close(dtype, tol, causal, strategy):
    inputs = [t.to(dtype) for t in make_inputs(100, seed=1)]
    out = linear_attention(*inputs, causal=causal, chunk_size=16, strategy=strategy)
    assert out.dtype == dtype
    # the same (rounded) inputs in float64
    expected = linear_attention_reference(*(t.double() for t in inputs), causal=causal)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_output_takes_the_dtype_of_v():
    phi_q, phi_k, v = make_inputs(20, dtype=torch.float32)
    assert linear_attention(phi_q, phi_k, v.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("chunk_size", [1, 7, 16, 256])
@pytest.mark.parametrize("t", [0, 6, 7, 15, 50, 98])
def test_causal_output_ignores_the_future(t, chunk_size, strategy):
    length = 100
    inputs = make_inputs(length, seed=2)
    perturbed = [x.clone() for x in inputs]
    g = torch.Generator().manual_seed(t)
    for x in perturbed:
        x[:, :, t + 1 :] = torch.rand(x[:, :, t + 1 :].shape, generator=g, dtype=x.dtype) * 5
    out = linear_attention(*inputs, chunk_size=chunk_size, strategy=strategy)
    out_perturbed = linear_attention(*perturbed, chunk_size=chunk_size, strategy=strategy)
    torch.testing.assert_close(out_perturbed[:, :, : t + 1], out[:, :, : t + 1], **TIGHT)
    assert not torch.allclose(out_perturbed[:, :, t + 1 :], out[:, :, t + 1 :])


# -- signed features: the guarded denominator ---------------------------------------------


def test_signed_guard_keeps_the_sign_and_a_magnitude_of_at_least_eps():
    num = torch.ones(5, 1, dtype=torch.float64)
    den = torch.tensor([-2.0, -1e-9, 0.0, 1e-9, 3.0], dtype=torch.float64)
    out = normalise(num, den, eps=1e-6, signed=True).squeeze(-1)
    expected = 1 / torch.tensor([-2.0, -1e-6, 1e-6, 1e-6, 3.0], dtype=torch.float64)
    torch.testing.assert_close(out, expected, **TIGHT)
    # unsigned: eps is added, as for non-negative features
    torch.testing.assert_close(
        normalise(num, den, 1e-6, signed=False).squeeze(-1), 1 / (den + 1e-6)
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("length", [5, 100])
def test_signed_features_match_reference_forward_and_backward(length, causal, strategy):
    """Features of either sign (scores and denominators of either sign) on the guarded core."""
    g = torch.Generator().manual_seed(length)
    inputs = [
        torch.randn(B, H, length, n, generator=g, dtype=torch.float64).requires_grad_()
        for n in (F, F, D)
    ]
    weight = torch.randn(B, H, length, D, generator=g, dtype=torch.float64)
    out, grads = output_and_grads(
        lambda q, k, v: linear_attention(
            q, k, v, causal=causal, chunk_size=16, signed=True, strategy=strategy
        ),
        inputs,
        weight,
    )
    ref, ref_grads = output_and_grads(
        lambda q, k, v: linear_attention_reference(q, k, v, causal=causal, signed=True),
        inputs,
        weight,
    )
    den = (inputs[0] @ inputs[1].transpose(-1, -2)).tril().sum(-1)
    assert bool((den < 0).any()), "the inputs should exercise negative denominators"
    torch.testing.assert_close(out, ref, **TIGHT)
    for name, grad, ref_grad in zip(("phi_q", "phi_k", "v"), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


# -- the scan's hand-written backward ------------------------------------------------------


@pytest.mark.parametrize("wanted", ["q", "k", "v", "kv"])
def test_scan_gradients_for_a_subset_of_inputs(wanted):
    """Only the inputs that require a gradient get one, and it is the reference's."""
    inputs = make_inputs(50, seed=4)
    for name, t in zip("qkv", inputs, strict=True):
        t.requires_grad_(name in wanted)
    chosen = [t for name, t in zip("qkv", inputs, strict=True) if name in wanted]
    weight = torch.randn(B, H, 50, D, dtype=torch.float64)
    out = linear_attention(*inputs, chunk_size=16, strategy="scan")
    ref = linear_attention_reference(*inputs)
    grads = torch.autograd.grad((out * weight).sum(), chosen)
    ref_grads = torch.autograd.grad((ref * weight).sum(), chosen)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, **TIGHT)


def test_scan_without_autograd_matches_with_it():
    """Under no_grad (or with no input requiring a gradient) the scan keeps one running state
    and saves nothing; the result is the same."""
    inputs = make_inputs(100, seed=7, requires_grad=True)
    with_grad = linear_attention(*inputs, chunk_size=16, strategy="scan")
    with torch.no_grad():
        without = linear_attention(*inputs, chunk_size=16, strategy="scan")
    assert with_grad.requires_grad and not without.requires_grad
    torch.testing.assert_close(without, with_grad.detach(), **TIGHT)
    torch.testing.assert_close(without, linear_attention_reference(*inputs).detach(), **TIGHT)


def test_non_contiguous_inputs():
    """(B, L, H, F) tensors viewed as (B, H, L, F), as a model's heads are."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(40, seed=5))
    assert not q.is_contiguous()
    for strategy in STRATEGIES:
        out = linear_attention(q, k, v, chunk_size=16, strategy=strategy)
        torch.testing.assert_close(out, linear_attention_reference(q, k, v), **TIGHT)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy must be one of"):
        linear_attention(*make_inputs(4), strategy="fast")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("strategy", ["auto", *STRATEGIES])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_cuda_matches_reference(causal, strategy):
    inputs = make_inputs(130, seed=6)
    out = linear_attention(*(t.float().cuda() for t in inputs), causal=causal, strategy=strategy)
    assert out.device.type == "cuda" and out.dtype == torch.float32
    ref = linear_attention_reference(*inputs, causal=causal)
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-4, rtol=1e-4)


def test_chunking_gives_as_few_equal_chunks_as_chunk_size_allows():
    for length in range(1, 300):
        for chunk_size in range(1, 80):
            n, c = chunking(length, chunk_size)
            assert n == -(-length // chunk_size), (length, chunk_size)
            assert c <= chunk_size and 0 <= n * c - length < n, (length, chunk_size)


# -- attention on factored scores, block by block (attend_to_factored_scores) --------------

FACTORINGS = {  # (width, power) per factor: thin (< THIN) and wide, squared, three factors
    "one-wide": [(20, 1)],
    "thin-wide": [(3, 1), (17, 1)],
    "squared-thin": [(D, 2), (4, 1)],
    "three": [(2, 1), (16, 1), (3, 2)],
}
LAYOUTS = {  # module constants: blocks of batch rows, query rows per chunk in the backward
    "defaults": {},
    "row-by-row": {"BLOCK_BYTES": 1},
    "chunks-of-7": {"BLOCK_BYTES": 1, "ROW_CHUNK": 7, "ROW_CHUNK_FROM": 7},
}


def make_factors(factoring, signed, seed=0):
    """factors(q, k) -> [(x (2, B, H, L, K), power)]: fixed random maps of q and k, positive
    (elu + 1) unless ``signed``; and scores(q, k), their factored_scores."""
    g = torch.Generator().manual_seed(seed)
    maps = [
        (torch.randn(D, width, generator=g, dtype=torch.float64), power)
        for width, power in factoring
    ]

    def factors(q, k):
        def side(x, w):
            y = x @ w.to(x.dtype)
            return y if signed else torch.nn.functional.elu(y) + 1

        return [(torch.stack([side(q, w), side(k, w)]), power) for w, power in maps]

    return factors, lambda q, k: factored_scores(factors(q, k))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("signed", [False, True], ids=["positive", "signed"])
@pytest.mark.parametrize("factoring", sorted(FACTORINGS))
@pytest.mark.parametrize("length", [1, 7, 8, 64, 97, 130])
def test_factored_scores_match_attend_to_scores(length, factoring, signed, layout, monkeypatch):
    """The blocked forward and the hand-written backward equal autograd through
    attend_to_scores on the whole batch's scores, float64: lengths around a chunk's edge
    (7, 8 at chunks of 7) and past the default chunking (97, 130), every batch row a block
    of its own, signed scores (and denominators) through the guard."""
    for attribute, value in LAYOUTS[layout].items():
        monkeypatch.setattr(linear_attention_module, attribute, value)
    factors, scores = make_factors(FACTORINGS[factoring], signed, seed=length)
    g = torch.Generator().manual_seed(length)
    inputs = [
        torch.randn(3, H, length, D, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    ]
    weight = torch.randn(3, H, length, D, generator=g, dtype=torch.float64)
    out, grads = output_and_grads(
        lambda q, k, v: attend_to_factored_scores(q, k, v, scores, factors, 1e-6, signed),
        inputs,
        weight,
    )
    ref, ref_grads = output_and_grads(
        lambda q, k, v: attend_to_scores(scores(q, k), v, True, 1e-6, signed), inputs, weight
    )
    if signed and length > 1 and factoring != "squared-thin":
        den = scores(*inputs[:2]).tril().sum(-1)
        assert bool((den < 0).any()), "the inputs should exercise negative denominators"
    torch.testing.assert_close(out, ref, **TIGHT)
    for name, grad, ref_grad in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("wanted", ["q", "k", "v", "qk", "kv"])
def test_factored_scores_gradients_for_a_subset_of_inputs(wanted, monkeypatch):
    """Only the inputs that require a gradient get one, and it is the reference's."""
    monkeypatch.setattr(linear_attention_module, "BLOCK_BYTES", 1)
    factors, scores = make_factors(FACTORINGS["thin-wide"], signed=False)
    g = torch.Generator().manual_seed(9)
    tensors = {n: torch.randn(B, H, 40, D, generator=g, dtype=torch.float64) for n in "qkv"}
    for name, t in tensors.items():
        t.requires_grad_(name in wanted)
    chosen = [tensors[name] for name in wanted]
    weight = torch.randn(B, H, 40, D, generator=g, dtype=torch.float64)
    out = attend_to_factored_scores(*tensors.values(), scores, factors)
    ref = attend_to_scores(scores(tensors["q"], tensors["k"]), tensors["v"])
    grads = torch.autograd.grad((out * weight).sum(), chosen)
    ref_grads = torch.autograd.grad((ref * weight).sum(), chosen)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, **TIGHT)


def test_factored_scores_dtypes_and_no_grad():
    """float32 in, float32 out; bfloat16 values, bfloat16 out (sums in float32); under
    no_grad nothing is kept for a backward; non-contiguous q, k, v as a model's heads."""
    factors, scores = make_factors(FACTORINGS["thin-wide"], signed=False)
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(B, 30, H, D, generator=g, dtype=torch.float64).transpose(1, 2) for _ in range(3)
    )
    assert not v.is_contiguous()
    ref = attend_to_scores(scores(q, k), v)
    torch.testing.assert_close(attend_to_factored_scores(q, k, v, scores, factors), ref, **TIGHT)
    out32 = attend_to_factored_scores(q.float(), k.float(), v.float(), scores, factors)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), ref, rtol=1e-4, atol=1e-5)
    out16 = attend_to_factored_scores(q.float(), k.float(), v.bfloat16(), scores, factors)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.double(), ref, rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        out = attend_to_factored_scores(q.requires_grad_(), k, v, scores, factors)
    assert not out.requires_grad


def test_factored_scores_are_the_product_of_the_factors_kernels():
    """Two factors' scores are those of their row-wise tensor product (the features
    phi = x_1 (x) x_2, as SLAY's poly (x) PRF); a squared factor's are those of x (x) x."""
    g = torch.Generator().manual_seed(4)
    x1, x2 = (torch.randn(2, B, H, 9, n, generator=g, dtype=torch.float64) for n in (3, 5))
    product = (x1.unsqueeze(-1) * x2.unsqueeze(-2)).flatten(-2)
    expected = product[0] @ product[1].mT
    torch.testing.assert_close(factored_scores([(x1, 1), (x2, 1)]), expected, **TIGHT)
    square = (x1.unsqueeze(-1) * x1.unsqueeze(-2)).flatten(-2)
    expected = square[0] @ square[1].mT
    torch.testing.assert_close(factored_scores([(x1, 2)]), expected, **TIGHT)
