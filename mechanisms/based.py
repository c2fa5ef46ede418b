"""Based (Arora et al. 2024, Simple linear attention language models balance the
recall-throughput tradeoff, arXiv 2402.18668): linear attention with the second-order Taylor
feature map beside exact softmax attention over a short sliding window, in one mechanism.

**Heads.** The first ``window_heads`` heads (Hw; default n_heads // 2, so at least 1 once
n_heads >= 2; 0 allowed: Taylor only; n_heads: window only) run sliding-window softmax
attention, the other n_heads - Hw heads the Taylor linear attention. Why split heads: the paper
builds Based from alternating layers (mostly Taylor linear-attention layers, some sliding-window
layers, a few gated convolutions), but in synthbench one mechanism fills every layer of the
model, so the two kinds of mixing share each layer instead, by heads. The gated convolutions
are not part of it (they are the model's, and synthbench's model has none).

**Taylor heads.** With d = ``feature_dim`` (default min(16, head_dim); the paper's and
Zoology's 16), the first d coordinates of q and k (the paper projects q and k to d per head
and v to the full head size; here the layer's q, k projections have head_dim columns and the
rest are unused by these heads), and

    phi(x) = [1, x / d^(1/4), (x (x) x) / (sqrt(2) sqrt(d))]      (1 + d + d^2 features;
                                                                   x (x) x the full outer
                                                                   product, flattened row-major)

so that phi(q) . phi(k) = 1 + s + s^2 / 2 with s = q . k / sqrt(d): the second-order Taylor
expansion of exp(s) (Zoology's ``TaylorExp``). Causal, normalised (eps 1e-12, Based's):

    out_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / (phi(q_i) . sum_{j <= i} phi(k_j) + eps)

1 + s + s^2 / 2 = ((1 + s)^2 + 1) / 2 >= 1/2, so every score is positive and the denominator
is at least (i + 1) / 2: eps only matters for rounding.

**Window heads.** Softmax over the ``window`` most recent positions, itself included, at scale
1 / sqrt(head_dim) (all head_dim coordinates):

    out_i = sum_{j = max(0, i - window + 1)}^{i} softmax_j(q_i . k_j / sqrt(head_dim)) v_j

``window`` default 64 (the paper's 64-token sliding window attention).

**Non-causal** (``causal=False``), natural for both halves: Taylor heads sum over every j;
window heads take the symmetric band |i - j| <= window - 1 (as ``sliding-window`` does).

Three forms of the same function (causal):

- ``based_reference``: token by token, the readable reference: for Taylor heads the running
  S = sum phi(k_j)^T v_j and z = sum phi(k_j), for window heads the softmax over the last
  ``window`` keys, looped over j.
- ``forward``: the Taylor heads through the shared chunked linear-attention core
  (synthbench/core/linear_attention.py, chunks of ``chunk_size``), the window heads banded by
  blocks of ``chunk_size`` queries (``sliding_window_attention`` of mechanisms/window.py,
  reused: each block against its own keys and just enough earlier ones). No L x L matrix.
- the recurrent form (``initial_state``, ``step``): (S, z) for the Taylor heads, the last
  ``window`` keys and values for the window heads.

**State per head** (``state_size``): a Taylor head carries (1 + d + d^2) (head_dim + 1) numbers
(S and z), a window head 2 window head_dim (its keys and values); ``state_size`` is the
layer's total divided by n_heads, rounded up: the mean per head, comparable with the other
mechanisms' per-head figures. Constant in L. At head_dim 16, 4 heads, the defaults (d 16,
window 64, 2 + 2 heads): (2 x 273 x 17 + 2 x 2048) / 4 = 3,344.5 -> 3,345.

Numerics: features, scores, softmax and sums in at least float32 (``compute_dtype``), the
output in v's dtype; the softmax subtracts its maximum. Inputs x100 make Taylor scores of
about 1e8, far inside float32.
"""

from __future__ import annotations

import math

import torch

from synthbench.core.linear_attention import compute_dtype, linear_attention
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_int
from synthbench.mechanisms.window import sliding_window_attention

BASED_EPS = 1e-12  # the denominator's (Based's, Zoology's and fla's layer default)


