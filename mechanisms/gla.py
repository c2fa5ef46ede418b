"""Gated linear attention (Yang et al. 2024, Gated Linear Attention Transformers with
Hardware-Efficient Training, arXiv 2312.06635, sec. 4), the bare GLA recurrence of each head.

Per head, with d = head_dim, q_t, k_t, v_t in R^d (rows of the (batch, heads, length, d)
inputs) and the extra input ``gate`` (batch, heads, length, d), raw:

    log alpha_t = logsigmoid(gate_t) / tau            (tau = ``gate_temperature``, default 16)
    alpha_t     = sigmoid(gate_t)^(1/tau)             (the forget gate, in (0, 1)^d)
    S_t         = diag(alpha_t) S_{t-1} + k_t^T v_t   (S is d x d, S_{-1} = 0)
    o_t         = (q_t / sqrt(d)) S_t                 (a row of length d)

S_t is indexed (key coordinate, value coordinate): the gate decays the key dimension, row m
of S by alpha_t[m]. Unrolled, with a product over an empty range equal to 1:

    o_t = sum_{s <= t} sum_m (q_t[m] / sqrt(d)) k_s[m] (prod_{s < r <= t} alpha_r[m]) v_s

The output reads the state after the write (o_t sees v_t).

Choices, and where they come from:

- alpha_t = sigmoid(x_t W_a1 W_a2 + b)^(1/tau) with tau = 16 is the paper's gate (sec. 4.4:
  the low-rank projection is the layer's here, synthbench/core/model.py, which projects ``gate``
  from the layer input with one Linear of width n_heads * d; the 1/16 power keeps alpha close
  to 1, so that the memory fades slowly). flash-linear-attention's GLA layer does the same:
  ``gk = logsigmoid(gk_proj(x)) / gate_logit_normalizer``, 16.
- q is scaled by d^(-1/2), as flash-linear-attention's ``chunk_gla`` does by default
  (``scale = K ** -0.5``); the paper's formula reads q S unscaled, and its layer's
  normalisation makes the scale immaterial there.
- Left to the model in the ``core`` track, as for every mechanism there: the paper's layer
  follows the recurrence with a per-head normalisation, a swish output gate and the output
  projection; there the model's output projection follows the mechanism directly. No
  positions either (``--pos``), no short convolution, no feature map on q or k. The whole
  published layer is ``GLALayer`` below (the ``block`` track; section "The published layer").
- Causal only: the gated recurrence has no two-sided form; ``causal=False`` raises ValueError.

Three forms of the same function:

- ``gla_reference``: the recurrence above, one token at a time (as flash-linear-attention's
  ``fla/ops/gla/naive.py``), the readable reference.
- ``chunked_gla`` (``forward``): the paper's chunkwise form (sec. 4.2-4.3) in
  N = ceil(L / chunk_size) chunks of C = ceil(L / N) positions. With b_i = sum_{r <= i}
  log alpha_r the cumulative log decay from the chunk's start to position i of the chunk
  (inclusive) and S the state before the chunk:

      o_i     = sum_{j <= i} sum_m q_i[m] k_j[m] exp(b_i[m] - b_j[m]) v_j     (intra-chunk)
              + (q_i * exp(b_i)) S                                          (inter-chunk)
      S_next  = diag(exp(b_last)) S + sum_j (k_j * exp(b_last - b_j))^T v_j

  (q already scaled, * elementwise). The intra-chunk part uses the paper's secondary
  chunking into s = ceil(C / 16) sub-chunks of c = ceil(C / s) positions: for a key j in an
  earlier sub-chunk than the query i, exp(b_i - b_j) = exp(b_i - b_r) exp(b_r - b_j) with r
  the last position before the query's sub-chunk, so that block is a matrix product of q *
  exp(b_i - b_r) and k * exp(b_r - b_j), both factors in (0, 1] (one product per query
  sub-chunk, over the keys before it); a diagonal block (j and i in one sub-chunk) is
  computed element by element in log space, one key offset j at a time over the rows i >= j
  only (no (c, c, d) tensor). Every chunk at once; only the d x d chunk-level state
  recurrence loops over the chunks, and the sub-chunk loops run c and s - 1 times
  whatever L. Cost O(L (C d + d^2)) per head; no L x L matrix. Padding (at the sequence's
  end, and at a chunk's end to a whole number of sub-chunks) is q = k = v = 0 with
  log alpha = 0: it decays nothing and writes nothing, so it changes no output.
- the recurrent form (``initial_state``, ``step``): S, d x d numbers per head whatever L.

The published layer (``GLALayer``, ``GatedLinearAttention.layer``): the token mixer of the
paper's sec. 4.4 as flash-linear-attention writes it (fla/layers/gla.py, class
``GatedLinearAttention``), from x (batch, length, d_model), in this order:

- q = x W_q, k = x W_k (width key_dim = int(d_model * expand_k), expand_k 0.5) and
  v = x W_v (value_dim = int(d_model * expand_v), expand_v 1), Linear without bias; heads of
  d_k = key_dim / n_heads and d_v = value_dim / n_heads (fla's q_proj, k_proj, v_proj);
- optional (``use_short_conv``, fla's default False): a depthwise causal convolution of
  ``conv_size`` 4 then SiLU on each of q, k, v (fla's q_conv1d, k_conv1d, v_conv1d, no bias);
- the forget gate from a low-rank projection, x W_1 (d_model -> gate_low_rank_dim 16, no
  bias) W_2 + b (-> key_dim, with bias), log alpha = logsigmoid(.) / gate_logit_normalizer
  (16): the paper's eq. of sec. 4.4, alpha = sigmoid(x W_1 W_2 + b)^(1/16) (fla's gk_proj);
- the mixing: ``chunked_gla`` above (the recurrent form: the core's ``step``), q scaled by
  d_k^(-1/2) as fla's ``chunk_gla`` does;
- per head, with ``use_output_gate`` (default True): rmsnorm(o) * w * swish(x W_g) (fla's
  g_proj and ``FusedRMSNormGated``, here ``GatedRMSNorm(norm_before_gate=True)``); without
  it, the plain per-head ``RMSNorm`` (fla's g_norm); eps ``norm_eps`` 1e-5 (fla's layer
  default; its GLAConfig passes 1e-6), w ones at the start;
- the output projection W_o (value_dim -> d_model, no bias; fla's o_proj).

Not taken from fla: its feature_map, clamp_min, num_kv_heads and conv_bias options (all off
by default there) and its model-level init (weights N(0, 0.02), biases 0): every Linear here
keeps PyTorch's default init, the same for every layer of the block track. Where fla departs
from the authors' own code (berlino/gated_linear_attention ``gla.py``), this layer is fla's:
there g_proj has a bias (the paper's b_r) and each head is normalised by a LayerNorm without
affine (it subtracts the mean, so the same weights give other outputs), with a xavier init.

Numerics: log alpha = logsigmoid(gate) / tau is computed from the raw gate (finite and <= 0
for any finite gate; sigmoid(gate) itself underflows to 0 in float32 for a gate of -200, and
its logarithm is -inf). Every decay the chunked form exponentiates is a difference b_i - b_j
with j <= i inside one chunk (or from the chunk's start, b_i itself), <= 0: the pairs j > i
are sliced or masked away BEFORE the exponential, never exponentiated; never exp(-b_j), which
overflows once the decays add up.
Sums run in at least float32 (``compute_dtype``); the output comes back in v's dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import GatedRMSNorm, Layer, RMSNorm, ShortConvolution
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, MatrixStateMechanism
from synthbench.core.params import check_int, check_positive

GATE_TEMPERATURE = 16.0  # the paper's tau: alpha = sigmoid(gate)^(1/16)
SUBCHUNK = 16  # positions per sub-chunk of the secondary chunking (paper sec. 4.3)


def log_forget_gate(gate: torch.Tensor, gate_temperature: float = GATE_TEMPERATURE):
    """log alpha = logsigmoid(gate) / tau, <= 0, from the raw gate."""
    return F.logsigmoid(gate) / gate_temperature


def _check_inputs(causal: bool, gate: torch.Tensor | None) -> None:
    if not causal:
        raise ValueError("gla is causal only: gated linear attention is a recurrence")
    if gate is None:
        raise ValueError("gla needs its extra input gate (batch, heads, length, head_dim)")


def _prepared(q, k, v, gate, gate_temperature):
    """q scaled by d^(-1/2), k, v and log alpha, all in the compute dtype."""
    dtype = compute_dtype(q, k, v, gate)
    q, k, v, gate = (t.to(dtype) for t in (q, k, v, gate))
    return q / math.sqrt(q.shape[-1]), k, v, log_forget_gate(gate, gate_temperature)


def gla_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor,
    gate_temperature: float = GATE_TEMPERATURE,
) -> torch.Tensor:
    """The recurrence of the module docstring, token after token: q, k, v (B, H, L, d), gate
    (B, H, L, d) raw -> (B, H, L, d) in v's dtype."""
    out_dtype = v.dtype
    q, k, v, log_alpha = _prepared(q, k, v, gate, gate_temperature)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, v.shape[-1])  # S: (key coordinate, value coordinate)
    outs = []
    for t in range(length):
        alpha = log_alpha[:, :, t].exp().unsqueeze(-1)  # (B, H, d, 1): decays the rows of S
        state = alpha * state + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append((q[:, :, t].unsqueeze(-2) @ state).squeeze(-2))  # (q_t / sqrt(d)) S_t
    return torch.stack(outs, dim=-2).to(out_dtype)


