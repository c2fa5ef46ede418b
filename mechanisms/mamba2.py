"""Mamba-2's state-space duality (SSD) layer core (Dao and Gu 2024, Transformers are SSMs:
Generalized Models and Efficient Algorithms Through Structured State Space Duality, arXiv
2405.21060, sec. 6-7), as an attention-like mechanism: the selective SSM with a scalar decay
per head and token, read through the SSD duality C = q, B = k, X = v.

Per head h, with d = head_dim, q_t, k_t, v_t in R^d (rows of the (batch, heads, length, d)
inputs), the extra input ``dt`` (batch, heads, length, 1), raw, and the head's learned
parameters ``A_log[h]`` and ``dt_bias[h]``:

    Delta_t = softplus(dt_t + dt_bias[h])                (the step size, > 0)
    A_h     = -exp(A_log[h])                             (< 0)
    a_t     = exp(Delta_t * A_h)                         (the decay, a scalar in (0, 1))
    S_t     = a_t S_{t-1} + Delta_t k_t^T v_t             (S is d x d, S_{-1} = 0)
    o_t     = q_t S_t                                     (a row of length d, no scale)

that is, Mamba-2's h_t = exp(Delta_t A) h_{t-1} + Delta_t B_t x_t^T, y_t = C_t^T h_t with its
discretisation (zero-order hold on A, Euler on B: the X * dt, A * dt of its reference code),
B = k, C = q, X = v, the state size N and the head size P both head_dim. S_t is indexed
(key coordinate, value coordinate). Unrolled, the SSD "attention" form:

    o_t = sum_{s <= t} (q_t . k_s) exp(sum_{s < r <= t} Delta_r A_h) Delta_s v_s

The output reads the state after the write (o_t sees v_t). q is not scaled: Mamba-2 reads its
state with C as it is.

Parameters, per head (n_heads each, float32 as built), drawn from torch's global random
generator at construction in Mamba-2's order (its ``Mamba2Simple.__init__``), so that the
engine's seed before building the model fixes them:

- ``dt_bias``: Delta0 = exp(u (log 0.1 - log 0.001) + log 0.001), u ~ uniform[0, 1)
  (``torch.rand(n_heads)``), i.e. log-uniform in [1e-3, 1e-1], clamped below at 1e-4 (a no-op
  here), stored as its inverse softplus dt_bias = Delta0 + log(-expm1(-Delta0)), so that
  softplus(dt_bias) = Delta0 (dt_bias in about [-6.9, -2.25]).
- ``A_log`` = log(A0), A0 ~ uniform[1, 16] (``torch.empty(n_heads).uniform_(1, 16)``,
  Mamba-2's A_init_range), so A_log in [0, log 16].

As in Mamba-2, neither is weight-decayed: both are marked ``_no_weight_decay``, which
synthbench's training honours (``train.parameter_groups``).

Left to the model in the core track: Mamba-2's D skip term, its gate and RMSNorm, the short
causal convolution and SiLU on x, B, C, the groups of B and C shared across heads; the block
track has them all in ``Mamba2Layer`` (below, "The published layer"). dt_limit is left out
in both (its default (0, inf) clamps nothing). No positions either (``--pos``).
Causal only: the SSM is a recurrence; ``causal=False`` raises ValueError.

The published layer (``Mamba2Layer``, ``Mamba2.layer``), in the order of mamba_ssm/modules/
mamba2.py (``Mamba2.forward``, its non-fused path, and ``Mamba2.step``; the same as
fla/layers/mamba2.py) and the paper's fig. 6 and sec. 7 (the "Mamba-2 block"):

- ``in_proj`` (Linear, no bias) from d_model to [z, x, B, C, dt]: d_inner = expand * d_model
  each for z and x, ngroups * d_state each for B and C, one dt per head, H = d_inner / headdim
  heads (the model's n_heads is not used: the source derives its heads from headdim).
- a depthwise causal conv1d of width d_conv WITH a bias over [x, B, C] together, then SiLU
  (``ShortConvolution(bias=True)``; mamba_ssm's ``conv1d``, ``conv_bias=True``).
- the SSD recurrence of this module per head, x = v (headdim wide), B = k and C = q (d_state
  wide), head h reading group h // (H / ngroups) of B and C (mamba_ssm/ops/triton/
  ssd_chunk_state.py, ``pid_h // nheads_ngroups_ratio``); Delta = softplus(dt + dt_bias) and
  A = -exp(A_log) inside the core as above. The state is (d_state x headdim) per head, the
  transpose of mamba_ssm's (headdim, d_state) layout: the same numbers.
- the D skip: y + D_h x per head (``D`` ones at the start, ``D_has_hdim=False``).
- the gated norm rmsnorm(y * silu(z)) * weight over groups of d_inner / ngroups channels
  (mamba_ssm's ``RMSNormGated(norm_before_gate=False, group_size=d_ssm // ngroups)``, eps
  1e-5): ``GatedRMSNorm(norm_before_gate=False)``.
- ``out_proj`` (Linear, no bias) back to d_model.

Initial values, as mamba_ssm's ``Mamba2.__init__`` draws them in order after in_proj and
conv1d (torch defaults there, ``conv_init=None``): dt_bias with softplus(dt_bias) log-uniform
in [dt_min, dt_max] = [1e-3, 1e-1] floored at dt_init_floor = 1e-4, A_log = log(uniform[
A_init_range]) with (1, 16), D = 1; the norm's weight 1. dt_bias, A_log and D are not
weight-decayed. Defaults are the source's: d_state 128, d_conv 4, expand 2, headdim 64,
ngroups 1, chunk_size 256, norm_eps 1e-5; at d_model 64 that is 2 heads of 64 (not
degenerate, so kept). The parallel form is ``chunked_ssd``, the recurrent one ``ssd_step``
with ``ShortConvolution.step``; both run in float32 at least, as mamba_ssm's A.float().

Three forms of the same function:

- ``ssd_reference``: the recurrence above, one token at a time, the readable reference.
- ``chunked_ssd`` (``forward``): the SSD algorithm of the paper (sec. 6, its listing 1,
  ``ssd_minimal_discrete``) in N = ceil(L / chunk_size) chunks of C = ceil(L / N) positions.
  With l_t = Delta_t A_h = log a_t and segsum(l)_ij = sum_{j < r <= i} l_r for j <= i, -inf
  above the diagonal:

      inside a chunk:    O = ((Q K^T) * exp(segsum(l))) (Delta * V)       (diagonal blocks)
      chunk states:      W_n = sum_j exp(sum_{j < r <= end} l_r) Delta_j k_j^T v_j
      state passing:     S_n = sum_{m < n} exp(sum of the whole log decays of chunks
                               m+1 .. n-1) W_m   (the segsum over the chunks' totals)
      state to output:   O += (Q * exp(cumsum(l))) S_n                     (off-diagonal)

  every chunk at once, the state passing a (N x N) product over the chunks: no Python loop
  over chunks or positions. Cost O(L (C + d) d + N^2 d^2) per head; no L x L matrix. The
  last chunk is zero-padded with q = k = v = 0 and l = 0 (Delta = 0): it decays nothing and
  writes nothing.
- the recurrent form (``initial_state``, ``step``): S, d x d numbers per head whatever L.

Numerics: Delta is a softplus (finite for any finite dt, from x100 inputs too); each l_t <= 0.
Every decay exponentiated is a sum of l over a segment j < r <= i, computed as segsum does:
the l_r masked to the segment BEFORE the sum (no difference of two long cumulative sums,
never exp(-cumsum)), and 0 above the diagonal after the exponential (``segsum_exp``: the
exp(-inf) of segsum's -inf there), or a cumulative sum from the chunk's start or back from
its end, <= 0. Sums run in at least float32 (``compute_dtype``, the parameters cast to it);
the output comes back in v's dtype.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import GatedRMSNorm, Layer, ShortConvolution
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, MatrixStateMechanism
from synthbench.core.params import check_int, check_positive

A_INIT_RANGE = (1.0, 16.0)  # A0 ~ uniform[1, 16], A_log = log(A0) (Mamba-2's A_init_range)
DT_MIN, DT_MAX, DT_INIT_FLOOR = 1e-3, 1e-1, 1e-4  # softplus(dt_bias) log-uniform in [1e-3, 1e-1]


def _check_inputs(causal: bool, dt: torch.Tensor | None) -> None:
    if not causal:
        raise ValueError("mamba2 is causal only: the state-space model is a recurrence")
    if dt is None:
        raise ValueError("mamba2 needs its extra input dt (batch, heads, length, 1)")


def _prepared(q, k, v, dt, A_log, dt_bias):  # noqa: N803 - Mamba-2's names
    """q, k, v, Delta (B, H, L) and log a = Delta A (B, H, L), in the compute dtype; dt
    (..., 1) raw, A_log and dt_bias (H,). Works on one position too (no length axis)."""
    dtype = compute_dtype(q, k, v, dt, A_log, dt_bias)
    q, k, v, dt, A_log, dt_bias = (t.to(dtype) for t in (q, k, v, dt, A_log, dt_bias))
    shape = (-1,) + (1,) * (dt.dim() - 3)  # heads is dim 1 of dt[..., 0]
    delta = F.softplus(dt[..., 0] + dt_bias.view(shape))
    log_a = -delta * A_log.exp().view(shape)
    return q, k, v, delta, log_a


def ssd_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803
    dt_bias: torch.Tensor,
) -> torch.Tensor:
    """The recurrence of the module docstring, token after token: q, k, v (B, H, L, d), dt
    (B, H, L, 1) raw, A_log and dt_bias (H,) -> (B, H, L, d) in v's dtype."""
    out_dtype = v.dtype
    q, k, v, delta, log_a = _prepared(q, k, v, dt, A_log, dt_bias)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, v.shape[-1])  # S: (key coordinate, value coordinate)
    outs = []
    for t in range(length):
        a_t = log_a[:, :, t].exp().view(batch, heads, 1, 1)
        delta_t = delta[:, :, t].view(batch, heads, 1, 1)
        state = a_t * state + delta_t * k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append((q[:, :, t].unsqueeze(-2) @ state).squeeze(-2))  # q_t S_t
    return torch.stack(outs, dim=-2).to(out_dtype)


