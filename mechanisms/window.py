"""Sliding-window softmax attention (Beltagy et al. 2020, Longformer; a baseline in Arora et
al. 2024, Based).

Causal (the default): position i attends to the ``window`` most recent positions, itself
included, j = i - window + 1 .. i (fewer at the start of the sequence), with softmax
attention at scale 1/sqrt(d), d = head_dim:

    out_i = sum_{j in W(i)} softmax_j(q_i . k_j / sqrt(d)) v_j,
    W(i) = {j : 0 <= i - j <= window - 1, 0 <= j < L}.

window >= L is causal softmax attention; window = 1 returns v. The default window, 16, is
Longformer's window-to-length ratio at the suite's scale (``WINDOW`` below). The core has no
positions, projections or gates: in the core track they belong to the model; in the block
track the published layer ``SlidingWindowLayer`` (below) brings its own.

Non-causal (``causal=False``): the symmetric band W(i) = {j : |i - j| <= window - 1, 0 <= j < L},
window - 1 positions on each side of i and i itself, so that the causal form is exactly the
non-causal one with every later key masked (as for every other mechanism here). Longformer's own
non-causal window of size w takes w/2 positions on each side; this one takes window - 1.

Three forms of the same function:

- ``sliding_window_reference``: the plain (L x L) masked softmax, the readable reference.
- ``sliding_window_attention`` (``forward``): blocks of ``chunk_size`` queries, each against
  the keys of its own block and of just enough earlier blocks to reach window - 1 positions
  back (and as many later blocks, non-causal), with a band mask: at window 64 and chunk 64
  each block of 64 queries sees 128 keys. Cost O(L (window + chunk) d); no L x L
  matrix.
- the recurrent form (``initial_state``, ``step``): the last ``window`` keys and values, a
  state of 2 window d numbers per head whatever the length (hence complexity "linear").

Scores, softmax and sums run in at least float32 (``compute_dtype``); the output comes back
in v's dtype. The softmax subtracts its row maximum, so inputs scaled x100 stay finite.

The published layer (``SlidingWindowLayer``, the block track) is Mistral 7B's attention layer
(Jiang et al. 2023, arXiv 2310.06825, section 2; mistral-inference
src/mistral_inference/transformer_layers.py ``Attention``, rope.py), in order:

1. q, k, v = x W_q, x W_k, x W_v: d_model -> n_heads x head_dim each, no bias (``wq``, ``wk``,
   ``wv``, ``bias=False``); one key/value head per query head (Mistral 7B groups 32 query
   heads on 8 key/value heads; at 4 heads we keep them all).
2. Rotary positions on q and k, not v (Su et al. 2021, RoFormer, arXiv 2104.09864, sec.
   3.2): the interleaved pairs (x_2i, x_2i+1) of each head rotated by p theta^(-2i / head_dim) at
   position p, theta = ``rope_theta`` 10000 (mistral-inference rope.py
   ``precompute_freqs_cis``/``apply_rotary_emb``; synthbench/core/positional.py's
   ``rope_frequencies`` and ``rotate_pairs`` compute it). ``rotary=False`` leaves q and k as
   they are (Zoology's zoology/mixers/slide_attn.py has none; Based's
   based/models/mixers/slide_attention.py has none by default, ``rotary_emb_dim=0``, but
   Based's trained models set ``rotary_emb_fraction: 1``, full-head rotary).
3. This module's windowed softmax, scale 1/sqrt(head_dim), over the ``window`` most recent
   positions, itself included (Longformer's sliding window, Beltagy et al. 2020, arXiv
   2004.05150, section 3.1; Mistral's window W, section 2).
4. Output projection W_o, n_heads x head_dim -> d_model, no bias (``wo``).

Its recurrent form is Mistral's rolling buffer cache (section 2): the last ``window`` keys,
already rotated, and values per head, and the position of the next token; 2 window head_dim
numbers per head. Plain Linear layers keep PyTorch's default initialisation (Mistral's code
sets none of its own).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import Layer
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_int, check_positive
from synthbench.core.positional import rope_frequencies, rotate_pairs

# The default window, scaled to the suite's lengths at Longformer's window-to-length ratio:
# a window of 512 in inputs of 4,096 (Beltagy et al. 2020, Sec. 4), 1/8, at the about 128
# tokens of the suite's recall inputs, 16. A window of 64 held the suite's recall inputs
# (72 tokens for kv_recall) almost whole, so the mechanism ran as plain causal softmax there;
# every recall task now keeps its answers beyond the reach of two layers of 16
# (docs/MECHANISMS.md, "Windows at the suite's scale"; docs/TASKS.md).
WINDOW = 16


def _in_band(offset: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """Whether a key at ``offset`` = i - j positions before its query is attended to."""
    if causal:
        return (offset >= 0) & (offset < window)
    return offset.abs() < window


def sliding_window_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool = True
) -> torch.Tensor:
    """The module docstring's formula through the full (L x L) score matrix: q k^T / sqrt(d),
    every key outside the band set to -inf, softmax over the keys, times v."""
    dtype = compute_dtype(q, k, v)
    length = q.shape[-2]
    positions = torch.arange(length, device=q.device)
    offset = positions[:, None] - positions[None, :]  # i - j
    scores = q.to(dtype) @ k.to(dtype).mT / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~_in_band(offset, window, causal), float("-inf"))
    return (scores.softmax(dim=-1) @ v.to(dtype)).to(v.dtype)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    causal: bool = True,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The same function in blocks (module docstring): (B, H, L, d) -> (B, H, L, d).

    Queries come in N = ceil(L / chunk_size) blocks of C = ceil(L / N) positions (the last
    one padded). Block n sees the keys of blocks n - back .. n + ahead, back =
    ceil((window - 1) / C) (the earliest key a query of the block can see is window - 1
    positions before the block's first query), ahead = 0 causal, back otherwise; both at
    most N - 1. Keys and values are zero-padded so that every block has that span, and the
    band mask, built once for all blocks, removes every key outside the band, before the
    sequence or after its end."""
    batch, heads, length, dim = q.shape
    out_dtype = v.dtype
    dtype = compute_dtype(q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    N, C = chunking(length, chunk_size)
    back = min(-(-(window - 1) // C), N - 1)
    ahead = 0 if causal else back
    span = (back + 1 + ahead) * C
    pad = N * C - length
    blocks = F.pad(q, (0, 0, 0, pad)).reshape(batch, heads, N, C, dim)
    # key/value position p sits at padded index p + back * C; block n's keys are the padded
    # indices n C .. n C + span - 1, i.e. positions (n - back) C + b for b < span
    k, v = (F.pad(t, (0, 0, back * C, pad + ahead * C)) for t in (k, v))
    keys = k.unfold(-2, span, C)  # (B, H, N, d, span)
    values = v.unfold(-2, span, C).mT  # (B, H, N, span, d)

    n = torch.arange(N, device=q.device)[:, None, None]
    i = n * C + torch.arange(C, device=q.device)[None, :, None]  # query positions
    j = (n - back) * C + torch.arange(span, device=q.device)[None, None, :]  # key positions
    # a padded query (i >= L) keeps its own (zero) key, so that its softmax row is never
    # empty: an all -inf row would give NaN, whose gradient would reach the real keys
    allowed = _in_band(i - j, window, causal) & (j >= 0) & ((j < length) | (j == i))

    scores = blocks @ keys / math.sqrt(dim)  # (B, H, N, C, span)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = scores.softmax(dim=-1) @ values  # (B, H, N, C, d)
    return out.reshape(batch, heads, N * C, dim)[:, :, :length].to(out_dtype)


@MECHANISMS.register(
    "sliding-window",
    aliases=("swa", "window"),
    complexity="linear",
    family="softmax",
    reference="Beltagy et al. 2020 (Longformer); as a baseline in Arora et al. 2024 (Based)",
)
class SlidingWindowAttention(Mechanism):
    """Softmax attention over the ``window`` most recent positions, itself included, at scale
    1/sqrt(head_dim) (causal); the symmetric band |i - j| <= window - 1 non-causal. The exact
    definition, the forms and the numerics: the module docstring.

    window: positions attended to (>= 1, default ``WINDOW``, 16); chunk_size: queries per
    block of the parallel form (>= 1, default 64; any value gives the same function)."""

    def __init__(self, head_dim: int, n_heads: int, window: int = WINDOW, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("window", window, 1)
        check_int("chunk_size", chunk_size, 1)
        self.window, self.chunk_size = window, chunk_size

    def forward(self, q, k, v, causal: bool = True):
        return sliding_window_attention(q, k, v, self.window, causal, self.chunk_size)

    def state_size(self, seq_len: int) -> int:
        """The last ``window`` keys and values, whatever the length."""
        return 2 * self.window * self.head_dim

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(keys, values, seen): the last ``window`` keys and values, oldest first (batch,
        heads, window, head_dim, zeros in at least float32), and how many tokens came in (the
        slots of the ones not yet seen are masked)."""
        dtype = torch.promote_types(dtype, torch.float32)
        shape = (batch, self.n_heads, self.window, self.head_dim)
        zeros = torch.zeros(shape, device=device, dtype=dtype)
        return zeros, zeros, 0

    def step(self, state, q, k, v):
        """One position, q, k, v (batch, heads, head_dim): push k and v in (the oldest
        falls out), then attend over the filled slots. Not in place: autograd sees every
        state."""
        keys, values, seen = state
        dtype = compute_dtype(q, k, v, keys)
        keys = torch.cat([keys[:, :, 1:], k.to(dtype).unsqueeze(-2)], dim=-2)
        values = torch.cat([values[:, :, 1:], v.to(dtype).unsqueeze(-2)], dim=-2)
        seen += 1
        scores = (keys @ q.to(dtype).unsqueeze(-1)).squeeze(-1) / math.sqrt(self.head_dim)
        empty = torch.arange(self.window, device=q.device) < self.window - min(seen, self.window)
        scores = scores.masked_fill(empty, float("-inf"))  # (B, H, window)
        out = (scores.softmax(dim=-1).unsqueeze(-2) @ values).squeeze(-2)
        return out.to(v.dtype), (keys, values, seen)


class SlidingWindowLayer(Layer):
    """Mistral 7B's sliding-window attention layer (module docstring, "The published layer"):
    q, k, v projections, rotary positions on q and k, the windowed softmax of
    ``sliding_window_attention``, output projection.

    window: positions each query attends to, itself included (>= 1, default 16, the core's);
    chunk_size: queries per block of the parallel form (>= 1, default 64; any value gives the
    same function); rotary: rotate q and k by their positions (default True); rope_theta: the
    rotary base theta (> 0, default 10000). ``causal=False`` gives the core's symmetric band
    (the recurrent form is causal)."""

    causal_only = False  # the core has a two-sided band; rotary positions work both ways

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        window: int = WINDOW,
        chunk_size: int = 64,
        rotary: bool = True,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__(d_model, n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} must be a multiple of n_heads {n_heads}")
        if not isinstance(rotary, bool):
            raise ValueError(f"rotary must be True or False, got {rotary!r}")
        check_positive(rope_theta=rope_theta)
        self.head_dim = head_dim = d_model // n_heads
        if rotary and head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        # the core: its fast blocked forward and its window of keys and values (checks
        # window and chunk_size)
        self.core = SlidingWindowAttention(head_dim, n_heads, window, chunk_size)
        self.window, self.chunk_size = window, chunk_size
        self.rotary, self.rope_theta = rotary, float(rope_theta)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        # theta^(-2i / head_dim), derived from rope_theta (not saved), float64 as RoPE's
        self.register_buffer(
            "frequencies", rope_frequencies(head_dim, self.rope_theta), persistent=False
        )

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., d_model) -> q, k, v (..., n_heads, head_dim)."""
        split = (self.n_heads, self.head_dim)
        return tuple(
            proj(x).unflatten(-1, split) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """x (batch, length, d_model) -> the same shape."""
        self.check_causal(causal)
        q, k, v = (t.transpose(1, 2) for t in self._heads(x))  # (B, H, L, d)
        if self.rotary:
            positions = torch.arange(x.shape[1], device=x.device).to(self.frequencies)
            angles = positions[:, None] * self.frequencies  # (L, d / 2)
            q, k = rotate_pairs(q, angles), rotate_pairs(k, angles)
        out = sliding_window_attention(q, k, v, self.window, causal, self.chunk_size)
        return self.o_proj(out.transpose(1, 2).flatten(-2))

    def state_size(self, seq_len: int) -> int:
        """The last ``window`` (rotated) keys and values of every head, whatever the length."""
        return self.n_heads * 2 * self.window * self.head_dim

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """The core's (keys, values, seen): an empty window, and seen = 0, the position of the
        next token (its rotation)."""
        return self.core.initial_state(batch, device, dtype)

    def step(self, state, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """One position, x (batch, d_model) -> (y (batch, d_model), new state): project,
        rotate q and k by the position ``seen``, push k and v into the window, attend."""
        q, k, v = self._heads(x)  # (B, H, d)
        if self.rotary:
            angles = state[2] * self.frequencies  # (d / 2,)
            q, k = rotate_pairs(q, angles), rotate_pairs(k, angles)
        out, state = self.core.step(state, q, k, v)
        return self.o_proj(out.flatten(-2)), state


SlidingWindowAttention.layer = SlidingWindowLayer
