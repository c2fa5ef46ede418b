"""Based (Arora et al. 2024, Simple linear attention language models balance the
recall-throughput tradeoff, arXiv 2402.18668): linear attention with the second-order Taylor
feature map beside exact softmax attention over a short sliding window, in one mechanism.

**Heads.** The first ``window_heads`` heads (Hw; default n_heads // 2, so at least 1 once
n_heads >= 2; 0 allowed: Taylor only; n_heads: window only) run sliding-window softmax
attention, the other n_heads - Hw heads the Taylor linear attention. Why split heads: the paper
builds Based from different layers interleaved across depth (most of them gated convolutions,
the rest Taylor linear-attention and sliding-window layers in equal numbers: "The published
layer" below), but in the core track one mechanism fills every layer of the model, so the two
kinds of mixing share each layer instead, by heads.

- Left to the model, as for every mechanism here (core track): the projections, the gated
  convolutions and the output projection. The block track's published layer, ``BasedLayer``
  (below), has them all.

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

``window`` default 4 (``WINDOW``): the paper's 64-token window in 2,048-token inputs, scaled to
the suite's lengths.

**Non-causal** (``causal=False``), natural for both halves: Taylor heads sum over every j;
window heads take the symmetric band |i - j| <= window - 1 (as ``sliding-window`` does).

Three forms of the same function (causal):

- ``based_reference``: token by token, the readable reference: for Taylor heads the running
  S = sum phi(k_j)^T v_j and z = sum phi(k_j), for window heads the softmax over the last
  ``window`` keys, looped over j.
- ``forward``: the Taylor heads through ``taylor_attention``, in the cheaper of two exact
  forms: up to 1 + d + d^2 positions the scores 1 + s + s^2 / 2 themselves, a block of
  ``chunk_size`` queries at a time; longer, the features through the shared chunked
  linear-attention core (synthbench/core/linear_attention.py, chunks of ``chunk_size``),
  nothing quadratic in L. The window heads banded by blocks of ``chunk_size`` queries
  (``sliding_window_attention`` of mechanisms/window.py, reused: each block against its own
  keys and just enough earlier ones).
- the recurrent form (``initial_state``, ``step``): (S, z) for the Taylor heads, the last
  ``window`` keys and values for the window heads.

**State per head** (``state_size``): a Taylor head carries (1 + d + d^2) (head_dim + 1) numbers
(S and z), a window head 2 window head_dim (its keys and values); ``state_size`` is the
layer's total divided by n_heads, rounded up: the mean per head, comparable with the other
mechanisms' per-head figures. Constant in L. At head_dim 16, 4 heads, the defaults (d 16,
window 4, 2 + 2 heads): (2 x 273 x 17 + 2 x 128) / 4 = 2,384.5 -> 2,385.

Numerics: features, scores, softmax and sums in at least float32 (``compute_dtype``), the
output in v's dtype; the softmax subtracts its maximum. Inputs x100 make Taylor scores of
about 1e8, far inside float32.

**The published layer** (``BasedLayer``, the block track). What the source does: the
reference models stack three kinds of pre-norm residual blocks (RMSNorm, eps 1e-5; each with
its own SwiGLU MLP), repeating BaseConv, Taylor linear attention, sliding window, then more
BaseConv blocks: in the 360M model (HazyResearch/based, train/configs/experiment/reference/
based-360m.yaml, based/models/gpt.py ``create_mixer_cls``) linear attention in layers 1, 6,
11, 16, 21, sliding window in 2, 7, 12, 17, 22, BaseConv in the other 17 of 27 (the 1.3B
model, 36 layers: linear attention in 1, 6, 11, 16, 21, 27, 33, windows one layer later).
The block track has one layer type per block and 2 blocks, so ``BasedLayer`` is that run of
three consecutive reference blocks, MLPs left out (the block has one after the layer), each
step a residual on the stream h, starting from the layer's input x (not normalised: the block
track has no norm before its mixer, synthbench/core/model.py; the reference pre-norms each
part):

1. BaseConv (based/models/mixers/convolution.py ``BaseConv``, ``expand_proj`` 4, kernel 3):
   a Linear with bias to 4 d_model, halves u and g; c = out_proj(silu(conv(u)) * g), the
   depthwise causal conv without bias (``ShortConvolution``), out_proj a Linear with bias.
   h = x + c. (Option ``use_conv``.)
2. Taylor linear attention (based/models/mixers/linear_attention.py ``LinearAttention``,
   ``TaylorExp``; paper sec. 4, feature_dim 16): RMSNorm(h) (only after a step 1); q, k
   projected to feature_dim per head, v to head_dim, no biases; the function above (phi,
   denominator eps 1e-12, ``taylor_attention``); out_proj without bias. h = h + a.
3. Sliding-window attention (based/models/mixers/slide_attention.py ``SlidingAttention``;
   paper sec. 4, window 64): RMSNorm(h); one Linear to q, k, v without bias (the configs'
   qkv_proj_bias false), softmax over the last ``window`` positions at 1/sqrt(head_dim)
   (``sliding_window_attention`` of mechanisms/window.py), out_proj without bias. (Option
   ``use_window``.)

The layer returns c + a + w (the block adds x). Differences, and why: the MLPs and the
stream's own norm between the three are the block's, here one for all three; the reference
rotates the window's q and k (RoPE over the whole head, ``rotary_emb_fraction`` 1), here
positions are the model's, as for every layer; its flash-attn window (w // 2, 0) sees w // 2
earlier positions plus itself (the configs' 128 and 256 give 65 and 129 keys), ``window``
here counts every key seen, itself included, 64 by default as the paper's; sizes follow
d_model and n_heads (heads of d_model // n_heads for both attentions, 16 and 64 wide in the
reference). No special initial values: the reference's GPT-2 normal init is the model's, and
here every Linear keeps PyTorch's default, RMSNorm weights ones. Recurrent form: the conv's
last conv_size - 1 inputs, (S, z), the window's last ``window`` keys and values (the
``SlidingWindowAttention`` step). Under torch.func the features' linear core takes its
"prefix" strategy (the CPU scan is an autograd.Function without a vmap rule), the same
function.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from synthbench.core.layer import Layer, RMSNorm, ShortConvolution
from synthbench.core.linear_attention import (
    chunking,
    compute_dtype,
    functorch_active,
    linear_attention,
    normalise,
)
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_int, check_positive
from synthbench.mechanisms.window import SlidingWindowAttention, sliding_window_attention

BASED_EPS = 1e-12  # the denominator's (Based's, Zoology's and fla's layer default)
# The default window of the window heads, scaled to the suite's lengths at Based's
# window-to-length ratio: a window of 64 in training inputs of 2,048 (Arora et al. 2024,
# Sec. 4 and README), 1/32, at the about 128 tokens of the suite's recall inputs, 4. A window
# of 64 held kv_recall's 72 tokens almost whole, so the window heads were plain softmax
# there and "Based matches attention on recall" held by construction (docs/MECHANISMS.md,
# "Windows at the suite's scale").
WINDOW = 4


def taylor_feature_map(x: torch.Tensor, feature_dim: int) -> torch.Tensor:
    """phi of the first ``feature_dim`` coordinates of x (..., head_dim) -> (..., 1 + d + d^2):
    [1, x / d^(1/4), flatten(x x^T) / (sqrt(2) sqrt(d))], in x's dtype."""
    x = x[..., :feature_dim]
    second = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2 * feature_dim)
    return torch.cat([torch.ones_like(x[..., :1]), x / feature_dim**0.25, second], dim=-1)