def _segment_sums(x: torch.Tensor) -> torch.Tensor:
    """x (..., T) -> (..., T, T): sum_{j < r <= i} x_r below the diagonal, 0 on and above it
    (an empty segment). Each x_r is masked to its segments before the cumulative sum."""
    T = x.shape[-1]
    segments = x.unsqueeze(-1).expand(*x.shape, T).tril(-1)  # row r, column j: x_r if j < r
    return segments.cumsum(-2)  # row i, column j: sum of x_r for j < r <= i


def segsum(x: torch.Tensor) -> torch.Tensor:
    """x (..., T) -> (..., T, T): out_ij = sum_{j < r <= i} x_r for j <= i (0 on the
    diagonal), -inf for j > i. Each x_r is masked to its segments before the cumulative sum
    (no difference of cumulative sums), as ssd_minimal's stable segsum. The readable form
    of ``segsum_exp``'s sums, which the chunked forms take."""
    T = x.shape[-1]
    above = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    return _segment_sums(x).masked_fill(above, -math.inf)


def sums_to_end(x: torch.Tensor) -> torch.Tensor:
    """x (..., T) -> (..., T): sum_{j < r < T} x_r, segsum's last row (0 for j = T - 1),
    summed back from the end (a cumulative sum of the reversed x_r, no difference of sums)."""
    return F.pad(x[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1))


