"""Retention (Sun et al. 2023, Retentive Network: A Successor to Transformer for Large
Language Models, arXiv 2307.08621, sec. 2.1-2.2), the bare retention of each head.

For head h = 0 .. H-1 (H = n_heads) with the fixed decay

    gamma_h = 1 - 2^(-5 - h)        (the paper's multi-scale choice, sec. 2.2:
                                     gamma = 1 - 2^(-5 - arange(0, h)); 31/32, 63/64, ...)

and d = head_dim, the output at position t is

    o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s / sqrt(d)) v_s,

that is, q scaled by d^(-1/2) (the paper's first normalisation factor, Q K^T / sqrt(d); its
code scales k instead, the same product). The sum is not normalised: no softmax, no
denominator. Recurrent form: S_t = gamma_h S_{t-1} + k_t^T v_t (a d x d state, S_{-1} = 0),
o_t = (q_t / sqrt(d)) S_t.

Not in the mechanism, on purpose (they belong to the model, or need a part it lacks):

- xPos, the relative-position rotation the paper multiplies into Q and K (Theta, Theta-bar):
  positions are the model's (``--pos``, docs/POSITIONS.md).
- GroupNorm of each head's output, the swish gate and the output projection W_O of gated
  multi-scale retention: the layer's output projection follows the mechanism as for every
  other one.
- The paper's second and third normalisation factors (the decay mask divided by the square
  root of its row sums, the scores divided by max(|row sum|, 1)): they are harmless there only
  because the GroupNorm that follows cancels any per-row scale; without it they would change
  the function.

The decays are a buffer ``log_decay`` = log(gamma_h) = log1p(-2^(-5 - h)), not learned,
float64 as built (a module's ``.to(dtype)`` casts it). Logarithms, so that gamma_h stays
below 1 in float32 for every head: from head 20 on, 1 - 2^(-5 - h) rounds to 1 in float32,
its logarithm does not round to 0.

Three forms of the same function:

- ``retention_reference``: the parallel representation (paper sec. 2.1),
  ((Q K^T / sqrt(d)) * D) V, * elementwise, with the (L x L) decay mask
  D_ts = gamma^(t - s) for s <= t, 0 otherwise.
- ``chunked_retention`` (``forward``): the chunkwise recurrent representation (sec. 2.1)
  in chunks of ``chunk_size``: inside a chunk the masked decayed scores; across chunks the
  d x d state S of every earlier chunk, decayed. Cost O(L (C + d) d) for chunks of C; no L x L
  matrix.
- the recurrent form (``initial_state``, ``step``), d x d numbers per head whatever the
  length.

Numerics: every decay is a power gamma^e with e >= 0, computed as exp(e log gamma), in (0, 1]:
never gamma^(-t), which overflows for long sequences (the form that divides the state by
gamma^t). Sums run in at least float32 (``compute_dtype``); the output comes back in v's
dtype. Causal only: retention has no non-causal form in the paper.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, MatrixStateMechanism
from synthbench.core.params import check_int


def retention_log_decays(n_heads: int) -> torch.Tensor:
    """log(gamma_h) = log1p(-2^(-5 - h)) for h = 0 .. n_heads - 1, float64."""
    values = [math.log1p(-(2.0 ** (-5 - h))) for h in range(n_heads)]
    return torch.tensor(values, dtype=torch.float64)


def _decay_powers(exponent: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """gamma_h^e for every head: exponent (...) >= 0, log_decay (H,) -> (H, ...)."""
    shape = (-1,) + (1,) * exponent.dim()
    return torch.exp(exponent.to(log_decay.dtype) * log_decay.view(shape))


def _causal_decay_mask(length: int, log_decay: torch.Tensor) -> torch.Tensor:
    """D (H, length, length): D_ts = gamma_h^(t - s) for s <= t, else 0."""
    positions = torch.arange(length, device=log_decay.device)
    distance = positions[:, None] - positions[None, :]  # t - s
    return _decay_powers(distance.clamp(min=0), log_decay) * (distance >= 0)


def _check_causal(causal: bool) -> None:
    if not causal:
        raise ValueError(
            "retnet is causal only: retention (Sun et al. 2023) has no non-causal form"
        )


def retention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor
) -> torch.Tensor:
    """The parallel representation: ((Q K^T / sqrt(d)) * D) V, * elementwise, with D the
    (L x L) decay mask, D_ts = gamma_h^(t - s) for s <= t, else 0."""
    dtype = compute_dtype(q, k, v)
    mask = _causal_decay_mask(q.shape[-2], log_decay.to(dtype))  # (H, L, L)
    scores = q.to(dtype) @ k.to(dtype).mT / math.sqrt(q.shape[-1])
    return ((scores * mask) @ v.to(dtype)).to(v.dtype)


def chunked_retention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The chunkwise recurrent representation: (B, H, L, d) -> (B, H, L, d).

    N = ceil(L / chunk_size) chunks of C = ceil(L / N) positions (the last one zero-padded:
    zero keys and values add nothing). For t = nC + a (a = 0 .. C-1) and S_n the recurrent
    state after position nC - 1 (the decayed sum over every earlier chunk):

        o_t     = sum_{b <= a} gamma^(a - b) (q_t . k_{nC+b}) v_{nC+b} + gamma^(a + 1) q_t S_n
        S_{n+1} = gamma^C S_n + sum_b gamma^(C - 1 - b) k_{nC+b}^T v_{nC+b}

    with q already scaled by d^(-1/2). The in-chunk terms and the per-chunk writes are
    computed for all chunks at once; only the d x d state recurrence loops over the chunks."""
    batch, heads, length, dim = q.shape
    out_dtype = v.dtype
    dtype = compute_dtype(q, k, v)
    log_decay = log_decay.to(dtype)
    N, C = chunking(length, chunk_size)
    pad = N * C - length
    q = q.to(dtype) / math.sqrt(dim)
    q, k, v = (
        F.pad(t.to(dtype), (0, 0, 0, pad)).reshape(batch, heads, N, C, dim) for t in (q, k, v)
    )

    # inside each chunk: ((q k^T) * D) v, * elementwise, D (H, C, C) broadcast over batch
    # and chunks
    inside = _causal_decay_mask(C, log_decay).unsqueeze(1)  # (H, 1, C, C)
    out = ((q @ k.mT) * inside) @ v  # (B, H, N, C, d)
    if N > 1:
        a = torch.arange(C, device=q.device)
        to_end = _decay_powers(C - 1 - a, log_decay)  # (H, C): gamma^(C - 1 - b)
        from_start = _decay_powers(a + 1, log_decay)  # (H, C): gamma^(a + 1)
        per_chunk = torch.exp(C * log_decay).view(1, heads, 1, 1)  # gamma^C
        writes = k.mT @ (v * to_end[:, None, :, None])  # (B, H, N, d, d)
        states = [writes.new_zeros(batch, heads, dim, dim)]
        for n in range(N - 1):
            states.append(per_chunk * states[-1] + writes[:, :, n])
        before = torch.stack(states, dim=2)  # (B, H, N, d, d): S_n, the state before chunk n
        out = out + (q * from_start[:, None, :, None]) @ before
    return out.reshape(batch, heads, N * C, dim)[:, :, :length].to(out_dtype)


