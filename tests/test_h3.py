"""h3: the fast form (conv1d + chunked SSM) against the step-by-step reference and against an
independent recurrence written here from the paper's equations (float64, forward and
backward, every parameter), for one and several channels per group; the recurrent form; time
invariance; causality; the source's initial values and weight-decay marks; the state count;
dtypes, long sequences, options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.mechanisms.h3 import H3, h3_reference

B, H, D = 2, 2, 4
PARAM_NAMES = ("shift", "shift_D", "log_dt", "log_A_real", "A_imag", "B", "C", "D")


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(dtype=torch.float64, seed=0, **params) -> H3:
    """The mechanism, moved off its start so that every parameter matters: Delta spread over
    [0.02, 1.5] (fast and slow decays), Re(A) and B drawn."""
    torch.manual_seed(seed)
    mechanism = MECHANISMS.get("h3")(D, H, **params).to(dtype)
    ssm = mechanism.ssm
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        ssm.log_dt.copy_(torch.linspace(math.log(0.02), math.log(1.5), ssm.log_dt.numel())
                         .view(ssm.log_dt.shape))  # fmt: skip
        ssm.log_A_real.copy_(torch.empty(ssm.log_A_real.shape).uniform_(-2.3, 0.7, generator=g))
        ssm.B.copy_(torch.randn(ssm.B.shape, generator=g, dtype=torch.float64))
    return mechanism


def parameters(mechanism: H3) -> list[torch.Tensor]:
    ssm = mechanism.ssm
    return [mechanism.shift, mechanism.shift_D, *(getattr(ssm, n) for n in PARAM_NAMES[2:])]


def inputs(length, seed=0, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(B, H, length, D, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def independent(q, k, v, mechanism: H3):
    """H3 from the paper's definition, written here without the module's helpers: per channel
    the N-tap filter of k with its skip; per group of e channels u_t[i, j] = kbar_t[i] v_t[j];
    per group one diagonal SSM (Abar = exp(Delta A), Bbar = B (Abar - 1) / A, zero-order
    hold) run over each of the e x e channels, y_t = 2 Re(C . x_t) + D u_t; out_t[j] =
    sum_i q_t[i] y_t[i, j]."""
    e, ssm = mechanism.group_size, mechanism.ssm
    taps, skip = mechanism.shift, mechanism.shift_D
    length, n_taps = q.shape[2], taps.shape[-1]
    out = torch.zeros_like(q)
    for h in range(H):
        kbar = skip[h] * k[:, h]
        for t_lag in range(1, n_taps):
            delayed = F.pad(k[:, h], (0, 0, t_lag, 0))[:, :length]
            kbar = kbar + taps[h, :, t_lag] * delayed
        kbar = kbar + taps[h, :, 0] * k[:, h]
        for g in range(D // e):
            rows = slice(g * e, (g + 1) * e)
            A = torch.complex(-ssm.log_A_real[h, g].exp(), ssm.A_imag[h, g])  # noqa: N806
            abar = torch.exp(ssm.log_dt[h, g].exp() * A)
            bbar = torch.complex(ssm.B[h, g, :, 0], ssm.B[h, g, :, 1]) * (abar - 1) / A
            c = torch.complex(ssm.C[h, g, :, 0], ssm.C[h, g, :, 1])
            x = torch.zeros(B, e, e, A.shape[0], dtype=torch.complex128)
            for t in range(length):
                u = kbar[:, t, rows, None] * v[:, h, t, None, rows]  # (B, e, e)
                x = abar * x + bbar * u.unsqueeze(-1)
                y = 2 * (c * x).sum(-1).real + ssm.D[h, g] * u
                out[:, h, t, rows] = (q[:, h, t, rows, None] * y).sum(-2)
    return out


@pytest.mark.parametrize("group_size", [1, 2])
@pytest.mark.parametrize("chunk", [16, 5])
def test_fast_form_equals_both_step_by_step_forms(group_size, chunk):
    mechanism = build(d_state=6, group_size=group_size, chunk_size=chunk)
    wrt = parameters(mechanism)
    ssm_params = mechanism.ssm.params()
    for length in lengths_around(chunk):
        q, k, v = inputs(length, seed=length, requires_grad=True)
        assert_same_function(
            mechanism,
            lambda q, k, v: h3_reference(
                q, k, v, mechanism.shift, mechanism.shift_D, ssm_params, group_size
            ),
            (q, k, v),
            names=("q", "k", "v", *PARAM_NAMES),
            params=wrt,
        )
        if length <= 20:  # the independent form loops in Python: short lengths only
            assert_same_function(
                mechanism,
                lambda q, k, v: independent(q, k, v, mechanism),
                (q, k, v),
                names=("q", "k", "v", *PARAM_NAMES),
                params=wrt,
            )


def test_a_filter_longer_than_the_sequence_and_a_whole_head_as_one_group():
    """N > L (every tap reaches before the start) and e = head_dim (one e x e state)."""
    mechanism = build(d_state=24, group_size=D, chunk_size=4)
    q, k, v = inputs(11, seed=2, requires_grad=True)
    assert_same_function(
        mechanism,
        lambda q, k, v: independent(q, k, v, mechanism),
        (q, k, v),
        names=("q", "k", "v", *PARAM_NAMES),
        params=parameters(mechanism),
    )


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_recurrent_form_equals_forward(group_size):
    mechanism = build(d_state=8, group_size=group_size, chunk_size=7)
    q, k, v = inputs(23, seed=3, requires_grad=True)
    assert_same_function(
        lambda q, k, v: recurrent_forward(mechanism, q, k, v),
        mechanism,
        (q, k, v),
        names=("q", "k", "v", *PARAM_NAMES),
        params=parameters(mechanism),
    )


def test_time_invariant():
    """The same filters at every position: q, k and v delayed by s positions (zeros first)
    give the output delayed by s, zeros before it."""
    mechanism = build(d_state=8, group_size=2, chunk_size=6)
    q, k, v = inputs(30, seed=5)
    out = mechanism(q, k, v).detach()
    for delay in (1, 7, 19):
        shifted = mechanism(*(F.pad(x, (0, 0, delay, 0)) for x in (q, k, v))).detach()
        torch.testing.assert_close(shifted[:, :, delay:], out, **CLOSE)
        torch.testing.assert_close(shifted[:, :, :delay], torch.zeros_like(shifted[:, :, :delay]))


def test_the_mixing_weights_depend_on_distance_not_content():
    """With q = 1 and the filter a pure delay of one position (kbar_t = k_(t-1)), the output
    of group g is sum_s K_(t-s) k_(s-1) v_s: a key that matches the query by content gets no
    more weight than one that does not. Checked as: swapping which earlier position holds a
    given (key, value) pair changes the output as the kernel's distances say, whatever q is."""
    mechanism = build(d_state=8, group_size=1, chunk_size=8)
    with torch.no_grad():
        mechanism.shift.zero_()
        mechanism.shift[..., 1] = 1.0
        mechanism.shift_D.zero_()
        mechanism.ssm.D.zero_()
    length = 12
    q_one = torch.ones(1, H, length, D, dtype=torch.float64)
    k = torch.zeros(1, H, length, D, dtype=torch.float64)
    v = torch.zeros_like(k)
    k[:, :, 2], v[:, :, 3] = 1.0, 1.0  # one pair: key at 2, value at 3
    early = mechanism(q_one, k, v).detach()[:, :, -1]
    k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
    k2[:, :, 7], v2[:, :, 8] = 1.0, 1.0  # the same pair, 5 positions later
    late = mechanism(q_one, k2, v2).detach()[:, :, -1]
    kernel = impulse_response(mechanism, length)  # (H, G, L)
    torch.testing.assert_close(early, kernel[:, :, length - 1 - 3].unsqueeze(0), **CLOSE)
    torch.testing.assert_close(late, kernel[:, :, length - 1 - 8].unsqueeze(0), **CLOSE)
    # a query aligned with the key changes nothing but the read-out's scale
    q_key = 3 * torch.ones_like(q_one)
    torch.testing.assert_close(mechanism(q_key, k, v).detach()[:, :, -1], 3 * early, **CLOSE)


