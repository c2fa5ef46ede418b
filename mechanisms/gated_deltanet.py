"""Gated DeltaNet: the delta rule with a data-dependent decay (Yang, Kautz and Hatamizadeh
2024, Gated Delta Networks: Improving Mamba2 with Delta Rule, arXiv 2412.06464), computed
chunk by chunk with the WY representation and the UT transform extended to the decay (the
paper's sec. 3.3; flash-linear-attention's ``chunk_gated_delta_rule``).

Per head h, with d = head_dim, q_t, k_t in R^d, v_t in R^{d_v} (rows of the (batch, heads,
length, .) inputs), the extra inputs ``beta`` and ``gate`` (batch, heads, length, 1), raw,
and the head's learned parameters ``A_log[h]`` and ``dt_bias[h]``:

    k^_t    = k_t / sqrt(|k_t|^2 + 1e-6)                  (L2 normalisation, as deltanet)
    q^_t    = q_t / sqrt(|q_t|^2 + 1e-6) * d^(-1/2)       (L2 normalisation, then the scale)
    b_t     = sigmoid(beta_t)                             (the write strength, in (0, 1))
    l_t     = -exp(A_log[h]) softplus(gate_t + dt_bias[h])    (log alpha_t <= 0)
    alpha_t = exp(l_t)                                    (the decay, in (0, 1])
    S_t     = alpha_t (I - b_t k^_t k^_t^T) S_{t-1} + b_t k^_t v_t^T,     S_{-1} = 0
    o_t     = q^_t^T S_t                                   (a row of length d_v)

the paper's eq. 10 (gated delta rule) written for S indexed (key coordinate, value
coordinate), the transpose of the paper's S_t; alpha_t = 1 is DeltaNet (mechanisms/
deltanet.py), b_t = 0 a pure decay (Mamba-2's gate). The output reads the state after the
write (o_t sees v_t).

Choices, and where they come from:

- The decay is Mamba-2's parameterisation, the paper's ("alpha_t ... following Mamba2",
  sec. 3.1 and its released code; fla's ``naive_gdn_gate`` in fla/ops/gated_delta_rule/
  gate.py: g = -exp(A_log) softplus(a + dt_bias)), with the core's own ``A_log`` and
  ``dt_bias``, not a parameter-free logsigmoid(gate). Why: the parameterisation fixes the
  decays a fresh model starts from. With A ~ uniform(0, 16) and softplus(dt_bias) log-uniform
  in [1e-3, 1e-1] (below), a head starts with alpha near 1 (memory of tens to thousands of
  tokens, spread across heads); logsigmoid of a near-zero projection starts every head at
  alpha ~ 1/2, a memory of one or two tokens, which is not the method. It is also exactly
  what the published layer feeds its kernel (``use_gate_in_kernel=True``), so the core and
  the layer share one gate (``log_decay``).
- Parameters, per head, float32 as built, drawn from torch's global generator in fla's order
  (fla/layers/gated_deltanet.py): ``A_log`` = log(A), A ~ uniform(0, 16) (note: (0, 16), not
  Mamba-2's (1, 16)); then ``dt_bias``: Delta0 log-uniform in [1e-3, 1e-1], floor 1e-4,
  stored as its inverse softplus (mamba2.py's ``initial_dt_bias``, the same draw). Neither is
  weight-decayed (``_no_weight_decay``, as fla and Mamba-2).
- L2 normalisation of q and k with the q scale d^(-1/2), and b = sigmoid(beta): as deltanet
  (fla's ``use_qk_l2norm_in_kernel=True``, ``use_beta_sigmoid_in_kernel=True``, default
  scale). fla's ``allow_neg_eigval`` (b in (0, 2)) is not used (a later paper, arXiv
  2411.12537, not Gated DeltaNet's).
- Left to the model in the core track, as for every mechanism here: the short convolution,
  output gate and norm and projections. They are in ``GatedDeltaNetLayer`` below, the block
  track's published layer. No positions either (``--pos``).
- Causal only: a recurrence; ``causal=False`` raises ValueError.

Three forms of the same function:

- ``gated_delta_rule_reference``: the recurrence above, one token at a time (as fla's
  ``naive_recurrent_gated_delta_rule``), the readable reference.
- ``chunked_gated_delta_rule`` (``forward``): N = ceil(L / chunk_size) chunks of
  C = ceil(L / N) positions (deltanet's ``chunking``; the last one zero-padded with k = v = 0,
  b = 0 and l = 0: it writes and decays nothing). Inside a chunk, with S the state before it,
  g_i = l_1 + ... + l_i the log decay from the chunk's start (<= 0), D_ij = exp(g_i - g_j)
  for j <= i (mamba2's ``segsum``: each l masked before the sum), 0 above the diagonal, and
  B = diag(b), E = diag(exp(g)):

      A  = strictly lower part of (B K K^T) * D        (A_ij = b_i D_ij k^_i . k^_j, j < i)
      T  = (I + A)^(-1)                                (the UT transform, a triangular solve)
      W  = T B E K,  U~ = T B V                         (the WY representation)
      U  = U~ - W S                                     (u_i = b_i (v_i - alpha_i S_{i-1}^T k^_i))
      O  = E Q S + ((Q K^T) * D) U                      (D keeps the diagonal: o_t sees v_t)
      S <- exp(g_C) S + (K * exp(g_C - g))^T U

  Why: with u_i as above the recurrence is S_i = alpha_i S_{i-1} + k^_i u_i^T, so
  S_i = exp(g_i) S + sum_{j <= i} D_ij k^_j u_j^T, and alpha_i S_{i-1} (what u_i reads) is the
  same sum over j < i with exp(g_i) S; hence (I + A) U = B V - B E K S. T, W, U~ for every
  chunk at once; only the state passing loops over the chunks. Cost O(L C (d + d_v) + L d d_v).
- the recurrent form (``initial_state``, ``step``; ``gated_delta_step``): S, d x d_v numbers
  per head whatever L.

Numerics: every exponent is a sum of l_r <= 0 over a segment (never exp(-g)), so every factor
is in [0, 1]; all in at least float32 (``compute_dtype``), returned in v's dtype.

The published layer (``GatedDeltaNetLayer``, the block track; fla/layers/gated_deltanet.py,
the paper's fig. 1 right), in order, x (batch, length, d_model):

1. q, k, v = q_proj(x), k_proj(x), v_proj(x): Linear, no bias; key width n_heads * head_dim,
   value width n_heads * head_dim * expand_v (fla: ``head_k_dim``, ``head_v_dim``).
2. a depthwise causal convolution (kernel ``conv_size`` 4, no bias) then SiLU on each of q,
   k, v (fla's ``ShortConvolution``, activation 'silu'; ``use_short_conv=False``: SiLU only,
   as fla).
3. beta = b_proj(x), a = a_proj(x): Linear to one number per head, no bias; the core above
   turns them into b = sigmoid(beta) and l = -exp(A_log) softplus(a + dt_bias), and L2-
   normalises q and k (fla: ``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel``,
   ``use_beta_sigmoid_in_kernel``). ``A_log`` and ``dt_bias`` as the core's, above.
4. the gated delta rule per head (``chunked_gated_delta_rule``; ``step`` for decoding).
5. output gate: rmsnorm(o) * weight * silu(g_proj(x)) per head over head_v_dim (fla's
   ``FusedRMSNormGated``, norm before gate, eps ``norm_eps`` 1e-5; ``GatedRMSNorm`` here);
   ``use_gate=False``: a plain per-head ``RMSNorm``, no g_proj (as fla).
6. o_proj: Linear(value width, d_model), no bias.

Sizes: fla's defaults (hidden 2048, 6 heads of head_dim 256, expand_v 2) give key width
0.75 d_model and value width 1.5 d_model, about 6 d_model^2 parameters (its docstring).
``head_dim=0`` (the default) keeps that ratio: head_dim = 0.75 d_model / n_heads, 12 at
d_model 64 and 4 heads (value heads 24). Not used: fla's GVA (``num_v_heads``) and
``allow_neg_eigval`` (both off by default there).
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
from synthbench.mechanisms.deltanet import l2_normalise
from synthbench.mechanisms.mamba2 import initial_dt_bias, segsum_exp, sums_to_end

A_INIT_RANGE = (0.0, 16.0)  # A ~ uniform(0, 16), A_log = log(A) (fla/layers/gated_deltanet.py)
KEY_WIDTH_RATIO = 0.75  # fla: num_heads * head_dim = 0.75 hidden_size (6 x 256 = 0.75 x 2048)


def initial_A_log(n_heads: int) -> torch.Tensor:  # noqa: N802
    """fla's Gated DeltaNet A_log = log(uniform(0, 16)) (torch's global generator)."""
    return torch.empty(n_heads).uniform_(*A_INIT_RANGE).log()


def log_decay(gate: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:  # noqa: N803
    """l = -exp(A_log) softplus(gate + dt_bias): gate (B, H, ..., 1) raw, A_log and dt_bias
    (H,) -> (B, H, ...), <= 0. Works on one position too (no length axis)."""
    shape = (-1,) + (1,) * (gate.dim() - 3)  # heads is dim 1 of gate[..., 0]
    return -A_log.exp().view(shape) * F.softplus(gate[..., 0] + dt_bias.view(shape))


def _prepared(q, k, v, beta, log_alpha):
    """q^ (normalised, scaled), k^ (normalised), v, b = sigmoid(beta) (..., 1) and l, all in
    the compute dtype."""
    dtype = compute_dtype(q, k, v, beta, log_alpha)
    q, k, v, beta, log_alpha = (t.to(dtype) for t in (q, k, v, beta, log_alpha))
    q = l2_normalise(q) / math.sqrt(q.shape[-1])
    return q, l2_normalise(k), v, torch.sigmoid(beta), log_alpha


def _check_inputs(causal: bool, beta, gate) -> None:
    if not causal:
        raise ValueError("gated-deltanet is causal only: the gated delta rule is a recurrence")
    if beta is None or gate is None:
        raise ValueError("gated-deltanet needs its extra inputs beta and gate (B, H, L, 1)")


def gated_delta_rule_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_alpha: torch.Tensor
) -> torch.Tensor:
    """The recurrence of the module docstring, token after token: q, k (B, H, L, d), v
    (B, H, L, d_v), beta (B, H, L, 1) raw, log_alpha (B, H, L) (<= 0) -> (B, H, L, d_v) in
    v's dtype."""
    out_dtype = v.dtype
    q, k, v, b, log_alpha = _prepared(q, k, v, beta, log_alpha)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, v.shape[-1])  # S: (key coordinate, value coordinate)
    eye = torch.eye(dim, dtype=q.dtype, device=q.device)
    outs = []
    for t in range(length):
        k_col, b_t = k[:, :, t].unsqueeze(-1), b[:, :, t, :, None]  # (B, H, d, 1), (B, H, 1, 1)
        alpha_t = log_alpha[:, :, t].exp()[..., None, None]
        transition = alpha_t * (eye - b_t * k_col @ k_col.mT)  # alpha_t (I - b_t k^ k^^T)
        state = transition @ state + b_t * k_col @ v[:, :, t].unsqueeze(-2)
        outs.append((q[:, :, t].unsqueeze(-2) @ state).squeeze(-2))  # q^_t^T S_t
    return torch.stack(outs, dim=-2).to(out_dtype)