def chunked_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor,
    gate_temperature: float = GATE_TEMPERATURE,
    chunk_size: int = 64,
    subchunk_size: int = SUBCHUNK,
) -> torch.Tensor:
    """The chunkwise form of the module docstring: the same function as ``gla_reference``,
    q, k, v (B, H, L, d), gate (B, H, L, d) raw -> (B, H, L, d) in v's dtype."""
    out_dtype = v.dtype
    q, k, v, log_alpha = _prepared(q, k, v, gate, gate_temperature)
    batch, heads, length, dim = q.shape
    dim_v = v.shape[-1]
    N, C = chunking(length, chunk_size)
    s, c = chunking(C, subchunk_size)  # s sub-chunks per chunk
    P = s * c  # a chunk's length padded to whole sub-chunks

    def chunks(t: torch.Tensor) -> torch.Tensor:  # zero-padded, (B, H, N, P, width)
        t = F.pad(t, (0, 0, 0, N * C - length)).reshape(batch, heads, N, C, t.shape[-1])
        return F.pad(t, (0, 0, 0, P - C))

    q, k, v, log_alpha = chunks(q), chunks(k), chunks(v), chunks(log_alpha)
    b = log_alpha.cumsum(-2)  # (B, H, N, P, d): log decay from the chunk's start, <= 0

    def sub(t: torch.Tensor) -> torch.Tensor:  # (B, H, N, s, c, width)
        return t.reshape(batch, heads, N, s, c, t.shape[-1])

    q_s, k_s, v_s, b_s = sub(q), sub(k), sub(v), sub(b)

    # diagonal blocks, query i and key j in one sub-chunk: one key offset j at a time, over
    # the rows i >= j only (the rows i < j are 0, never computed, never exponentiated):
    # A_ij = sum_m q_i[m] k_j[m] exp(b_i[m] - b_j[m])
    columns = []
    for j in range(c):
        decay = (b_s[..., j:, :] - b_s[..., j : j + 1, :]).exp()  # (..., c - j, d), <= 1
        column = (q_s[..., j:, :] * decay * k_s[..., j : j + 1, :]).sum(-1)
        columns.append(F.pad(column, (j, 0)))
    out = torch.stack(columns, dim=-1) @ v_s  # (B, H, N, s, c, d_v)

    # keys in earlier sub-chunks than the query's, through the reference point r = i c - 1,
    # the last position before query sub-chunk i: exp(b_q - b_r) and exp(b_r - b_k), <= 1
    later = []
    for i in range(1, s):
        ref = b_s[:, :, :, i - 1, -1:]  # (B, H, N, 1, d)
        q_ref = q_s[:, :, :, i] * (b_s[:, :, :, i] - ref).exp()  # (B, H, N, c, d)
        k_ref = k[:, :, :, : i * c] * (ref - b[:, :, :, : i * c]).exp()  # (B, H, N, i c, d)
        later.append((q_ref @ k_ref.mT) @ v[:, :, :, : i * c])  # (B, H, N, c, d_v)
    if later:
        out = out + F.pad(torch.stack(later, dim=3), (0, 0, 0, 0, 1, 0))  # none for i = 0
    out = out.reshape(batch, heads, N, P, dim_v)

    if N > 1:  # across chunks: the d x d state before each chunk
        last = b[..., -1:, :]  # (B, H, N, 1, d): the chunk's whole log decay
        writes = (k * (last - b).exp()).mT @ v  # (B, H, N, d, d_v): exp(b_last - b_j) <= 1
        decay = last.mT.exp()  # (B, H, N, d, 1)
        states = [q.new_zeros(batch, heads, dim, dim_v)]
        for n in range(N - 1):
            states.append(decay[:, :, n] * states[-1] + writes[:, :, n])
        before = torch.stack(states, dim=2)  # (B, H, N, d, d_v)
        out = out + (q * b.exp()) @ before  # exp(b_i) <= 1
    return out[:, :, :, :C].reshape(batch, heads, N * C, dim_v)[:, :, :length].to(out_dtype)