def taylor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_dim: int,
    eps: float = BASED_EPS,
    causal: bool = True,
    chunk_size: int = 64,
    strategy: str = "auto",
) -> torch.Tensor:
    """The Taylor linear attention of the module docstring on the first ``feature_dim``
    coordinates of q and k (B, H, L, >= feature_dim), v (B, H, L, D) -> (B, H, L, D) in v's
    dtype, in the cheaper of two exact forms:

    - causal and at most 1 + d + d^2 positions (a head's features): the scores themselves,
      1 + s + s^2 / 2 with s = q . k / sqrt(d), ``chunk_size`` queries at a time against
      the keys up to the last of them, normalised as the core does (``normalise``). About
      L^2 (d + D) / 2 work, where the features' chunked core takes about L C (1 + d + d^2)
      and builds (B, H, L, 1 + d + d^2) features: forward and backward about 6 times
      faster on a CPU at L 64-256, d 16 (benchmarks/taylor_forms.py; flash-linear-attention's
      ``parallel_based``, fla/ops/based/parallel.py, computes these scores at every length);
    - longer, or not causal: phi(q) and phi(k) through the shared linear-attention core
      (``strategy`` is its), whose state grows no further with L."""
    length = q.shape[-2]
    dtype = compute_dtype(q, k, v)
    if causal and length <= 1 + feature_dim + feature_dim**2:
        q, k = (x[..., :feature_dim].to(dtype) for x in (q, k))
        values = v.to(dtype)
        _, block = chunking(length, chunk_size)
        scale = feature_dim**-0.5
        outs = []
        for r0 in range(0, length, block):
            r1 = min(length, r0 + block)
            s = (q[..., r0:r1, :] @ k[..., :r1, :].mT) * scale
            # 1 + s + s^2 / 2, zero for every key after its query
            scores = torch.addcmul(s + 1, s, s, value=0.5).tril(r0)
            outs.append(normalise(scores @ values[..., :r1, :], scores.sum(-1), eps, False))
        return torch.cat(outs, dim=-2).to(v.dtype)
    return linear_attention(
        taylor_feature_map(q.to(dtype), feature_dim),
        taylor_feature_map(k.to(dtype), feature_dim),
        v,
        causal,
        eps=eps,
        chunk_size=chunk_size,
        strategy=strategy,
    )