def chunked_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    log_alpha: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The chunkwise (WY / UT-transform with decay) form of the module docstring: the same
    function as ``gated_delta_rule_reference``, same arguments and result."""
    out_dtype = v.dtype
    q, k, v, b, log_alpha = _prepared(q, k, v, beta, log_alpha)
    batch, heads, length, dim = q.shape
    dim_v = v.shape[-1]
    N, C = chunking(length, chunk_size)
    pad = N * C - length

    def chunks(t: torch.Tensor) -> torch.Tensor:  # zero-padded, (B, H, N, C, width)
        return F.pad(t, (0, 0, 0, pad)).reshape(batch, heads, N, C, t.shape[-1])

    q, k, v, b = chunks(q), chunks(k), chunks(v), chunks(b)
    log_alpha = F.pad(log_alpha, (0, pad)).reshape(batch, heads, N, C)
    decays = segsum_exp(log_alpha)  # D_ij = exp(g_i - g_j) for j <= i, 0 above
    from_start = log_alpha.cumsum(-1).unsqueeze(-1)  # g_i (B, H, N, C, 1), <= 0
    growth = from_start.exp()  # exp(g_i) <= 1: E's diagonal
    # every chunk at once: A, then W = T B E K and U~ = T B V by one triangular solve of
    # I + A. The solve reads only the strictly lower part of its matrix (unitriangular: the
    # unit diagonal is implied, and its gradient is that part's), so it is given
    # (B K K^T) * D whole: its strictly lower part is A
    a = ((b * k) @ k.mT) * decays
    rhs = torch.cat([b * growth * k, b * v], dim=-1)
    wu = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    w, u_tilde = wu.split([dim, dim_v], dim=-1)
    # exp(g_C - g_j) = exp(l_{j+1} + ... + l_C): D's last row, summed back from the end
    to_end = sums_to_end(log_alpha).exp().unsqueeze(-1)
    total = growth[..., -1, :].unsqueeze(-1)  # exp(g_C) (B, H, N, 1, 1)
    # across chunks: S <- exp(g_C) S + (K exp(g_C - g))^T (U~ - W S), the chunks taken apart
    # by unbind (one stack backwards), not by indexing
    states = [q.new_zeros(batch, heads, dim, dim_v)]
    ks, ws, us, totals = ((k * to_end).unbind(2), w.unbind(2), u_tilde.unbind(2), total.unbind(2))
    for n in range(N - 1):
        s = states[-1]
        states.append(totals[n] * s + ks[n].mT @ (us[n] - ws[n] @ s))
    before = torch.stack(states, dim=2)  # (B, H, N, d, d_v)
    u = u_tilde - w @ before
    out = (q * growth) @ before + ((q @ k.mT) * decays) @ u
    return out.reshape(batch, heads, N * C, dim_v)[:, :, :length].to(out_dtype)


def gated_delta_step(state, q, k, v, beta, log_alpha):
    """One position of the recurrence: q, k (B, H, d), v (B, H, d_v), beta (B, H, 1) raw,
    log_alpha (B, H), state S (B, H, d, d_v) -> (o (B, H, d_v) in v's dtype, the new S).
    S <- alpha S, then S <- S + b k^ (v - S^T k^)^T, then o = q^^T S. Not in place."""
    out_dtype = v.dtype
    q, k, v, b, log_alpha = _prepared(q, k, v, beta, log_alpha)
    dtype = torch.promote_types(q.dtype, state.dtype)
    q, k, v, b, log_alpha = (t.to(dtype) for t in (q, k, v, b, log_alpha))
    state = log_alpha.exp()[..., None, None] * state
    read = (k.unsqueeze(-2) @ state).squeeze(-2)  # S^T k^: (B, H, d_v)
    state = state + (b * k).unsqueeze(-1) * (v - read).unsqueeze(-2)
    out = (q.unsqueeze(-2) @ state).squeeze(-2)
    return out.to(out_dtype), state


@MECHANISMS.register(
    "gated-deltanet",
    aliases=("gated-delta-net",),
    complexity="linear",
    family="delta-rule",
    reference="Yang, Kautz and Hatamizadeh 2024, Gated Delta Networks: Improving Mamba2 with "
    "Delta Rule (arXiv 2412.06464)",
)
class GatedDeltaNet(MatrixStateMechanism):
    """The gated delta rule: S_t = alpha_t (I - b_t k^_t k^_t^T) S_{t-1} + b_t k^_t v_t^T,
    o_t = q^_t^T S_t, with q, k L2-normalised (q then scaled by head_dim^-1/2),
    b_t = sigmoid(beta_t) and alpha_t = exp(-exp(A_log) softplus(gate_t + dt_bias)); ``beta``
    and ``gate`` extra inputs of width 1 (raw), ``A_log`` and ``dt_bias`` learned per head
    (fla's Gated DeltaNet init). Causal only (causal=False raises ValueError). The exact
    definition, the chunked form and the choices: the module docstring.

    chunk_size: positions per chunk of the chunkwise form (>= 1, default 64; any value gives
    the same function)."""

    signed = True  # its implicit attention weights take either sign

    def __init__(self, head_dim: int, n_heads: int, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size
        self.extra_inputs = {"beta": 1, "gate": 1}
        # fla's order: A_log drawn first, then dt_bias
        self.A_log = nn.Parameter(initial_A_log(n_heads))
        self.dt_bias = nn.Parameter(initial_dt_bias(n_heads))
        for param in (self.A_log, self.dt_bias):  # as fla: no weight decay (train.py)
            param._no_weight_decay = True

    def forward(self, q, k, v, causal: bool = True, beta=None, gate=None):
        _check_inputs(causal, beta, gate)
        log_alpha = log_decay(gate, self.A_log, self.dt_bias)
        return chunked_gated_delta_rule(q, k, v, beta, log_alpha, self.chunk_size)

    def step(self, state, q, k, v, beta=None, gate=None):
        """One position: q, k, v (batch, heads, head_dim), beta and gate (batch, heads, 1)
        raw: ``gated_delta_step``."""
        _check_inputs(True, beta, gate)
        return gated_delta_step(state, q, k, v, beta, log_decay(gate, self.A_log, self.dt_bias))


class GatedDeltaNetLayer(Layer):
    """Gated DeltaNet's published layer (fla/layers/gated_deltanet.py): projections, short
    convolutions + SiLU, the gated delta rule, a gated per-head RMSNorm and the output
    projection; every part and its source in the module docstring ("The published layer").

    Options (fla's defaults, sizes scaled as the module docstring says):
    head_dim: key width per head; 0 (default) = 0.75 d_model / n_heads (fla's ratio).
    expand_v: value head width / head_dim (2.0). use_short_conv (True), conv_size (4).
    use_gate: the output gate (True; False: a plain RMSNorm). norm_eps: 1e-5.
    chunk_size: of the chunkwise form (64; any value gives the same function)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int = 0,
        expand_v: float = 2.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        use_gate: bool = True,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        check_int("head_dim", head_dim, 0)
        check_int("conv_size", conv_size, 1)
        check_int("chunk_size", chunk_size, 1)
        check_positive(expand_v=expand_v, norm_eps=norm_eps)
        if head_dim == 0:
            head_dim = round(KEY_WIDTH_RATIO * d_model / n_heads)
            if head_dim < 1 or head_dim * n_heads * 4 != 3 * d_model:
                raise ValueError("0.75 d_model / n_heads is not a whole head_dim: set head_dim")
        head_v_dim = head_dim * expand_v
        if head_v_dim != int(head_v_dim):
            raise ValueError(f"expand_v {expand_v} times head_dim {head_dim} is not an integer")
        self.head_dim, self.head_v_dim = head_dim, int(head_v_dim)
        self.use_short_conv, self.use_gate, self.chunk_size = use_short_conv, use_gate, chunk_size
        key_dim, value_dim = n_heads * head_dim, n_heads * self.head_v_dim
        self.key_dim, self.value_dim = key_dim, value_dim
        # fla's order of construction (the global generator draws in the same order)
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        self.A_log = nn.Parameter(initial_A_log(n_heads))
        self.dt_bias = nn.Parameter(initial_dt_bias(n_heads))
        for param in (self.A_log, self.dt_bias):
            param._no_weight_decay = True
        if use_short_conv:
            self.q_conv = ShortConvolution(key_dim, conv_size)
            self.k_conv = ShortConvolution(key_dim, conv_size)
            self.v_conv = ShortConvolution(value_dim, conv_size)
        if use_gate:
            self.g_proj = nn.Linear(d_model, value_dim, bias=False)
            self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, norm_before_gate=True)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def _convs(self):
        return (self.q_conv, self.k_conv, self.v_conv) if self.use_short_conv else ()

    def _heads(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """(..., n_heads * width) -> (..., n_heads, width)."""
        return x.reshape(*x.shape[:-1], self.n_heads, width)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o (..., n_heads, head_v_dim), x (..., d_model) -> (..., d_model): steps 5 and 6."""
        if self.use_gate:
            o = self.o_norm(o, self._heads(self.g_proj(x), self.head_v_dim))
        else:
            o = self.o_norm(o)
        return self.o_proj(o.flatten(-2))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        qkv = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.use_short_conv:
            qkv = tuple(conv(t) for conv, t in zip(self._convs(), qkv, strict=True))
        else:
            qkv = tuple(F.silu(t) for t in qkv)
        widths = (self.head_dim, self.head_dim, self.head_v_dim)
        # (B, L, H, width) -> (B, H, L, width)
        q, k, v = (self._heads(t, w).transpose(1, 2) for t, w in zip(qkv, widths, strict=True))
        beta = self.b_proj(x).transpose(1, 2).unsqueeze(-1)  # (B, H, L, 1)
        gate = self.a_proj(x).transpose(1, 2).unsqueeze(-1)  # (B, H, L, 1)
        log_alpha = log_decay(gate, self.A_log, self.dt_bias)
        o = chunked_gated_delta_rule(q, k, v, beta, log_alpha, self.chunk_size)
        return self._output(o.transpose(1, 2), x)

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(the three conv windows, or none; S (batch, heads, head_dim, head_v_dim) = 0 in at
        least float32)."""
        convs = tuple(conv.initial_state(batch, device, dtype) for conv in self._convs())
        s_dtype = torch.promote_types(dtype, torch.float32)
        shape = (batch, self.n_heads, self.head_dim, self.head_v_dim)
        return convs, torch.zeros(shape, device=device, dtype=s_dtype)

    def step(self, state, x: torch.Tensor):
        """One position: x (batch, d_model) -> (y (batch, d_model), the new state)."""
        convs, s = state
        qkv = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.use_short_conv:
            stepped = [
                conv.step(c, t) for conv, c, t in zip(self._convs(), convs, qkv, strict=True)
            ]
            qkv, convs = tuple(y for y, _ in stepped), tuple(c for _, c in stepped)
        else:
            qkv = tuple(F.silu(t) for t in qkv)
        widths = (self.head_dim, self.head_dim, self.head_v_dim)
        q, k, v = (self._heads(t, w) for t, w in zip(qkv, widths, strict=True))  # (B, H, w)
        beta = self.b_proj(x).unsqueeze(-1)  # (B, H, 1)
        log_alpha = log_decay(self.a_proj(x).unsqueeze(-1), self.A_log, self.dt_bias)
        o, s = gated_delta_step(s, q, k, v, beta, log_alpha)
        return self._output(o, x), (convs, s)

    def state_size(self, seq_len: int) -> int:
        """The conv windows ((conv_size - 1) per channel of q, k and v) and S per head."""
        convs = sum((c.kernel - 1) * c.channels for c in self._convs())
        return convs + self.n_heads * self.head_dim * self.head_v_dim


GatedDeltaNet.layer = GatedDeltaNetLayer
