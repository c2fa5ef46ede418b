"""The causal linear-attention core shared by every feature-map mechanism.

out_i = sum_{j<=i} (phi_q_i . phi_k_j) v_j / (sum_{j<=i} phi_q_i . phi_k_j + eps)

The causal form is computed in equal chunks of at most ``chunk_size`` positions: inside a
chunk the masked (C x C) scores, across chunks a running (features x head_dim) state per
chunk. It never builds an L x L matrix nor an (L, features, head_dim) cumulative tensor;
the largest intermediates are (L/C, features, head_dim) and (L/C, C, C). Sums run in at
least float32.
``linear_attention_reference`` is the readable quadratic form the tests compare against.

Features that can be negative (``signed=True``: random Fourier features, the signed
polynomial sketches of SLAY) can drive the denominator to 0 or below. There the
denominator keeps its sign and is pushed away from 0 to magnitude at least ``eps``,
instead of adding ``eps``, which would not stop a division by a near-zero negative sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
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
) -> torch.Tensor:
    """phi_q, phi_k: (B, H, L, F); v: (B, H, L, D) -> (B, H, L, D) in v's dtype."""
    out_dtype = v.dtype
    dtype = _compute_dtype(phi_q, phi_k, v)
    q, k, v = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
    if not causal:
        kv = k.transpose(-1, -2) @ v  # (B, H, F, D)
        z = k.sum(dim=-2)  # (B, H, F)
        num = q @ kv
        den = (q @ z.unsqueeze(-1)).squeeze(-1)
        return normalise(num, den, eps, signed).to(out_dtype)

    B, H, L, Fdim = q.shape
    D = v.shape[-1]
    N = max(1, -(-L // max(1, chunk_size)))  # as few chunks as chunk_size allows,
    C = max(1, -(-L // N))  # of equal size, so that at most N - 1 positions are padding
    pad = N * C - L
    if pad:  # zero features at padded positions contribute nothing to any sum
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q = q.reshape(B, H, N, C, Fdim)
    k = k.reshape(B, H, N, C, Fdim)
    v = v.reshape(B, H, N, C, D)

    # inside each chunk: masked quadratic scores
    scores = (q @ k.transpose(-1, -2)).tril()  # (B, H, N, C, C)
    num = scores @ v
    den = scores.sum(dim=-1)

    if N > 1:  # across chunks: the state of all earlier chunks (exclusive prefix sum)
        kv = k.transpose(-1, -2) @ v  # (B, H, N, F, D)
        z = k.sum(dim=-2)  # (B, H, N, F)
        kv_before = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1].cumsum(2)], dim=2)
        z_before = torch.cat([torch.zeros_like(z[:, :, :1]), z[:, :, :-1].cumsum(2)], dim=2)
        num = num + q @ kv_before
        den = den + (q @ z_before.unsqueeze(-1)).squeeze(-1)

    # drop the padding before dividing: there 0 / (0 + eps) would be NaN for eps = 0
    num = num.reshape(B, H, N * C, D)[:, :, :L]
    den = den.reshape(B, H, N * C)[:, :, :L]
    return normalise(num, den, eps, signed).to(out_dtype)


def linear_attention_reference(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    eps: float = 1e-6,
    signed: bool = False,
) -> torch.Tensor:
    """The same quantity through the explicit (masked) L x L kernel matrix."""
    scores = phi_q @ phi_k.transpose(-1, -2)  # (B, H, L, L)
    if causal:
        scores = scores.tril()  # zero every score of a key after its query
    return normalise(scores @ v, scores.sum(dim=-1), eps, signed)
