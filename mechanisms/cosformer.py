"""cosFormer (Qin et al. 2022): ReLU features re-weighted by position.

With 0-based positions i and a horizon M:
    phi(x_i) = [relu(x_i) cos(pi i / (2M)), relu(x_i) sin(pi i / (2M))]      (2d features)
    phi(q_i) . phi(k_j) = (relu(q_i) . relu(k_j)) cos(pi (i - j) / (2M)),
by cos a cos b + sin a sin b = cos(a - b): a locality bias that decays with the distance
i - j, kernel-normalised on the shared linear core (eps 1e-6).

The paper takes M as the sequence length. By default (``horizon`` None) M is the longest
sequence the model is built for (``set_max_len``: its training and evaluation lengths), so
the re-weighting spans the task as published while a position's features stay independent
of how long the current sequence is: a prefix gets the same outputs whether or not more
tokens follow, as exact causal generation needs. Used outside a model, M is the length of
the call. An explicit ``horizon`` fixes M. Positions run 0 .. L-1 and the mechanism refuses
sequences longer than M with a ValueError: beyond M the cosine turns negative for distant
pairs (and wraps around after 4M), which would break the non-negativity the unguarded core
relies on. Within the horizon every feature is >= 0 (relu, and cos, sin >= 0 on
[0, pi/2)), and so is every score.

Recurrent form: the features of position t need t and M, not the rest of the sequence, so
with a fixed M (``horizon``, or the model's ``set_max_len``) it decodes with the shared
feature-map state (S, z) and the position t carried beside it. Without one M is the length
of each call, unknown while generating: then there is no recurrent form (``recurrent`` is
False).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from synthbench.core.linear_attention import compute_dtype
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism
from synthbench.core.params import check_int


@MECHANISMS.register(
    "cosformer",
    aliases=("cosformer-relu",),
    complexity="linear",
    family="feature-map",
    reference="Qin et al. 2022, cosFormer: Rethinking Softmax in Attention",
)
class CosformerAttention(FeatureMapMechanism):
    """phi(x_i) = [relu(x_i) cos(pi i / 2M), relu(x_i) sin(pi i / 2M)], M = ``horizon``, by
    default the model's maximum length; sequences longer than M are refused."""

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        horizon: int | None = None,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads, eps=eps, chunk_size=chunk_size)
        if horizon is not None:  # None: the model's max length, known later
            check_int("horizon", horizon, 1)
        self.horizon = horizon
        self.max_len: int | None = None

    def set_max_len(self, max_len: int) -> None:
        """The model's longest sequence (Model calls it): M, unless ``horizon`` is given."""
        self.max_len = max_len

    def feature_map(self, x, is_query):
        length = x.shape[-2]
        horizon = self.horizon or self.max_len or length
        if length > horizon:
            name = "horizon" if self.horizon else "the model's max length"
            raise ValueError(
                f"cosformer: sequence length {length} exceeds {name}={horizon}; "
                f"build it with horizon >= the longest sequence"
            )
        dtype = compute_dtype(x)
        angle = torch.arange(length, device=x.device, dtype=dtype) * (math.pi / (2 * horizon))
        r = F.relu(x.to(dtype))
        return torch.cat([r * angle.cos().unsqueeze(-1), r * angle.sin().unsqueeze(-1)], dim=-1)

    @property
    def feature_dim(self) -> int:
        return 2 * self.head_dim

    # -- recurrent form: the position rides in the state ---------------------------------

    @property
    def recurrent(self) -> bool:  # type: ignore[override]
        """Only with a fixed horizon (see the module docstring)."""
        return bool(self.horizon or self.max_len)

    def _fixed_horizon(self) -> int:
        horizon = self.horizon or self.max_len
        if not horizon:
            raise ValueError(
                "cosformer: decoding needs a fixed horizon: build it with horizon=M or tell it "
                "the longest sequence (set_max_len)"
            )
        return horizon

    def initial_state(self, batch, device, dtype):
        """(S, z, position 0)."""
        self._fixed_horizon()
        return (*super().initial_state(batch, device, dtype), 0)

    def _features_at(self, x: torch.Tensor, position: int, horizon: int) -> torch.Tensor:
        """(B, H, d) at ``position`` -> (B, H, 1, 2d): ``feature_map``'s row of that position."""
        dtype = compute_dtype(x)
        angle = torch.full((1,), position, device=x.device, dtype=dtype)
        angle = angle * (math.pi / (2 * horizon))
        r = F.relu(x.to(dtype)).unsqueeze(-2)
        return torch.cat([r * angle.cos().unsqueeze(-1), r * angle.sin().unsqueeze(-1)], dim=-1)

    def step(self, state, q, k, v):
        s, z, position = state
        horizon = self._fixed_horizon()
        if position >= horizon:
            name = "horizon" if self.horizon else "the model's max length"
            raise ValueError(
                f"cosformer: sequence length {position + 1} exceeds {name}={horizon}; "
                f"build it with horizon >= the longest sequence"
            )
        phi_q, phi_k = (self._features_at(x, position, horizon) for x in (q, k))
        out, (s, z) = self.step_features((s, z), phi_q, phi_k, v)
        return out, (s, z, position + 1)
