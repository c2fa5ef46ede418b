"""The causal linear-attention core shared by every feature-map mechanism.

out_i = sum_{j<=i} (phi_q_i . phi_k_j) v_j / (sum_{j<=i} phi_q_i . phi_k_j + eps)

The denominator rides along as an extra value column of ones, so one product gives both
sums. The causal form works in equal chunks of at most ``chunk_size`` positions: inside a
chunk the masked (C x C) scores, across chunks the (features x head_dim) state of all earlier
chunks. Two exact strategies compute it; ``strategy="auto"`` picks by device:

- ``"scan"`` (CPU): a loop over the chunks carrying a running state, with a hand-written
  backward (one reverse loop carrying the state of the later chunks). The work stays in
  cache and nothing is copied to form prefix sums, which makes it the faster form on a CPU;
  for the backward it keeps q, k, v, the state before each chunk (L/C, features, head_dim+1)
  and the in-chunk scores (L x C); without autograd, one running state and nothing else.
- ``"prefix"`` (GPU): every chunk at once, the state of earlier chunks as an exclusive prefix
  sum of per-chunk (L/C, features, head_dim+1) states. A fixed handful of kernels whatever the
  length, where the scan would launch a dozen per chunk.

Neither builds an L x L matrix nor an (L, features, head_dim) cumulative tensor. Sums run in
at least float32. ``linear_attention_reference`` is the readable quadratic form the tests
compare against; ``attend_to_scores`` is its second half, which feature-map mechanisms use
directly on short sequences (synthbench/core/mechanism.py).

Features that can be negative (``signed=True``: random Fourier features, the signed
polynomial sketches of SLAY) can drive the denominator to 0 or below. There the
denominator keeps its sign and is pushed away from 0 to magnitude at least ``eps``,
instead of adding ``eps``, which would not stop a division by a near-zero negative sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

STRATEGIES = ("auto", "scan", "prefix")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def normalise(num: torch.Tensor, den: torch.Tensor, eps: float, signed: bool) -> torch.Tensor:
    """num (..., L, D) / den (..., L), guarded as the module docstring says."""
    if signed:
        den = torch.where(den < 0, den.clamp(max=-eps), den.clamp(min=eps))
    else:
        den = den + eps
    return num / den.unsqueeze(-1)


def linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    eps: float = 1e-6,
    chunk_size: int = 64,
    signed: bool = False,
    strategy: str = "auto",
) -> torch.Tensor:
    """phi_q, phi_k: (B, H, L, F); v: (B, H, L, D) -> (B, H, L, D) in v's dtype."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    out_dtype = v.dtype
    dtype = compute_dtype(phi_q, phi_k, v)
    q, k, v = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
    D = v.shape[-1]
    # the last value column is 1: its output is the denominator sum_j phi_q_i . phi_k_j
    v = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
    if not causal:
        out = q @ (k.transpose(-1, -2) @ v)
    elif strategy == "scan" or (strategy == "auto" and q.device.type == "cpu"):
        out = _causal_scan(q, k, v, chunk_size)
    else:
        out = _causal_prefix(q, k, v, chunk_size)
    return normalise(out[..., :D], out[..., D], eps, signed).to(out_dtype)


