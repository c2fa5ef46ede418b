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
directly on short sequences (synthbench/core/mechanism.py). ``attend_to_factored_scores``
computes the same from scores that factorise into thin products (SLAY's), a block of batch
rows at a time, with a hand-written backward that recomputes them: no (B, H, L, L) tensor,
and no fresh memory per block (on a CPU the page faults of fresh memory cost more than the
arithmetic at these sizes).

Features that can be negative (``signed=True``: random Fourier features, the signed
polynomial sketches of SLAY) can drive the denominator to 0 or below. There the
denominator keeps its sign and is pushed away from 0 to magnitude at least ``eps``,
instead of adding ``eps``, which would not stop a division by a near-zero negative sum.
"""

from __future__ import annotations

import math

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


# attend_to_factored_scores on a CPU: the bytes of one block's (L x L) scores (a few such
# buffers stay in a 1 MiB L2 cache), the query rows the backward takes at a time past
# ROW_CHUNK_FROM, and the width under which a factor's gradient is formed as its transpose
# (MKL's (L x L) @ (L x K) is several times slower at K 8 than (K x L) @ (L x L))
BLOCK_BYTES = 2**20
ROW_CHUNK, ROW_CHUNK_FROM = 64, 96
THIN = 16


def functorch_active() -> bool:
    """Whether a torch.func transform (vmap, grad, ...) is tracing the call: the blocked
    path's autograd.Functions have no rule for them, so a mechanism then takes its plain
    operations (packed training vmaps a model: synthbench/run/packed.py)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else False


def factored_scores(factors: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The scores of ``factors``: prod_f (x_f[0] x_f[1]^T) ** power_f, (..., L, L).

    Each factor ``(x, power)`` stacks its query and key sides, x (2, ..., L, K_f), and
    ``power`` is 1 or 2: the kernel of a product of feature maps is the product of their
    kernels, so scores of R x P x M tensor-product features come from two thin products."""
    in_place = not torch.is_grad_enabled() and not functorch_active()  # no graph to keep
    scores = None
    for x, power in factors:
        product = x[0] @ x[1].mT
        if power == 2:
            product = product.square_() if in_place else product.square()
        if scores is None:
            scores = product
        else:  # in place where autograd allows: one (L x L) allocation fewer
            scores = scores.mul_(product) if in_place else scores * product
    return scores


def attend_to_factored_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scores,
    factors,
    eps: float = 1e-6,
    signed: bool = False,
    block_bytes: int | None = None,
    factors_vjp=None,
) -> torch.Tensor:
    """``attend_to_scores(scores(q, k), v, causal=True, eps=eps, signed=signed)``, the
    same values, without ever holding the (B, H, L, L) scores of the whole batch.

    ``scores(q, k)`` gives the scores of a block of batch rows (B', H, L, L), in at least
    float32, as a new tensor (it is masked in place); ``factors(q, k)`` the same scores as
    differentiable factors of ``factored_scores``. The forward takes a block of rows at a
    time and keeps none of its scores; the backward, block by block, evaluates the factors
    again, recomputes their thin products, forms the gradient of the scores (``ROW_CHUNK``
    query rows at a time past L ``ROW_CHUNK_FROM``, so that the keys after the last row
    are skipped), multiplies it back onto the factors and lets autograd take it from the
    factors to q and k. Every (L x L) temporary is the size of a block and reused: whole,
    at L 256, batch 32 and 4 heads, each would be 32 MB of fresh memory, and on a CPU the
    page faults of fresh memory cost more than the arithmetic on it.

    ``factors_vjp(q, k)``, optional, gives the factors with their own backward instead:
    (factors, vjp) with vjp(d_factors) -> (dq, dk), or None where it has none (then
    autograd through ``factors``): a few narrow feature maps differentiated by hand cost
    less than autograd's pass over their graph, block after block.

    The factors must not depend on learnable parameters (q, k and v alone get gradients).
    On a CPU a block is as many batch rows as fit ``block_bytes`` (default ``BLOCK_BYTES``)
    of scores, at least one; elsewhere the whole batch, one block (a loop would be bound by
    kernel launches)."""
    B, H, L, _ = q.shape
    chunk = L if L <= ROW_CHUNK_FROM else ROW_CHUNK
    if q.device.type == "cpu":
        block_bytes = block_bytes or BLOCK_BYTES
        row = H * L * compute_dtype(q, k, v).itemsize  # bytes of one batch row's score row
        blocks = (max(1, block_bytes // (row * L)), max(1, block_bytes // (row * chunk)))
    else:
        blocks = (B, B)
    return _FactoredScores.apply(
        q, k, v, scores, factors, factors_vjp, float(eps), signed, blocks, chunk
    )


class _FactoredScores(torch.autograd.Function):
    """out = normalise(tril(S) v, tril(S) 1), S = scores(q, k), block after block of batch
    rows (attend_to_factored_scores). With T = tril(S), den' the guarded denominator, g the
    output gradient, gn = g / den' and gd = -(gn . out) (0 where the guard clamps):
        dv = T^T gn,    dT = tril(gn v^T + gd 1^T),
    and per factor f with products A_f = x_f[0] x_f[1]^T, S = prod_f A_f^p_f:
        dA_f = dT * p_f A_f^(p_f - 1) prod_{f' != f} A_f'^p_f',
        dx_f[0] = dA_f x_f[1],    dx_f[1] = dA_f^T x_f[0],
    then autograd from the factors to q and k."""

    @staticmethod
    def forward(ctx, q, k, v, scores, factors, factors_vjp, eps, signed, blocks, chunk):
        B, H, L, D = v.shape
        dtype = compute_dtype(q, k, v)
        values = v.to(dtype).contiguous()
        num = torch.empty(B, H, L, D, dtype=dtype, device=v.device)
        den = torch.empty(B, H, L, dtype=dtype, device=v.device)
        for start in range(0, B, blocks[0]):
            rows = slice(start, start + blocks[0])
            block = scores(q[rows], k[rows]).to(dtype).tril_().flatten(0, 1)
            torch.bmm(block, values[rows].flatten(0, 1), out=num[rows].flatten(0, 1))
            torch.sum(block, dim=-1, out=den[rows].flatten(0, 1))
        if signed:
            guarded = torch.where(den < 0, den.clamp(max=-eps), den.clamp(min=eps))
            ctx.unclamped = guarded == den
            den = guarded
        else:
            den.add_(eps)
        out = num.div_(den.unsqueeze(-1))
        ctx.save_for_backward(q, k, values, out, den)
        ctx.factors, ctx.factors_vjp = factors, factors_vjp or (lambda q, k: None)
        ctx.signed, ctx.v_dtype = signed, v.dtype
        ctx.group, ctx.chunk = blocks[1], chunk
        return out.to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, values, out, den = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_factors = need_q or need_k
        grad_num = grad.to(values.dtype) / den.unsqueeze(-1)
        grad_den = torch.linalg.vecdot(grad_num, out).neg_()
        if ctx.signed:
            grad_den.mul_(ctx.unclamped)
        grad_den = grad_den.unsqueeze(-1)
        grads = {
            "q": torch.empty_like(q, memory_format=torch.contiguous_format) if need_q else None,
            "k": torch.empty_like(k, memory_format=torch.contiguous_format) if need_k else None,
        }
        dv = torch.empty_like(values) if need_v else None
        scratch: list[torch.Tensor | None] = []
        for start in range(0, values.shape[0], ctx.group):
            rows = slice(start, start + ctx.group)
            leaves = {"q": q[rows].detach(), "k": k[rows].detach()}
            # the factors with their own backward where the mechanism has one, else autograd's
            with_vjp = ctx.factors_vjp(*leaves.values()) if need_factors else None
            if with_vjp is not None:
                factors, vjp = with_vjp
            else:
                for name, leaf in leaves.items():
                    leaf.requires_grad_(grads[name] is not None)
                with torch.set_grad_enabled(need_factors):
                    factors = ctx.factors(leaves["q"], leaves["k"])
            d_factors = _factored_block_backward(
                [(x.detach().flatten(1, 2), power) for x, power in factors],
                grad_num[rows].flatten(0, 1),
                grad_den[rows].flatten(0, 1),
                values[rows].flatten(0, 1),
                dv[rows].flatten(0, 1) if need_v else None,
                need_factors,
                scratch,
                ctx.chunk,
            )
            if not need_factors:
                continue
            d_factors = [d.view_as(x) for (x, _), d in zip(factors, d_factors, strict=True)]
            wanted = [name for name, full in grads.items() if full is not None]
            if with_vjp is not None:
                found = dict(zip("qk", vjp(d_factors), strict=True))
                found = [found[name] for name in wanted]
            else:
                roots = [(x, d) for (x, _), d in zip(factors, d_factors, strict=True)]
                roots = [(x, d) for x, d in roots if x.requires_grad]
                found = [None] * len(wanted)
                if roots:
                    found = torch.autograd.grad(
                        [x for x, _ in roots],
                        [leaves[name] for name in wanted],
                        [d for _, d in roots],
                        allow_unused=True,
                    )
            for name, g in zip(wanted, found, strict=True):
                if g is None:
                    grads[name][rows].zero_()
                else:
                    grads[name][rows] = g
        if need_v:
            dv = dv.to(ctx.v_dtype)
        return grads["q"], grads["k"], dv, None, None, None, None, None, None, None


def _factored_block_backward(factors, grad_num, grad_den, values, dv, need_factors, scratch, chunk):
    """One block of _FactoredScores' backward on (G', L, .) tensors: writes dv (if given) and
    returns the gradient of each factor (2, G', L, K) (if ``need_factors``), ``chunk``
    query rows at a time: rows r0:r1 meet keys :r1 only, so that below the diagonal
    nothing is computed twice and above it little is computed at all (at 4 chunks 5/8 of
    the full products). Its temporaries and the factors' gradients live in ``scratch``,
    buffers reused from block to block: fresh memory for each would cost page faults, on a
    CPU more than the products at L 256."""
    n = len(factors)
    G, L = grad_num.shape[:2]
    whole = chunk >= L  # one chunk: every result written once, nothing accumulated

    def buffer(i, *shape):
        size = math.prod(shape)
        if len(scratch) <= i:
            scratch.extend([None] * (i + 1 - len(scratch)))
        if scratch[i] is None or scratch[i].numel() < size:
            scratch[i] = grad_num.new_empty(size)
        return scratch[i][:size].view(shape)

    # (L x L) @ (L x K) is slow for a thin K: there the gradient is formed as its transpose
    thin = [x.shape[-1] < THIN for x, _ in factors]
    d_factors = []
    if need_factors:
        for f, (x, _) in enumerate(factors):
            K = x.shape[-1]
            dx = buffer(n + 2 + f, 2, G, K, L).mT if thin[f] else buffer(n + 2 + f, 2, G, L, K)
            if not whole:
                dx[1].zero_()  # the key side accumulates over the chunks
            d_factors.append(dx)
    if dv is not None and not whole:
        dv.zero_()
    for r0 in range(0, L, chunk):
        r1 = min(L, r0 + chunk)
        C = r1 - r0
        products = [
            torch.bmm(x[0, :, r0:r1], x[1, :, :r1].mT, out=buffer(f, G, C, r1))
            for f, (x, _) in enumerate(factors)
        ]
        terms = [a.square() if p == 2 else a for a, (_, p) in zip(products, factors, strict=True)]
        gn = grad_num[:, r0:r1]
        if dv is not None:
            if n == 1:  # in place: dA needs only the raw product, kept apart at power 2
                block = terms[0]
            else:
                block = torch.mul(terms[0], terms[1], out=buffer(n, G, C, r1))
            for term in terms[2:]:
                block.mul_(term)
            block.tril_(r0)
            if whole:
                torch.bmm(block.mT, gn, out=dv)
            else:
                dv[:, :r1].baddbmm_(block.mT, gn)
        if not need_factors:
            continue
        # dT = tril(gn v^T + gd), then per factor dA_f (the last one in dT's place)
        d_scores = torch.baddbmm(
            grad_den[:, r0:r1], gn, values[:, :r1].mT, out=buffer(n + 1, G, C, r1)
        ).tril_(r0)
        for f, ((x, p), a, dx) in enumerate(zip(factors, products, d_factors, strict=True)):
            others = terms[:f] + terms[f + 1 :]
            if f == n - 1:  # dT is not needed after the last factor
                d_a = d_scores
            else:
                d_a, others = torch.mul(d_scores, others[0], out=buffer(n, G, C, r1)), others[1:]
            for term in others:
                d_a.mul_(term)
            if p == 2:
                d_a.mul_(a).mul_(2)
            if thin[f]:  # dx is the transpose of a (2, G', K, L) buffer
                torch.bmm(x[1, :, :r1].mT, d_a.mT, out=dx[0, :, r0:r1].mT)
                if whole:
                    torch.bmm(x[0].mT, d_a, out=dx[1].mT)
                else:
                    dx[1, :, :r1].mT.baddbmm_(x[0, :, r0:r1].mT, d_a)
            else:
                torch.bmm(d_a, x[1, :, :r1], out=dx[0, :, r0:r1])
                if whole:
                    torch.bmm(d_a.mT, x[0], out=dx[1])
                else:
                    dx[1, :, :r1].baddbmm_(d_a.mT, x[0, :, r0:r1])
    return d_factors if need_factors else None


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