@MECHANISMS.register(
    "gla",
    aliases=("gated-linear-attention",),
    complexity="linear",
    family="gated-linear",
    reference="Yang et al. 2024, Gated Linear Attention Transformers with Hardware-Efficient "
    "Training (arXiv 2312.06635)",
)
class GatedLinearAttention(MatrixStateMechanism):
    """S_t = diag(alpha_t) S_{t-1} + k_t^T v_t, o_t = (q_t / sqrt(head_dim)) S_t, with the
    forget gate alpha_t = sigmoid(gate_t)^(1 / gate_temperature) on the key dimension,
    ``gate`` an extra input of width head_dim (raw). No parameters of its own; no output
    gate or normalisation. Causal only (causal=False raises ValueError). The exact
    definition, the chunked form and the choices: the module docstring.

    chunk_size: positions per chunk of the chunkwise form (>= 1, default 64; any value gives
    the same function). gate_temperature: tau of log alpha = logsigmoid(gate) / tau (> 0,
    default 16, the paper's)."""

    signed = True  # its implicit attention weights q.(k * decay) take either sign

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        chunk_size: int = 64,
        gate_temperature: float = GATE_TEMPERATURE,
    ):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        if (
            isinstance(gate_temperature, bool)
            or not isinstance(gate_temperature, int | float)
            or not 0 < gate_temperature < math.inf
        ):
            raise ValueError(
                f"gate_temperature must be a finite number > 0, got {gate_temperature!r}"
            )
        self.chunk_size, self.gate_temperature = chunk_size, float(gate_temperature)
        self.extra_inputs = {"gate": head_dim}

    def forward(self, q, k, v, causal: bool = True, gate: torch.Tensor | None = None):
        _check_inputs(causal, gate)
        return chunked_gla(q, k, v, gate, self.gate_temperature, self.chunk_size)

    def step(self, state, q, k, v, gate: torch.Tensor | None = None):
        """One position: q, k, v, gate (batch, heads, head_dim), gate raw.
        S <- diag(alpha) S + k^T v, then o = (q / sqrt(d)) S. Not in place: autograd sees
        every state."""
        _check_inputs(True, gate)
        out_dtype = v.dtype
        q, k, v, log_alpha = _prepared(q, k, v, gate, self.gate_temperature)
        dtype = torch.promote_types(q.dtype, state.dtype)
        q, k, v, log_alpha = (t.to(dtype) for t in (q, k, v, log_alpha))
        state = log_alpha.exp().unsqueeze(-1) * state + k.unsqueeze(-1) * v.unsqueeze(-2)
        out = (q.unsqueeze(-2) @ state).squeeze(-2)
        return out.to(out_dtype), state