SEGMENT_PRODUCT_MAX = 64  # up to this T, segsum_exp sums the segments by one matrix product


@functools.lru_cache(maxsize=16)
def _segment_indicator(T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(T, T * T), built once per size, dtype and device: row r, column i T + j is 1 where
    j < r <= i (x_r in the segment of (i, j)), else 0."""
    r = torch.arange(T, device=device)
    inside = (r.view(1, 1, T) <= r.view(T, 1, 1)) & (r.view(1, T, 1) < r.view(1, 1, T))
    return inside.to(dtype).view(T * T, T).T.contiguous()  # inside[i, j, r]


def segsum_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(segsum(x)), (..., T, T): exp(sum_{j < r <= i} x_r) for j <= i, 0 for j > i. The
    segment sums are segsum's, each x_r masked to its segments before the sum: up to
    SEGMENT_PRODUCT_MAX positions as one product of x with the 0/1 segment indicator (each
    x_r times 1 in its segments, 0 elsewhere: no difference of sums; one product each way
    instead of the cumulative sum's passes), beyond that (or where float32 products may be
    rounded: torch's float32 matmul precision not "highest") as segsum's cumulative sum.
    Above the diagonal the sum is empty, 0: its exponential 1, which ``tril`` zeroes (as
    exp(-inf) = 0, without an exponential of -inf)."""
    T = x.shape[-1]
    exact = x.dtype != torch.float32 or torch.get_float32_matmul_precision() == "highest"
    if T <= SEGMENT_PRODUCT_MAX and exact:  # not where float32 products may round (TF32)
        # an x_r of -inf (an overflowed decay) would give 0 * x_r = nan outside its segments:
        # the lowest finite value instead, whose sums exponentiate to 0 as -inf's do
        x = x.clamp(min=torch.finfo(x.dtype).min)
        # one (rows, T) by (T, T * T) product, whatever x's strides (not T * T-wide bmm's)
        sums = x.reshape(-1, T) @ _segment_indicator(T, x.dtype, x.device)
        sums = sums.view(*x.shape, T)
    else:
        sums = _segment_sums(x)
    return sums.exp().tril()


def chunked_ssd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803
    dt_bias: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The chunked SSD form of the module docstring: the same function as ``ssd_reference``,
    q, k, v (B, H, L, d), dt (B, H, L, 1) raw, A_log and dt_bias (H,) -> (B, H, L, d)."""
    out_dtype = v.dtype
    q, k, v, delta, log_a = _prepared(q, k, v, dt, A_log, dt_bias)
    batch, heads, length, dim = q.shape
    dim_v = v.shape[-1]
    N, C = chunking(length, chunk_size)
    pad = N * C - length
    x = v * delta.unsqueeze(-1)  # Delta_t v_t: what position t writes
    q, k, x = (F.pad(t, (0, 0, 0, pad)).reshape(batch, heads, N, C, t.shape[-1]) for t in (q, k, x))
    log_a = F.pad(log_a, (0, pad)).reshape(batch, heads, N, C)

    # 1. inside each chunk: the masked quadratic form with the decay mask exp(segsum)
    decays = segsum_exp(log_a)  # (B, H, N, C, C): exp(segsum), 0 above the diagonal
    out = ((q @ k.mT) * decays) @ x  # (B, H, N, C, d_v)
    if N > 1:
        cumulative = log_a.cumsum(-1)  # (B, H, N, C): log decay from the chunk's start, <= 0
        # 2. each chunk's writes, decayed to its end: exp(l_{j+1} + ... + l_end) <= 1 (the
        # segsum's last row), the l after j summed back from the chunk's end
        to_end = sums_to_end(log_a)  # (B, H, N, C)
        writes = (k * to_end.exp().unsqueeze(-1)).mT @ x  # (B, H, N, d, d_v)
        # 3. state passing: S_n = sum_{m < n} exp(totals of chunks m+1 .. n-1) W_m, with
        # totals[m'] the whole log decay of chunk m' - 1 (totals[0] = 0 for no chunk)
        totals = F.pad(cumulative[:, :, :-1, -1], (1, 0))  # (B, H, N)
        starts = F.pad(writes[:, :, :-1], (0, 0, 0, 0, 1, 0))  # W_{n-1} (0 for n = 0)
        passing = segsum_exp(totals)  # (B, H, N, N)
        before = (passing @ starts.flatten(-2)).view(batch, heads, N, dim, dim_v)
        # 4. the state before the chunk, read by each query decayed from the chunk's start
        out = out + (q * cumulative.exp().unsqueeze(-1)) @ before
    return out.reshape(batch, heads, N * C, dim_v)[:, :, :length].to(out_dtype)


def ssd_step(state, q, k, v, dt, A_log, dt_bias):  # noqa: N803
    """One position of the recurrence: state S (batch, heads, d_k, d_v), q, k (batch, heads,
    d_k), v (batch, heads, d_v), dt (batch, heads, 1) raw, A_log and dt_bias (heads,).
    S <- a S + Delta k^T v, then o = q S -> (o in v's dtype, the new S). Not in place."""
    out_dtype = v.dtype
    q, k, v, delta, log_a = _prepared(q, k, v, dt, A_log, dt_bias)
    dtype = torch.promote_types(q.dtype, state.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    a, delta = log_a.to(dtype).exp()[..., None, None], delta.to(dtype)[..., None, None]
    state = a * state + delta * k.unsqueeze(-1) * v.unsqueeze(-2)
    out = (q.unsqueeze(-2) @ state).squeeze(-2)
    return out.to(out_dtype), state


def initial_dt_bias(
    n_heads: int, dt_min: float = DT_MIN, dt_max: float = DT_MAX, floor: float = DT_INIT_FLOOR
) -> torch.Tensor:
    """Mamba-2's dt_bias: softplus(dt_bias) log-uniform in [dt_min, dt_max], clamped below at
    ``floor`` (torch's global generator), as the module docstring says."""
    low, high = math.log(dt_min), math.log(dt_max)
    delta0 = torch.exp(torch.rand(n_heads) * (high - low) + low).clamp(min=floor)
    return delta0 + torch.log(-torch.expm1(-delta0))  # the inverse of softplus


def initial_A_log(n_heads: int, A_init_range=A_INIT_RANGE) -> torch.Tensor:  # noqa: N802, N803
    """Mamba-2's A_log = log(uniform[1, 16]) (torch's global generator)."""
    return torch.empty(n_heads).uniform_(*A_init_range).log()


@MECHANISMS.register(
    "mamba2",
    aliases=("ssd",),
    complexity="linear",
    family="ssm",
    reference="Dao and Gu 2024, Transformers are SSMs (arXiv 2405.21060; the SSD core of Mamba-2)",
)
class Mamba2(MatrixStateMechanism):
    """S_t = a_t S_{t-1} + Delta_t k_t^T v_t, o_t = q_t S_t (no scale), with
    Delta_t = softplus(dt_t + dt_bias) and a_t = exp(-Delta_t exp(A_log)), scalars per head
    and token; ``dt`` an extra input of width 1 (raw), ``A_log`` and ``dt_bias`` learned
    parameters per head initialised as Mamba-2's. No D skip term, gate or normalisation.
    Causal only (causal=False raises ValueError). The exact definition, the initialisation,
    the chunked form and what is left out: the module docstring.

    chunk_size: positions per chunk of the SSD form (>= 1, default 64; any value gives the
    same function)."""

    signed = True  # its implicit attention weights (q.k) decay Delta take either sign

    def __init__(self, head_dim: int, n_heads: int, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size
        self.extra_inputs = {"dt": 1}
        # Mamba-2's order: dt_bias drawn first, then A_log
        self.dt_bias = nn.Parameter(initial_dt_bias(n_heads))
        self.A_log = nn.Parameter(initial_A_log(n_heads))
        for param in (self.dt_bias, self.A_log):  # as Mamba-2: no weight decay (train.py)
            param._no_weight_decay = True

    def forward(self, q, k, v, causal: bool = True, dt: torch.Tensor | None = None):
        _check_inputs(causal, dt)
        return chunked_ssd(q, k, v, dt, self.A_log, self.dt_bias, self.chunk_size)

    def step(self, state, q, k, v, dt: torch.Tensor | None = None):
        """One position: q, k, v (batch, heads, head_dim), dt (batch, heads, 1) raw.
        S <- a S + Delta k^T v, then o = q S. Not in place: autograd sees every state."""
        _check_inputs(True, dt)
        return ssd_step(state, q, k, v, dt, self.A_log, self.dt_bias)


def _check_options(d_inner, headdim, ngroups, dt_min, dt_max, dt_init_floor, A_range):  # noqa: N803
    """One-line ValueErrors for the Mamba2Layer options that check_int does not cover."""
    check_int("headdim", headdim, 1)
    check_int("ngroups", ngroups, 1)
    if d_inner % headdim:
        raise ValueError(f"headdim {headdim} must divide expand * d_model = {d_inner}")
    if (d_inner // headdim) % ngroups:
        raise ValueError(f"ngroups {ngroups} must divide the {d_inner // headdim} heads")
    check_positive(dt_min=dt_min, dt_max=dt_max)
    if dt_max < dt_min:
        raise ValueError(f"dt_max {dt_max} must be >= dt_min {dt_min}")
    if isinstance(dt_init_floor, bool) or not isinstance(dt_init_floor, int | float):
        raise ValueError(f"dt_init_floor must be a number >= 0, got {dt_init_floor!r}")
    if not dt_init_floor >= 0:
        raise ValueError(f"dt_init_floor must be a number >= 0, got {dt_init_floor!r}")
    numbers = isinstance(A_range, tuple | list) and len(A_range) == 2
    if not numbers or not all(isinstance(a, int | float) and a is not True for a in A_range):
        raise ValueError(f"A_init_range must be two numbers (low, high), got {A_range!r}")
    if not 0 < A_range[0] <= A_range[1]:
        raise ValueError(f"A_init_range must have 0 < low <= high, got {A_range!r}")


class Mamba2Layer(Layer):
    """Mamba-2's whole mixer (mamba_ssm/modules/mamba2.py ``Mamba2``): in_proj to
    [z, x, B, C, dt], causal depthwise conv (with bias) and SiLU over [x, B, C], the SSD
    recurrence (``chunked_ssd``, ``ssd_step``) with B and C shared by the heads of a group,
    the D skip, rmsnorm(y * silu(z)) * weight per group, out_proj. The parts, their sources
    and the defaults: the module docstring, "The published layer".

    ``n_heads`` is not used: as in the source, the heads are expand * d_model / headdim."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        dt_init_floor: float = DT_INIT_FLOOR,
        A_init_range: tuple = A_INIT_RANGE,  # noqa: N803 - mamba_ssm's name
        chunk_size: int = 256,
        norm_eps: float = 1e-5,
    ):
        super().__init__(d_model, n_heads)
        for name, value in (("d_state", d_state), ("d_conv", d_conv), ("expand", expand)):
            check_int(name, value, 1)
        check_int("chunk_size", chunk_size, 1)
        check_positive(norm_eps=norm_eps)
        d_inner = expand * d_model
        _check_options(d_inner, headdim, ngroups, dt_min, dt_max, dt_init_floor, A_init_range)
        self.d_state, self.d_inner, self.headdim, self.ngroups = d_state, d_inner, headdim, ngroups
        self.nheads = d_inner // headdim
        self.chunk_size = chunk_size
        self.conv_dim = d_inner + 2 * ngroups * d_state  # x, B, C go through the convolution
        # mamba_ssm's order of construction (its global-generator draws): in_proj, conv1d,
        # dt_bias, A_log, D, norm, out_proj
        self.in_proj = nn.Linear(d_model, d_inner + self.conv_dim + self.nheads, bias=False)
        self.conv = ShortConvolution(self.conv_dim, d_conv, activation=True, bias=True)
        self.dt_bias = nn.Parameter(initial_dt_bias(self.nheads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(initial_A_log(self.nheads, A_init_range))
        self.D = nn.Parameter(torch.ones(self.nheads))
        for param in (self.dt_bias, self.A_log, self.D):  # as mamba_ssm: no weight decay
            param._no_weight_decay = True
        self.norm = GatedRMSNorm(
            d_inner, eps=norm_eps, norm_before_gate=False, group_size=d_inner // ngroups
        )
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _split(self, zxbcdt: torch.Tensor):
        """in_proj's output (..., width) -> z (..., d_inner), xBC (..., conv_dim), dt (..., H)."""
        return zxbcdt.split([self.d_inner, self.conv_dim, self.nheads], dim=-1)

    def _heads(self, xbc: torch.Tensor):
        """The convolved [x, B, C] (..., conv_dim) -> x (..., H, headdim) and B, C
        (..., H, d_state), each group's B and C repeated for its heads (head h reads group
        h // (H / ngroups), as mamba_ssm's kernels)."""
        width = self.ngroups * self.d_state
        x, b, c = xbc.split([self.d_inner, width, width], dim=-1)
        per_group = self.nheads // self.ngroups
        x = x.unflatten(-1, (self.nheads, self.headdim))
        b, c = (
            t.unflatten(-1, (self.ngroups, self.d_state)).repeat_interleave(per_group, dim=-2)
            for t in (b, c)
        )
        return x, b, c

    def _output(self, y: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, x (..., H, headdim) -> out_proj(rmsnorm((y + D x) * silu(z)) * weight)."""
        y = (y + self.D.to(y.dtype).unsqueeze(-1) * x).flatten(-2)
        return self.out_proj(self.norm(y, z))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        z, xbc, dt = self._split(self.in_proj(x))
        xs, b, c = self._heads(self.conv(xbc))  # (batch, length, H, .)
        y = chunked_ssd(
            *(t.transpose(1, 2) for t in (c, b, xs)),  # C = q, B = k, x = v
            dt.transpose(1, 2).unsqueeze(-1),  # (batch, H, length, 1)
            self.A_log,
            self.dt_bias,
            self.chunk_size,
        ).transpose(1, 2)
        return self._output(y, xs, z)

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(the convolution's last d_conv - 1 inputs, the SSM state S (batch, H, d_state,
        headdim) = 0 in at least float32)."""
        ssm = torch.zeros(
            batch,
            self.nheads,
            self.d_state,
            self.headdim,
            device=device,
            dtype=torch.promote_types(dtype, torch.float32),
        )
        return self.conv.initial_state(batch, device, dtype), ssm

    def step(self, state, x: torch.Tensor):
        conv_state, ssm = state
        z, xbc, dt = self._split(self.in_proj(x))
        xbc, conv_state = self.conv.step(conv_state, xbc)
        xs, b, c = self._heads(xbc)  # (batch, H, .)
        y, ssm = ssd_step(ssm, c, b, xs, dt.unsqueeze(-1), self.A_log, self.dt_bias)
        return self._output(y, xs, z), (conv_state, ssm)

    def state_size(self, seq_len: int) -> int:
        """The convolution's window of [x, B, C] and the (d_state x headdim) state per head."""
        return (self.conv.kernel - 1) * self.conv_dim + self.nheads * self.d_state * self.headdim


Mamba2.layer = Mamba2Layer