def chunking(length: int, chunk_size: int) -> tuple[int, int]:
    """(number of chunks N, chunk length C): as few chunks as chunk_size allows, of equal
    length, so that the last one is at most N - 1 positions short. Every chunked form here
    splits this way: at L 72 and chunk_size 64, two chunks of 36, not 64 + 8 padded to 128
    (which costs the quadratic in-chunk work three times over)."""
    n = max(1, -(-length // max(1, chunk_size)))
    return n, max(1, -(-length // n))


def _causal_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int):
    """sum_{j<=i} (q_i . k_j) v_j for all chunks at once; v carries the ones column."""
    B, H, L, Fdim = q.shape
    E = v.shape[-1]
    N, C = chunking(L, chunk_size)
    pad = N * C - L
    if pad:  # zero features at padded positions contribute nothing to any sum
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q = q.reshape(B, H, N, C, Fdim)
    k = k.reshape(B, H, N, C, Fdim)
    v = v.reshape(B, H, N, C, E)
    # inside each chunk: masked quadratic scores (tril_ in place: matmul keeps its inputs,
    # not its output, for the backward)
    out = (q @ k.transpose(-1, -2)).tril_() @ v  # (B, H, N, C, E)
    if N > 1:  # across chunks: the state of all earlier chunks (exclusive prefix sum)
        kv = k.transpose(-1, -2) @ v  # (B, H, N, F, E)
        before = F.pad(kv[:, :, :-1].cumsum(2), (0, 0, 0, 0, 1, 0))
        out = out + q @ before
    # drop the padding before dividing: there 0 / (0 + eps) would be NaN for eps = 0
    return out.reshape(B, H, N * C, E)[:, :, :L]


def _causal_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int):
    """sum_{j<=i} (q_i . k_j) v_j, chunk after chunk with a running state."""
    B, H, L, Fdim = q.shape
    E = v.shape[-1]
    _, C = chunking(L, chunk_size)
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    out = _CausalScan.apply(
        q.reshape(B * H, L, Fdim), k.reshape(B * H, L, Fdim), v.reshape(B * H, L, E), C, keep
    )
    return out.reshape(B, H, L, E)


class _CausalScan(torch.autograd.Function):
    """o_i = sum_{j<=i} (q_i . k_j) v_j on (G, L, F), (G, L, F), (G, L, E), chunks of C.

    With S_n = sum_{j in chunks before n} k_j v_j^T, P_n = tril(q_n k_n^T) and the output
    gradient g:
        o_n  = P_n v_n + q_n S_n                                   (forward loop)
        dq_n = tril(g_n v_n^T) k_n + g_n S_n^T
        dk_n = tril(g_n v_n^T)^T q_n + v_n R_n^T,   dv_n = P_n^T g_n + k_n R_n
    with R_n = sum_{i in chunks after n} q_i g_i^T                  (one reverse loop).
    The forward keeps the states S_n and the scores P_n for the backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, chunk, keep):
        """keep: whether a backward can follow (else one running state, nothing saved)."""
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        G, L, Fdim = q.shape
        starts = range(0, L, chunk)
        out = torch.empty(G, L, v.shape[-1], dtype=q.dtype, device=q.device)
        states = q.new_empty(len(starts) if keep else 1, G, Fdim, v.shape[-1])
        states[0].zero_()
        scores = []
        for n, s in enumerate(starts):
            qc, kc, vc = q[:, s : s + chunk], k[:, s : s + chunk], v[:, s : s + chunk]
            state = states[n if keep else 0]
            local_scores = torch.bmm(qc, kc.mT).tril_()
            local = torch.bmm(local_scores, vc)
            out[:, s : s + chunk] = torch.baddbmm(local, qc, state) if n else local
            if keep:
                scores.append(local_scores)
                if n + 1 < len(starts):
                    torch.baddbmm(state, kc.mT, vc, out=states[n + 1])
            elif n + 1 < len(starts):
                state.baddbmm_(kc.mT, vc)
        ctx.chunk = chunk
        if keep:
            ctx.save_for_backward(q, k, v, states, *scores)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, states, *scores = ctx.saved_tensors
        g = grad.contiguous()
        chunk = ctx.chunk
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq = torch.empty_like(q) if need_q else None
        dk = torch.empty_like(k) if need_k else None
        dv = torch.empty_like(v) if need_v else None
        later = q.new_zeros(states.shape[1:])  # R_n
        last = len(scores) - 1
        for n in reversed(range(len(scores))):
            s = n * chunk
            qc, kc = q[:, s : s + chunk], k[:, s : s + chunk]
            vc, gc = v[:, s : s + chunk], g[:, s : s + chunk]
            if need_q or need_k:
                a = torch.bmm(gc, vc.mT).tril_()
            if need_q:
                local = torch.bmm(a, kc)
                dq[:, s : s + chunk] = torch.baddbmm(local, gc, states[n].mT) if n else local
            if need_k:
                local = torch.bmm(a.mT, qc)
                dk[:, s : s + chunk] = torch.baddbmm(local, vc, later.mT) if n < last else local
            if need_v:
                local = torch.bmm(scores[n].mT, gc)
                dv[:, s : s + chunk] = torch.baddbmm(local, kc, later) if n < last else local
            if (need_k or need_v) and n:
                later.baddbmm_(qc.mT, gc)
        return dq, dk, dv, None, None


def attend_to_scores(
    scores: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    eps: float = 1e-6,
    signed: bool = False,
) -> torch.Tensor:
    """The kernel-normalised output from explicit (B, H, L, L) scores phi_q . phi_k: what
    the core computes without them. In at least float32; returned in v's dtype."""
    dtype = compute_dtype(scores, v)
    scores = scores.to(dtype)
    if causal:
        scores = scores.tril()  # zero every score of a key after its query
    return normalise(scores @ v.to(dtype), scores.sum(dim=-1), eps, signed).to(v.dtype)


def linear_attention_reference(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    eps: float = 1e-6,
    signed: bool = False,
) -> torch.Tensor:
    """The same quantity through the explicit (masked) L x L kernel matrix."""
    return attend_to_scores(phi_q @ phi_k.transpose(-1, -2), v, causal, eps, signed)