def taylor_feature_map(x: torch.Tensor, feature_dim: int) -> torch.Tensor:
    """phi of the first ``feature_dim`` coordinates of x (..., head_dim) -> (..., 1 + d + d^2):
    [1, x / d^(1/4), flatten(x x^T) / (sqrt(2) sqrt(d))], in x's dtype."""
    x = x[..., :feature_dim]
    second = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2 * feature_dim)
    return torch.cat([torch.ones_like(x[..., :1]), x / feature_dim**0.25, second], dim=-1)


def based_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_dim: int,
    window: int,
    window_heads: int,
    eps: float = BASED_EPS,
) -> torch.Tensor:
    """The causal function of the module docstring, one position at a time: q, k, v
    (B, H, L, head_dim) -> (B, H, L, head_dim) in v's dtype. Heads < ``window_heads``:
    sliding-window softmax; the others: Taylor linear attention."""
    out_dtype = v.dtype
    dtype = compute_dtype(q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    head_dim, length = q.shape[-1], q.shape[-2]
    # window heads: q_i against k_j, j = max(0, i - window + 1) .. i
    wq, wk, wv = q[:, :window_heads], k[:, :window_heads], v[:, :window_heads]
    window_rows = []
    for i in range(length):
        keys = range(max(0, i - window + 1), i + 1)
        scores = torch.stack([(wq[:, :, i] * wk[:, :, j]).sum(-1) for j in keys], dim=-1)
        weights = (scores / math.sqrt(head_dim)).softmax(dim=-1)  # (B, Hw, number of keys)
        window_rows.append(sum(weights[..., n, None] * wv[:, :, j] for n, j in enumerate(keys)))
    # Taylor heads: running S = sum_j phi(k_j)^T v_j and z = sum_j phi(k_j)
    phi_q = taylor_feature_map(q[:, window_heads:], feature_dim)
    phi_k = taylor_feature_map(k[:, window_heads:], feature_dim)
    tv = v[:, window_heads:]
    s = tv.new_zeros(*tv.shape[:2], phi_k.shape[-1], head_dim)
    z = tv.new_zeros(*tv.shape[:2], phi_k.shape[-1])
    taylor_rows = []
    for i in range(length):
        s = s + phi_k[:, :, i, :, None] * tv[:, :, i, None, :]
        z = z + phi_k[:, :, i]
        num = (phi_q[:, :, i, None, :] @ s).squeeze(-2)
        den = (phi_q[:, :, i] * z).sum(-1, keepdim=True) + eps
        taylor_rows.append(num / den)
    out = torch.cat([torch.stack(window_rows, dim=-2), torch.stack(taylor_rows, dim=-2)], dim=1)
    return out.to(out_dtype)


@MECHANISMS.register(
    "based",
    complexity="linear",
    family="linear (Taylor) + sliding window",
    reference="Arora et al. 2024, Simple linear attention language models balance the "
    "recall-throughput tradeoff (arXiv 2402.18668)",
)
class Based(Mechanism):
    """Sliding-window softmax on the first ``window_heads`` heads, second-order Taylor linear
    attention (on the first ``feature_dim`` coordinates of q and k) on the others. The exact
    definition, the forms, the state and why heads are split: the module docstring.

    feature_dim: d of the Taylor map (1 <= d <= head_dim; None: min(16, head_dim)); stored
    as ``taylor_dim``. window: positions a window head attends to, itself included (>= 1,
    default 64). window_heads: how many heads are window heads (0 .. n_heads; None:
    n_heads // 2). eps: added to the Taylor denominator (>= 0, default 1e-12). chunk_size:
    positions per chunk of the linear core and queries per block of the window (>= 1,
    default 64; any value gives the same function)."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        feature_dim: int | None = None,
        window: int = 64,
        window_heads: int | None = None,
        eps: float = BASED_EPS,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads)
        feature_dim = min(16, head_dim) if feature_dim is None else feature_dim
        window_heads = n_heads // 2 if window_heads is None else window_heads
        check_int("feature_dim", feature_dim, 1, head_dim)
        check_int("window", window, 1)
        check_int("window_heads", window_heads, 0, n_heads)
        check_int("chunk_size", chunk_size, 1)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        self.taylor_dim, self.window, self.window_heads = feature_dim, window, window_heads
        self.eps, self.chunk_size = float(eps), chunk_size

    @property
    def n_features(self) -> int:
        """Features per position of a Taylor head: 1 + d + d^2."""
        return 1 + self.taylor_dim + self.taylor_dim**2

    def forward(self, q, k, v, causal: bool = True):
        hw = self.window_heads
        parts = []
        if hw:
            parts.append(
                sliding_window_attention(
                    q[:, :hw], k[:, :hw], v[:, :hw], self.window, causal, self.chunk_size
                )
            )
        if hw < self.n_heads:
            dtype = compute_dtype(q, k, v)
            phi_q = taylor_feature_map(q[:, hw:].to(dtype), self.taylor_dim)
            phi_k = taylor_feature_map(k[:, hw:].to(dtype), self.taylor_dim)
            parts.append(
                linear_attention(
                    phi_q, phi_k, v[:, hw:], causal, eps=self.eps, chunk_size=self.chunk_size
                )
            )
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def state_size(self, seq_len: int) -> int:
        """The mean over the heads, rounded up, of what each carries: (1 + d + d^2)
        (head_dim + 1) per Taylor head, 2 window head_dim per window head; whatever L."""
        taylor = (self.n_heads - self.window_heads) * self.n_features * (self.head_dim + 1)
        windowed = self.window_heads * 2 * self.window * self.head_dim
        return -(-(taylor + windowed) // self.n_heads)

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(S, z, keys, values, seen), zeros in at least float32: S (batch, Taylor heads,
        1 + d + d^2, head_dim), z (batch, Taylor heads, 1 + d + d^2), the last ``window`` keys
        and values of the window heads, oldest first (batch, window heads, window,
        head_dim), and how many tokens came in (the slots not yet filled are masked)."""
        dtype = torch.promote_types(dtype, torch.float32)
        taylor_heads = self.n_heads - self.window_heads
        features = self.n_features
        s = torch.zeros(batch, taylor_heads, features, self.head_dim, device=device, dtype=dtype)
        z = torch.zeros(batch, taylor_heads, features, device=device, dtype=dtype)
        shape = (batch, self.window_heads, self.window, self.head_dim)
        keys = torch.zeros(shape, device=device, dtype=dtype)
        return s, z, keys, keys.clone(), 0

    def step(self, state, q, k, v):
        """One position, q, k, v (batch, heads, head_dim): window heads push k, v into their
        last ``window`` (the oldest falls out) and attend over the filled slots; Taylor heads
        add phi(k)^T v to S and phi(k) to z and read phi(q) S / (phi(q) . z + eps). Not in
        place: autograd sees every state."""
        s, z, keys, values, seen = state
        hw = self.window_heads
        out_dtype = v.dtype
        dtype = compute_dtype(q, k, v, s)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        seen += 1
        parts = []
        if hw:
            keys = torch.cat([keys[:, :, 1:], k[:, :hw].unsqueeze(-2)], dim=-2)
            values = torch.cat([values[:, :, 1:], v[:, :hw].unsqueeze(-2)], dim=-2)
            scores = (keys @ q[:, :hw].unsqueeze(-1)).squeeze(-1) / math.sqrt(self.head_dim)
            empty = torch.arange(self.window, device=q.device) < self.window - min(
                seen, self.window
            )
            scores = scores.masked_fill(empty, float("-inf"))  # (B, Hw, window)
            parts.append((scores.softmax(dim=-1).unsqueeze(-2) @ values).squeeze(-2))
        if hw < self.n_heads:
            phi_q = taylor_feature_map(q[:, hw:], self.taylor_dim)  # (B, Ht, F)
            phi_k = taylor_feature_map(k[:, hw:], self.taylor_dim)
            s = s + phi_k.unsqueeze(-1) * v[:, hw:].unsqueeze(-2)
            z = z + phi_k
            num = (phi_q.unsqueeze(-2) @ s).squeeze(-2)
            den = (phi_q * z).sum(-1, keepdim=True) + self.eps
            parts.append(num / den)
        out = torch.cat(parts, dim=1).to(out_dtype)
        return out, (s, z, keys, values, seen)