def impulse_response(mechanism: H3, length: int) -> torch.Tensor:
    """The SSM kernel K_l of each group (D excluded): its output to u = delta at 0."""
    ssm = mechanism.ssm
    A = torch.complex(-ssm.log_A_real.exp(), ssm.A_imag).detach()  # noqa: N806
    abar = torch.exp(ssm.log_dt.exp().detach().unsqueeze(-1) * A)
    bbar = torch.complex(ssm.B[..., 0], ssm.B[..., 1]).detach() * (abar - 1) / A
    c = torch.complex(ssm.C[..., 0], ssm.C[..., 1]).detach()
    steps = torch.arange(length, dtype=torch.float64)
    return 2 * (c.unsqueeze(-1) * bbar.unsqueeze(-1) * abar.unsqueeze(-1) ** steps).sum(-2).real


def test_causal_exactly():
    """Changing every input after position t leaves outputs up to t bit for bit the same."""
    mechanism = build(dtype=torch.float32, d_state=16, group_size=2, chunk_size=8)
    q, k, v = inputs(40, seed=6, dtype=torch.float32)
    out = mechanism(q, k, v).detach()
    for t in (0, 9, 31):
        changed = [x.clone() for x in (q, k, v)]
        for x in changed:
            x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 100
        torch.testing.assert_close(mechanism(*changed).detach()[:, :, : t + 1],
                                   out[:, :, : t + 1], atol=0, rtol=0)  # fmt: skip