def taylor_step(s, z, q, k, v, feature_dim: int, eps: float):
    """One position of the causal Taylor linear attention, not in place: S += phi(k)^T v,
    z += phi(k), out = phi(q) S / (phi(q) . z + eps). q, k (..., >= feature_dim), v (...,
    head_dim), S (..., 1 + d + d^2, head_dim), z (..., 1 + d + d^2) -> (out, S, z)."""
    phi_q = taylor_feature_map(q, feature_dim)
    phi_k = taylor_feature_map(k, feature_dim)
    s = s + phi_k.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + phi_k
    num = (phi_q.unsqueeze(-2) @ s).squeeze(-2)
    return num / ((phi_q * z).sum(-1, keepdim=True) + eps), s, z


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
    default 4, ``WINDOW``). window_heads: how many heads are window heads (0 .. n_heads; None:
    n_heads // 2). eps: added to the Taylor denominator (>= 0, default 1e-12). chunk_size:
    positions per chunk of the linear core and queries per block of the window (>= 1,
    default 64; any value gives the same function)."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        feature_dim: int | None = None,
        window: int = WINDOW,
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
            taylor = (q[:, hw:], k[:, hw:], v[:, hw:])
            parts.append(
                taylor_attention(*taylor, self.taylor_dim, self.eps, causal, self.chunk_size)
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
            out, s, z = taylor_step(
                s, z, q[:, hw:], k[:, hw:], v[:, hw:], self.taylor_dim, self.eps
            )
            parts.append(out)
        out = torch.cat(parts, dim=1).to(out_dtype)
        return out, (s, z, keys, values, seen)


class BasedLayer(Layer):
    """The published Based mixer as one layer (module docstring, "The published layer"):
    a BaseConv gated convolution, then the Taylor linear attention, then sliding-window
    softmax attention, each a residual step (the second and third pre-normed), in the order
    of the reference models' consecutive layers. Returns the sum of the three steps' outputs
    (the block adds its input). Causal only (the convolution and the recurrence).

    feature_dim: d of the Taylor map, q and k are projected to d per head (>= 1, default 16);
    window: positions a window query sees, itself included (>= 1, default 4); conv_size:
    the BaseConv kernel (>= 1, default 3); conv_expand: BaseConv's ``expand_proj``, its input
    projection is conv_expand x d_model wide, half convolved, half the gate (>= 1, default 4);
    use_conv, use_window: keep the convolution / the window step (default True); eps: the
    Taylor denominator's (>= 0, default 1e-12); norm_eps: the RMSNorms' (> 0, default 1e-5);
    chunk_size: the chunk of the linear core and the query block of the window (>= 1,
    default 64; any value gives the same function)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        feature_dim: int = 16,
        window: int = WINDOW,
        conv_size: int = 3,
        conv_expand: int = 4,
        use_conv: bool = True,
        use_window: bool = True,
        eps: float = BASED_EPS,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        if d_model % n_heads:
            raise ValueError(f"n_heads {n_heads} must divide d_model {d_model}")
        for name, value in (("feature_dim", feature_dim), ("window", window)):
            check_int(name, value, 1)
        for name, value in (("conv_size", conv_size), ("chunk_size", chunk_size)):
            check_int(name, value, 1)
        check_int("conv_expand", conv_expand, 1)
        if conv_expand * d_model % 2:
            raise ValueError(f"conv_expand x d_model must be even, got {conv_expand} x {d_model}")
        for name, flag in (("use_conv", use_conv), ("use_window", use_window)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        check_positive(norm_eps=norm_eps)
        self.head_dim = d_model // n_heads
        self.feature_dim, self.window, self.chunk_size = feature_dim, window, chunk_size
        self.use_conv, self.use_window, self.eps = use_conv, use_window, float(eps)
        self.n_features = 1 + feature_dim + feature_dim**2
        # 1. BaseConv (based/models/mixers/convolution.py): in_proj, conv of one half,
        #    SiLU, times the other half, out_proj; both Linears with a bias (use_bias=True)
        if use_conv:
            self.conv_inner = conv_expand * d_model // 2
            self.conv_in = nn.Linear(d_model, 2 * self.conv_inner)
            self.conv = ShortConvolution(self.conv_inner, conv_size, activation=True, bias=False)
            self.conv_out = nn.Linear(self.conv_inner, d_model)
        # 2. Taylor linear attention (based/models/mixers/linear_attention.py): no biases
        self.taylor_norm = RMSNorm(d_model, norm_eps) if use_conv else None
        self.q_proj = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        # 3. sliding-window attention (based/models/mixers/slide_attention.py; the reference
        #    configs set qkv_proj_bias and out_proj_bias false)
        if use_window:
            self.window_norm = RMSNorm(d_model, norm_eps)
            self.window_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.window_out = nn.Linear(d_model, d_model, bias=False)
            self.window_core = SlidingWindowAttention(self.head_dim, n_heads, window, chunk_size)

    def _heads(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """(B, L, n_heads * width) -> (B, n_heads, L, width)."""
        return x.unflatten(-1, (self.n_heads, width)).transpose(1, 2)

    def _merge(self, y: torch.Tensor) -> torch.Tensor:
        """(B, n_heads, L, head_dim) -> (B, L, d_model)."""
        return y.transpose(1, 2).flatten(-2)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        out, h = 0, x
        if self.use_conv:
            u, gate = self.conv_in(x).split(self.conv_inner, dim=-1)
            out = self.conv_out(self.conv(u) * gate)
            h = x + out
        u = self.taylor_norm(h) if self.taylor_norm is not None else h
        q = self._heads(self.q_proj(u), self.feature_dim)
        k = self._heads(self.k_proj(u), self.feature_dim)
        v = self._heads(self.v_proj(u), self.head_dim)
        # the CPU scan is an autograd.Function without a vmap rule; under torch.func the
        # core's plain-operation "prefix" strategy computes the same function
        strategy = "prefix" if functorch_active() else "auto"
        y = taylor_attention(
            q, k, v, self.feature_dim, self.eps, chunk_size=self.chunk_size, strategy=strategy
        )
        step = self.o_proj(self._merge(y))
        out, h = out + step, h + step
        if self.use_window:
            qkv = self.window_qkv(self.window_norm(h)).unflatten(-1, (3, self.n_heads, -1))
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, n_heads, L, head_dim)
            y = sliding_window_attention(q, k, v, self.window, True, self.chunk_size)
            out = out + self.window_out(self._merge(y))
        return out

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(conv window or None, S, z, window state or None): the BaseConv's last conv_size - 1
        inputs; S (batch, n_heads, 1 + d + d^2, head_dim) and z (batch, n_heads, 1 + d + d^2),
        zeros in at least float32; the window core's (keys, values, seen)."""
        conv = self.conv.initial_state(batch, device, dtype) if self.use_conv else None
        wide = torch.promote_types(dtype, torch.float32)
        shape = (batch, self.n_heads, self.n_features)
        s = torch.zeros(*shape, self.head_dim, device=device, dtype=wide)
        z = torch.zeros(shape, device=device, dtype=wide)
        windowed = self.window_core.initial_state(batch, device, dtype) if self.use_window else None
        return conv, s, z, windowed

    def step(self, state, x: torch.Tensor):
        """One position, x (batch, d_model) -> (y (batch, d_model), the new state): the three
        steps of ``forward`` in their recurrent forms. Not in place."""
        conv, s, z, windowed = state
        batch = x.shape[0]
        out, h = 0, x
        if self.use_conv:
            u, gate = self.conv_in(x).split(self.conv_inner, dim=-1)
            c, conv = self.conv.step(conv, u)
            out = self.conv_out(c * gate)
            h = x + out
        u = self.taylor_norm(h) if self.taylor_norm is not None else h
        q = self.q_proj(u).view(batch, self.n_heads, self.feature_dim)
        k = self.k_proj(u).view(batch, self.n_heads, self.feature_dim)
        v = self.v_proj(u).view(batch, self.n_heads, self.head_dim)
        dtype = compute_dtype(q, k, v, s)
        y, s, z = taylor_step(
            s, z, q.to(dtype), k.to(dtype), v.to(dtype), self.feature_dim, self.eps
        )
        step = self.o_proj(y.to(x.dtype).reshape(batch, self.d_model))
        out, h = out + step, h + step
        if self.use_window:
            qkv = self.window_qkv(self.window_norm(h)).view(batch, 3, self.n_heads, -1)
            y, windowed = self.window_core.step(windowed, qkv[:, 0], qkv[:, 1], qkv[:, 2])
            out = out + self.window_out(y.reshape(batch, self.d_model))
        return out, (conv, s, z, windowed)

    def state_size(self, seq_len: int) -> int:
        """The whole layer's, whatever L: (conv_size - 1) x the convolved channels, n_heads
        (1 + d + d^2)(head_dim + 1) for S and z, 2 window d_model keys and values."""
        conv = (self.conv.kernel - 1) * self.conv_inner if self.use_conv else 0
        taylor = self.n_heads * self.n_features * (self.head_dim + 1)
        return conv + taylor + (2 * self.window * self.d_model if self.use_window else 0)


Based.layer = BasedLayer
