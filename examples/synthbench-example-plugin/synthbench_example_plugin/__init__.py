"""An example synthbench plugin: linear attention with a ReLU feature map.

synthbench finds this class through the entry point declared in ``pyproject.toml``::

    [project.entry-points."synthbench.mechanisms"]
    relu-linear = "synthbench_example_plugin:ReLULinearAttention"

and registers it under the entry point's name, ``relu-linear``, with the metadata in
``registry_metadata``. No decorator is needed: the entry point does the registering.
(An entry point may instead name a module whose ``@MECHANISMS.register`` decorators
register its classes on import; an object already registered that way is not added again.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from synthbench import FeatureMapMechanism

__all__ = ["ReLULinearAttention"]
__version__ = "0.1.0"


class ReLULinearAttention(FeatureMapMechanism):
    """phi(x) = relu(x) + offset on the shared causal linear-attention core.

    A feature-map mechanism only defines ``feature_map``; the normalised, chunked causal
    core (``sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)``) comes from
    :class:`synthbench.FeatureMapMechanism`. Plain ReLU features can all be zero, which
    leaves the denominator at zero; the small positive ``offset`` keeps every feature, and
    so every denominator, strictly positive. Its default, 1e-2, makes the smallest
    possible score (``features * offset**2``) stay well above the core's ``eps`` (1e-6),
    so ``eps`` never distorts the normalisation.

    Every constructor argument after ``(head_dim, n_heads)`` is a mechanism parameter and
    needs a default; synthbench records its value in each result row (``mechanism_params``).
    """

    # Required by the registry for every mechanism: complexity is "linear" or "quadratic".
    registry_metadata = {
        "complexity": "linear",
        "family": "feature-map",
        "reference": "Katharopoulos et al. 2020, Transformers are RNNs (ReLU feature map)",
    }

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        offset: float = 1e-2,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(head_dim, n_heads, eps=eps, chunk_size=chunk_size)
        if offset <= 0:
            raise ValueError(f"offset must be > 0, got {offset}")
        self.offset = offset

    def feature_map(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        # (batch, heads, length, head_dim) -> non-negative features of the same shape.
        return F.relu(x) + self.offset

    @property
    def feature_dim(self) -> int:
        # features per position; it sizes the recurrent state (synthbench list mechs)
        return self.head_dim