def test_initial_values_are_the_sources():
    torch.manual_seed(0)
    mechanism = MECHANISMS.get("h3")(16, 4)
    bound = 1 / math.sqrt(64)  # torch's Conv1d init (kaiming uniform, a = sqrt(5)), N 64
    assert mechanism.shift.shape == (4, 16, 64)
    assert float(mechanism.shift.detach().abs().max()) <= bound
    assert float(mechanism.shift.detach().std()) > bound / 3
    assert abs(float(mechanism.shift_D.detach().std()) - 1) < 0.3  # standard normal
    ssm = mechanism.ssm
    n = torch.arange(32, dtype=torch.float32)
    torch.testing.assert_close(ssm.A_imag, (math.pi * n).expand(4, 16, 32))  # S4D-Lin
    torch.testing.assert_close(ssm.log_A_real.exp(), torch.full((4, 16, 32), 0.5))
    dt = ssm.log_dt.exp()
    assert bool((dt >= 1e-3).all()) and bool((dt <= 1e-1).all())
    decayed = {n for n, p in mechanism.named_parameters() if not getattr(p, "_no_weight_decay", 0)}
    assert decayed == {"shift", "shift_D", "ssm.C", "ssm.D"}
    grouped = MECHANISMS.get("h3")(16, 4, group_size=2)
    assert grouped.ssm.D.shape == (4, 8) and grouped.shift.shape == (4, 16, 64)


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_state_size_counts_the_recurrent_state(group_size):
    mechanism = build(d_state=8, group_size=group_size)
    keys, ssm = mechanism.initial_state(1, "cpu", torch.float64)
    per_head = (keys.numel() + 2 * ssm.numel()) // H  # a complex number is two reals
    assert {mechanism.state_size(n) for n in (1, 64, 1000)} == {per_head}
    assert per_head == 7 * D + (D // group_size) * group_size**2 * 8


def test_no_length_by_length_tensor():
    q, k, v = inputs(150, seed=8)
    with LargestTensor() as seen:
        build(d_state=8, chunk_size=16)(q, k, v)
    assert seen.largest < B * H * 150 * 150 * D


def test_long_sequences_in_float32_match_float64():
    reference = build(d_state=16, group_size=2)
    mechanism = build(dtype=torch.float32, d_state=16, group_size=2)
    q, k, v = inputs(1500, seed=9, dtype=torch.float32)
    out = mechanism(q, k, v)
    assert out.dtype == torch.float32 and bool(out.isfinite().all())
    expected = reference(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_come_back_as_given(dtype):
    mechanism = build(dtype=torch.float32, d_state=8, chunk_size=16)
    q, k, v = (x.to(dtype) for x in inputs(45, seed=10, dtype=torch.float32))
    out = mechanism(q, k, v)
    assert out.dtype == dtype and bool(out.isfinite().all())
    expected = mechanism(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"group_size": 3}, "group_size 3 must divide head_dim 4"),
        ({"group_size": 0}, "group_size must be an integer >= 1"),
        ({"d_state": 7}, "d_state must be even"),
        ({"init": "legs"}, "init must be one of lin, inv"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_options_are_refused_in_one_line(params, message):
    with pytest.raises(ValueError, match=message):
        MECHANISMS.get("h3")(D, H, **params)


def test_causal_only_registered_and_defaults():
    q, k, v = inputs(5)
    with pytest.raises(ValueError, match="h3 is causal only"):
        build()(q, k, v, causal=False)
    entry = MECHANISMS.entry("h3")
    assert entry.metadata["complexity"] == "linear" and "2212.14052" in entry.metadata["reference"]
    assert "time-invariant" in entry.metadata["family"]
    assert mechanism_params(entry.obj) == {
        "d_state": 64, "group_size": 1, "init": "lin", "dt_min": 1e-3, "dt_max": 1e-1,
        "chunk_size": 64,
    }  # fmt: skip