class GLALayer(Layer):
    """The published GLA layer (module docstring, "The published layer"): x (batch, length,
    d_model) -> the same shape, causal only.

    Options (fla/layers/gla.py defaults): expand_k 0.5 and expand_v 1 (key and value widths
    as fractions of d_model, each a whole multiple of n_heads), gate_low_rank_dim 16 (the
    forget gate's bottleneck), gate_logit_normalizer 16 (log alpha = logsigmoid(.) / it),
    use_short_conv False and conv_size 4 (the short convolution on q, k and v),
    use_output_gate True (the swish gate, else the plain per-head RMSNorm), norm_eps 1e-5,
    chunk_size 64 (of ``chunked_gla``; any value gives the same function)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = GATE_TEMPERATURE,
        use_short_conv: bool = False,
        conv_size: int = 4,
        use_output_gate: bool = True,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        check_positive(expand_k=expand_k, expand_v=expand_v, norm_eps=norm_eps)
        check_positive(gate_logit_normalizer=gate_logit_normalizer)
        if not gate_logit_normalizer < math.inf:
            raise ValueError(f"gate_logit_normalizer must be finite, got {gate_logit_normalizer}")
        check_int("gate_low_rank_dim", gate_low_rank_dim, 1)
        check_int("conv_size", conv_size, 1)
        for name, flag in (
            ("use_short_conv", use_short_conv),
            ("use_output_gate", use_output_gate),
        ):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be true or false, got {flag!r}")
        key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
        for name, width in (("expand_k", key_dim), ("expand_v", value_dim)):
            if width < n_heads or width % n_heads:
                raise ValueError(
                    f"{name}: int(d_model * {name}) = {width} must be a positive multiple of "
                    f"n_heads {n_heads}"
                )
        # the mixing; it checks chunk_size
        self.core = GatedLinearAttention(
            key_dim // n_heads, n_heads, chunk_size, gate_logit_normalizer
        )
        self.key_dim, self.value_dim = key_dim, value_dim
        self.head_k, self.head_v = key_dim // n_heads, value_dim // n_heads
        self.use_short_conv, self.use_output_gate = use_short_conv, use_output_gate
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        if use_short_conv:
            self.q_conv = ShortConvolution(key_dim, conv_size)
            self.k_conv = ShortConvolution(key_dim, conv_size)
            self.v_conv = ShortConvolution(value_dim, conv_size)
        self.gk_proj = nn.Sequential(
            nn.Linear(d_model, gate_low_rank_dim, bias=False),
            nn.Linear(gate_low_rank_dim, key_dim, bias=True),
        )
        if use_output_gate:
            self.g_proj = nn.Linear(d_model, value_dim, bias=False)
            self.norm = GatedRMSNorm(self.head_v, norm_eps, norm_before_gate=True)
        else:
            self.norm = RMSNorm(self.head_v, norm_eps)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def _heads(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """(..., n_heads * width) -> (..., n_heads, width)."""
        return t.unflatten(-1, (self.n_heads, width))

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The per-head norm (and output gate) and the output projection: o (..., n_heads,
        d_v) and the layer input x (..., d_model) -> (..., d_model)."""
        if self.use_output_gate:
            o = self.norm(o, self._heads(self.g_proj(x), self.head_v))
        else:
            o = self.norm(o)
        return self.o_proj(o.flatten(-2))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            q, k, v = self.q_conv(q), self.k_conv(k), self.v_conv(v)
        gate = self.gk_proj(x)

        def heads_first(t: torch.Tensor, width: int) -> torch.Tensor:  # (B, H, L, width)
            return self._heads(t, width).transpose(1, 2)

        q, k, gate = (heads_first(t, self.head_k) for t in (q, k, gate))
        o = self.core(q, k, heads_first(v, self.head_v), gate=gate)  # chunked_gla
        return self._output(o.transpose(1, 2), x)

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> dict:
        """S (batch, n_heads, d_k, d_v) zeros in at least float32 (as the core's), and the
        three convolution windows if any."""
        state = {
            "S": torch.zeros(
                batch,
                self.n_heads,
                self.head_k,
                self.head_v,
                device=device,
                dtype=torch.promote_types(dtype, torch.float32),
            )
        }
        if self.use_short_conv:
            for name in ("q", "k", "v"):
                conv = getattr(self, f"{name}_conv")
                state[name] = conv.initial_state(batch, device, dtype)
        return state

    def step(self, state: dict, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """One position: x (batch, d_model) -> (y (batch, d_model), the new state)."""
        new = {}
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            q, new["q"] = self.q_conv.step(state["q"], q)
            k, new["k"] = self.k_conv.step(state["k"], k)
            v, new["v"] = self.v_conv.step(state["v"], v)
        gate = self._heads(self.gk_proj(x), self.head_k)
        q, k, v = (
            self._heads(q, self.head_k),
            self._heads(k, self.head_k),
            self._heads(v, self.head_v),
        )
        o, new["S"] = self.core.step(state["S"], q, k, v, gate=gate)
        return self._output(o, x), new

    def state_size(self, seq_len: int) -> int:
        """S (n_heads d_k d_v) and, with the convolution, its (conv_size - 1)-input windows."""
        size = self.n_heads * self.head_k * self.head_v
        if self.use_short_conv:
            size += (self.q_conv.kernel - 1) * (2 * self.key_dim + self.value_dim)
        return size


GatedLinearAttention.layer = GLALayer
