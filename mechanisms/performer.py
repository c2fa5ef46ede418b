"""Performer attention: random-feature estimates of a kernel on the shared linear core
(Choromanski et al. 2021, Rethinking Attention with Performers).

``performer`` is FAVOR+: positive random features for the softmax kernel,
    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(M),   x' = x d^(-1/4),
with rows w_m ~ N(0, I_d). Since E[exp(w.a)] = exp(|a|^2 / 2) for w ~ N(0, I),
    E[phi(q) . phi(k)] = E[exp(w.(q' + k'))] exp(-(|q'|^2 + |k'|^2) / 2) = exp(q'.k')
                       = exp(q.k / sqrt(d)),
the unnormalised softmax weight, so the normalised output estimates softmax attention.

``performer-relu`` is the ReLU random-feature variant that the SLAY authors' code ran under
the name "performer" (SLAY 001, Table 9): phi(x) = relu(W x) / sqrt(M) with the same draws.
It does not estimate softmax: E[relu(w.q) relu(w.k)] is the first-order arc-cosine kernel
|q| |k| (sin t + (pi - t) cos t) / (2 pi), t the angle between q and k (Cho & Saul 2009).
Both feature maps are non-negative.

The rows of W come in orthogonal blocks (``orthogonal_gaussian``): every d rows are an
orthonormal set, rescaled by independent chi(d) norms, so that each row on its own is still
exactly N(0, I_d) (both estimators stay unbiased) while the rows of a block are orthogonal,
which lowers the variance (Performer sec. 2.4).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from synthbench.core.linear_attention import compute_dtype
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, random_generator
from synthbench.core.params import check_int

REFERENCE = "Choromanski et al. 2021, Rethinking Attention with Performers"
# Key logits w.k' - |k'|^2/2 = |w|^2/2 - |k' - w|^2/2 are clamped at this value: e^40 leaves
# room below float32's e^88 for sums over many positions and features. Only a key within
# reach of a row w with |w|^2/2 > 40 (head_dim about 64 or more) can get there.
KEY_LOGIT_BOUND = 40.0


MAX_FEATURES = 2**16  # random projections a mechanism may draw


def orthogonal_gaussian(n_rows: int, dim: int, generator: torch.Generator | None) -> torch.Tensor:
    """(n_rows, dim) float64 projections in orthogonal blocks, each row N(0, I_dim).

    Every block of ``dim`` rows (the last one truncated) is the transpose of a Haar-random
    orthogonal matrix, the QR factor of a Gaussian matrix with the signs of diag(R) folded
    in: its rows are orthonormal and each is uniform on the sphere. Each row is then scaled
    by its own chi(dim) norm, the norm of a fresh Gaussian vector, so a row is distributed
    exactly as a Gaussian vector.
    """
    blocks = []
    for start in range(0, n_rows, dim):
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))  # Haar-distributed
        blocks.append(q.T[: n_rows - start])
    norms = torch.randn(n_rows, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return torch.cat(blocks) * norms.unsqueeze(1)


class RandomProjectionMechanism(FeatureMapMechanism):
    """A feature map built on ``nb_features`` random projections ``self.projection``
    (nb_features, head_dim), drawn once by ``orthogonal_gaussian`` and kept as a buffer.
    seed None draws from torch's global RNG (the engine seeds it per run, so each layer gets
    its own draw); an int draws from a private generator seeded with it."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        nb_features: int = 64,
        seed: int | None = None,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads, eps=eps, chunk_size=chunk_size)
        # above it, drawing the projections (a QR per block of head_dim rows) takes minutes
        check_int("nb_features", nb_features, 1, MAX_FEATURES)
        generator = random_generator(seed)
        self.nb_features, self.seed = nb_features, seed
        projection = orthogonal_gaussian(nb_features, head_dim, generator)
        self.register_buffer("projection", projection.to(torch.float32))

    def project(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """(x * scale) W^T in at least float32: (B, H, L, d) -> (B, H, L, nb_features)."""
        dtype = compute_dtype(x)
        return (x.to(dtype) * scale) @ self.projection.to(device=x.device, dtype=dtype).T

    @property
    def feature_dim(self) -> int:
        return self.nb_features


@MECHANISMS.register(
    "performer",
    aliases=("favor+", "favor", "performer-favor"),
    complexity="linear",
    family="random-features",
    reference=REFERENCE,
)
class PerformerAttention(RandomProjectionMechanism):
    """FAVOR+: phi(x) = exp(W x' - |x'|^2/2) / sqrt(M), x' = x d^(-1/4); M = nb_features = 64
    (SLAY 001, Table 9). Non-negative; unbiased for exp(q.k / sqrt(d)).

    Stabilisation, exact under causal masking:
    - queries: the logits of query i are shifted by their own maximum over the M features.
      A factor exp(-c_i) common to all features of query i multiplies its numerator and its
      denominator alike, so it cancels (it only rescales eps for that query); the |q'|^2/2
      term is such a constant too and drops out. Query features lie in (0, 1].
    - keys: no shift. A per-key factor would not cancel (it would reweight that key's
      contribution to every query), a shift shared by all keys (the original code's max over
      the whole sequence) would let later keys change earlier outputs, and a fixed constant
      would rescale eps for every query. The key logits are bounded anyway: w.k' - |k'|^2/2
      <= |w|^2/2 whatever k, about 16 to 28 at head_dim 32; a clamp at KEY_LOGIT_BOUND (40),
      elementwise and so causal, only acts where |w|^2/2 exceeds it (head_dim of about 64 or
      more) and the key lies close to that w. Very large keys underflow to 0 features; eps
      keeps the output finite (0) where every key of a query has.
    """

    def feature_map(self, x, is_query):
        scale = self.head_dim**-0.25
        logits = self.project(x, scale)  # w . x'
        if is_query:
            logits = logits - logits.amax(dim=-1, keepdim=True)
        else:
            sq_norm = (x.to(logits.dtype) * scale).square().sum(dim=-1, keepdim=True)
            logits = (logits - sq_norm / 2).clamp(max=KEY_LOGIT_BOUND)
        return torch.exp(logits) / math.sqrt(self.nb_features)


@MECHANISMS.register(
    "performer-relu",
    aliases=("relu-performer",),
    complexity="linear",
    family="random-features",
    reference=REFERENCE + " (ReLU kernel; the SLAY code's 'performer')",
)
class ReLUPerformerAttention(RandomProjectionMechanism):
    """phi(x) = relu(W x) / sqrt(M), M = nb_features = 64, the same orthogonal draws as
    performer. Non-negative; estimates the arc-cosine kernel, not softmax. The feature map is
    positively homogeneous, so scaling x (by d^(-1/4) or anything else) would only rescale
    eps; none is applied."""

    def feature_map(self, x, is_query):
        return F.relu(self.project(x)) / math.sqrt(self.nb_features)
