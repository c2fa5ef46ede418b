"""based: the Taylor feature map's identity phi(q).phi(k) = 1 + s + s^2/2; the parallel form
of ``forward`` (chunked linear core + blocked window) against the token-by-token reference
``based_reference`` in float64, forward and backward, at lengths that do and do not divide
the chunk, for several windows and head splits; the reference against the quadratic formula
written here from the docstring (causal and not); the head split; the recurrent form at small
windows; defaults, dtypes, large inputs, parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.mechanisms.based import based_reference, taylor_attention, taylor_feature_map

B, H, D = 2, 4, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def qkv(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, heads=H, dim=D):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(B, heads, length, dim, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for _ in range(3)
    )


def build(heads=H, dim=D, **params):
    return MECHANISMS.get("based")(dim, heads, **params)


@pytest.mark.parametrize("d", [1, 4, 16])
def test_taylor_features_give_one_plus_s_plus_half_s_squared(d):
    """On the first d coordinates, s = q.k / sqrt(d); the coordinates after d are ignored."""
    g = torch.Generator().manual_seed(d)
    q, k = (torch.randn(5, 7, 24, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    phi_q, phi_k = taylor_feature_map(q, d), taylor_feature_map(k, d)
    assert phi_q.shape == (5, 7, 1 + d + d * d)
    s = (q[..., :d] * k[..., :d]).sum(-1) / math.sqrt(d)
    torch.testing.assert_close((phi_q * phi_k).sum(-1), 1 + s + s * s / 2, atol=1e-12, rtol=1e-12)
    q2 = q.clone()
    q2[..., d:] = 0
    torch.testing.assert_close(taylor_feature_map(q2, d), phi_q, atol=0, rtol=0)


@pytest.mark.parametrize("d", [2, 3])
def test_taylor_attention_takes_two_forms_both_equal_to_the_reference(d):
    """Up to 1 + d + d^2 positions the scores form, past them the features form: each
    against the token-by-token reference (Taylor heads only), forward and backward, on both
    sides of the switch, at chunks that do and do not divide the length."""
    features = 1 + d + d * d
    for length in (1, features - 1, features, features + 1, 2 * features + 3):
        for chunk in (3, 64):
            assert_same_function(
                lambda q, k, v, chunk=chunk: taylor_attention(q, k, v, d, chunk_size=chunk),
                lambda q, k, v: based_reference(q, k, v, d, window=1, window_heads=0),
                qkv(length, seed=length + chunk, requires_grad=True),
            )


def test_taylor_attention_builds_no_features_where_it_takes_the_scores():
    """At L 64 and d 16 (273 features a position) the largest tensor is a block of scores,
    chunk x L per head, far below the L x 273 features per head of the other form."""
    length, chunk = 64, 32
    q, k, v = qkv(length, seed=3, dtype=torch.float32, dim=16)
    with LargestTensor() as seen:
        taylor_attention(q, k, v, 16, chunk_size=chunk)
    assert seen.largest <= B * H * chunk * length < B * H * length * 273


# (window, window_heads, chunk_size): the defaults; windows shorter than, equal to and longer
# than the block; Taylor only; window only; window 1
CONFIGS = [(64, None, 64), (5, 2, 16), (16, 1, 16), (40, 3, 16), (7, 0, 5), (9, 4, 5), (1, 2, 8)]


@pytest.mark.parametrize(("window", "window_heads", "chunk"), CONFIGS)
def test_parallel_form_equals_the_token_by_token_reference(window, window_heads, chunk):
    mechanism = build(window=window, window_heads=window_heads, chunk_size=chunk)
    for length in lengths_around(chunk):
        inputs = qkv(length, seed=length, requires_grad=True)
        assert_same_function(
            mechanism,
            lambda q, k, v: based_reference(
                q, k, v, mechanism.taylor_dim, window, mechanism.window_heads
            ),
            inputs,
        )


def quadratic_reference(q, k, v, feature_dim, window, window_heads, causal, eps=1e-12):
    """The docstring's formulas through (L x L) matrices: window heads, softmax of
    q.k / sqrt(head_dim) over the band (causal: i - window < j <= i; else |i - j| < window);
    Taylor heads, kernel 1 + s + s^2/2, s = q[:d].k[:d] / sqrt(d), normalised by its row sum
    plus eps (causal: j <= i; else every j)."""
    length, dim = q.shape[-2], q.shape[-1]
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    band = (i - j >= 0) & (i - j < window) if causal else (i - j).abs() < window
    scores = (q @ k.mT / math.sqrt(dim)).masked_fill(~band, float("-inf"))
    windowed = scores.softmax(-1) @ v
    d = feature_dim
    s = q[..., :d] @ k[..., :d].mT / math.sqrt(d)
    kernel = 1 + s + s * s / 2
    if causal:
        kernel = kernel * (i >= j)
    taylor = kernel @ v / (kernel.sum(-1, keepdim=True) + eps)
    return torch.cat([windowed[:, :window_heads], taylor[:, window_heads:]], dim=1)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    ("window", "window_heads", "feature_dim"), [(3, 2, 4), (7, 1, 8), (30, 3, 1)]
)
def test_both_forms_are_the_docstring_formula(window, window_heads, feature_dim, causal):
    q, k, v = qkv(23, seed=3)
    expected = quadratic_reference(q, k, v, feature_dim, window, window_heads, causal)
    mechanism = build(feature_dim=feature_dim, window=window, window_heads=window_heads,
                      chunk_size=4)  # fmt: skip
    torch.testing.assert_close(mechanism(q, k, v, causal=causal), expected, **CLOSE)
    if causal:
        reference = based_reference(q, k, v, feature_dim, window, window_heads)
        torch.testing.assert_close(reference, expected, **CLOSE)


def test_the_heads_split_into_window_and_taylor():
    """Window heads are the sliding-window mechanism's; Taylor heads read only the first
    feature_dim coordinates of q and k (all of v)."""
    q, k, v = qkv(40, seed=4)
    mechanism = build(window=6, window_heads=1, feature_dim=3, chunk_size=8)
    out = mechanism(q, k, v)
    window = MECHANISMS.get("sliding-window")(D, 1, window=6, chunk_size=8)
    torch.testing.assert_close(out[:, :1], window(q[:, :1], k[:, :1], v[:, :1]), **CLOSE)
    q2, k2 = q.clone(), k.clone()
    q2[..., 3:], k2[..., 3:] = torch.randn_like(q2[..., 3:]), torch.randn_like(k2[..., 3:])
    torch.testing.assert_close(mechanism(q2, k2, v)[:, 1:], out[:, 1:], **CLOSE)
    assert not torch.allclose(mechanism(q2, k2, v)[:, :1], out[:, :1])


@pytest.mark.parametrize(("window", "window_heads", "chunk"), [(1, 2, 64), (3, 1, 4), (5, 4, 64),
                                                              (12, 2, 5), (4, 0, 3)])  # fmt: skip
def test_recurrent_form_at_windows_shorter_than_the_sequence(window, window_heads, chunk):
    mechanism = build(window=window, window_heads=window_heads, chunk_size=chunk)
    q, k, v = qkv(17, seed=8, requires_grad=True)
    assert_same_function(lambda *x: recurrent_forward(mechanism, *x), mechanism, (q, k, v))


def test_recurrent_state():
    mechanism = build(window=4, window_heads=1, feature_dim=2)
    q, k, v = qkv(9, seed=9)
    state = mechanism.initial_state(B, q.device, q.dtype)
    for t in range(9):
        _, state = mechanism.step(state, q[:, :, t], k[:, :, t], v[:, :, t])
    s, z, keys, values, seen = state
    assert seen == 9 and keys.shape == (B, 1, 4, D) and s.shape == (B, 3, 7, D)
    torch.testing.assert_close(keys, k[:, :1, 5:], atol=0, rtol=0)
    torch.testing.assert_close(values, v[:, :1, 5:], atol=0, rtol=0)
    phi_k = taylor_feature_map(k[:, 1:], 2)
    torch.testing.assert_close(z, phi_k.sum(-2), **CLOSE)
    torch.testing.assert_close(s, phi_k.mT @ v[:, 1:], **CLOSE)


def test_defaults():
    assert mechanism_params(MECHANISMS.get("based")) == {
        # the window: Based's 64 of 2,048 at the suite's 128-token recall inputs (WINDOW)
        "feature_dim": None, "window": 128 // 32, "window_heads": None, "eps": 1e-12,
        "chunk_size": 64,
    }  # fmt: skip
    assert build(dim=8).taylor_dim == 8 and build(dim=32).taylor_dim == 16
    assert [build(heads=n).window_heads for n in (1, 2, 3, 4, 8)] == [0, 1, 1, 2, 4]
    assert build(heads=1)(*qkv(5, heads=1)).shape == (B, 1, 5, D)  # Taylor only


def test_state_size_is_the_mean_over_heads_and_constant():
    """Taylor head: (1 + d + d^2)(head_dim + 1); window head: 2 window head_dim; the mean
    over heads, rounded up. At head_dim 16, 4 heads, the defaults (window 4):
    (2 x 4641 + 2 x 2 x 4 x 16) / 4."""
    assert build(heads=4, dim=16).state_size(1024) == math.ceil((2 * 273 * 17 + 2 * 128) / 4)
    mechanism = build(heads=3, feature_dim=2, window=5, window_heads=1)
    expected = math.ceil((2 * 7 * (D + 1) + 2 * 5 * D) / 3)
    assert {mechanism.state_size(n) for n in (1, 64, 10_000)} == {expected}
    assert build(window_heads=0).state_size(9) == 73 * (D + 1)
    assert build(window=10, window_heads=H).state_size(9) == 2 * 10 * D


def test_no_length_by_length_matrix():
    length = 512
    q, k, v = qkv(length, seed=10, dtype=torch.float32)
    mechanism = build(window=16, feature_dim=2, chunk_size=16)
    with LargestTensor() as seen:
        mechanism(q, k, v)
    # per head at most: the features with the ones column (L x 8), a window block's scores
    # (L x 2 x 16), the core's states
    assert seen.largest <= B * H * length * 2 * 16 < B * H * length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = build(window=10, chunk_size=8)
    q, k, v = (t.to(dtype) for t in qkv(45, seed=11, dtype=torch.float32))
    out = mechanism(q, k, v)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double())
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


def test_inputs_times_a_hundred_stay_finite():
    q, k, v = qkv(544, seed=12, dtype=torch.float32, requires_grad=True, scale=100.0, dim=16)
    out = build(dim=16)(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


@pytest.mark.parametrize(
    "params",
    [{"feature_dim": 0}, {"feature_dim": D + 1}, {"feature_dim": 2.0}, {"window": 0},
     {"window_heads": -1}, {"window_heads": H + 1}, {"window_heads": True}, {"eps": -1.0},
     {"chunk_size": 0}],
)  # fmt: skip
def test_invalid_parameters_are_refused(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        build(**params)


def test_registration():
    entry = MECHANISMS.entry("based")
    assert entry.metadata["complexity"] == "linear"
    assert entry.metadata["family"] == "linear (Taylor) + sliding window"
    assert not list(build().parameters()) and build().extra_inputs == {}
    assert not entry.obj.causal_only  # both halves have a natural non-causal form