@MECHANISMS.register(
    "retnet",
    aliases=("retention",),
    complexity="linear",
    family="retention",
    reference="Sun et al. 2023, Retentive Network (arXiv 2307.08621; retention only)",
)
class Retention(MatrixStateMechanism):
    """o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s / sqrt(head_dim)) v_s with the fixed
    per-head decays gamma_h = 1 - 2^(-5 - h), h = 0 .. n_heads - 1 (buffer ``log_decay``,
    not learned); no xPos, GroupNorm or gate. Causal only (causal=False raises ValueError).
    The exact definition, what is left out and the numerics: the module docstring.

    chunk_size: positions per chunk of the chunkwise form (>= 1, default 64; any value gives
    the same function)."""

    signed = True  # its scores q.k gamma^(t-s) take either sign (nothing normalises them)

    def __init__(self, head_dim: int, n_heads: int, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size
        self.register_buffer("log_decay", retention_log_decays(n_heads))

    @property
    def gamma(self) -> torch.Tensor:
        """The decays gamma_h (H,), from the buffer."""
        return self.log_decay.exp()

    def forward(self, q, k, v, causal: bool = True):
        _check_causal(causal)
        return chunked_retention(q, k, v, self.log_decay, self.chunk_size)

    def step(self, state, q, k, v):
        """S = gamma S + k^T v, then o = (q / sqrt(d)) S; q, k, v (batch, heads, head_dim).
        Not in place: autograd sees every state."""
        out_dtype = v.dtype
        dtype = compute_dtype(q, k, v, state)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        gamma = self.log_decay.to(dtype).exp().view(1, -1, 1, 1)
        state = gamma * state + k.unsqueeze(-1) * v.unsqueeze(-2)  # + the outer product k^T v
        out = (q.unsqueeze(-2) / math.sqrt(self.head_dim) @ state).squeeze(-2)
        return out.to(out_dtype), state
