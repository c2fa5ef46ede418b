"""A local-file synthbench plugin: softmax attention with a temperature.

No packaging needed: pass the file on the command line and its decorators register what
it defines before the run starts::

    synthbench run --plugin examples/synthbench-example-plugin/local_plugin.py \
        --mech scaled-softmax --task copy --protocol smoke
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from synthbench import MECHANISMS, Mechanism


# The decorator registers the class under "scaled-softmax". complexity, family and
# reference are required metadata; complexity must be "linear" or "quadratic". A name
# (or alias) that is already taken, such as "softmax", is refused with an error that
# names both the plugin file and the existing entry.
@MECHANISMS.register(
    "scaled-softmax",
    complexity="quadratic",
    family="softmax",
    reference="Hinton et al. 2015, Distilling the Knowledge in a Neural Network (temperature)",
)
class ScaledSoftmaxAttention(Mechanism):
    """softmax(q k^T / (temperature * sqrt(d))) v through torch's fused SDPA.

    ``temperature`` > 1 flattens the attention distribution, < 1 sharpens it; 1 is the
    standard softmax baseline. Like every constructor parameter after
    ``(head_dim, n_heads)`` it has a default and is stored with each result row.
    """

    def __init__(self, head_dim: int, n_heads: int, temperature: float = 2.0) -> None:
        super().__init__(head_dim, n_heads)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
    ) -> torch.Tensor:
        scale = 1.0 / (self.temperature * math.sqrt(self.head_dim))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
