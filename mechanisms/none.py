"""The floor: no token mixing at all.

Its output is zero, so with the model's residual stream a position sees only its own token
and position. A task it solves needs no attention; on an attention-critical task it shows
the chance level a model reaches without mixing.
"""

import torch

from synthbench.core.mechanism import MECHANISMS, Mechanism


@MECHANISMS.register(
    "none",
    aliases=("no-mixing",),
    complexity="linear",
    family="floor",
    reference="control: no token mixing",
)
class NoMixing(Mechanism):
    has_scores = False  # nothing attends to anything

    def forward(self, q, k, v, causal: bool = True):
        return torch.zeros_like(v)

    def state_size(self, seq_len: int) -> int:
        return 0
