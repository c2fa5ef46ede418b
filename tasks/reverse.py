"""reverse: ``x_1 .. x_n SEP x_n .. x_1``. The answer is x backwards.

Data tokens are 0..vocab-1 (with repetition) and SEP is ``vocab``. The model at input
position n + j (SEP for j = 0, then the answers) emits x_{n-j}, which sits at position
n - 1 - j: the offset back grows by two per step, so a fixed-offset (copy) head does not
do; one attention head whose query at position i selects the key of position 2n - 1 - i
(absolute positions, or the distance from SEP mirrored) solves it. Without attention the
model sees only the current token and its position, which do not determine x_{n-j}.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    batch_from_parts,
    require_at_least,
    targets_at,
)

from .copy import Copy, CopyParams


@dataclass(frozen=True)
class ReverseParams(CopyParams):
    # long, as long_copy's: at copy's 32 softmax, linear attention and cosFormer all reverse
    # x (docs/TASKS.md, "Why n 128")
    n: int = 128  # length of x

    def __post_init__(self):
        require_at_least("reverse", self, n=1, vocab=2)  # own message: it names this task


@TASKS.register("reverse", category="Basic", description="x SEP reversed(x): emit x backwards")
class Reverse(Copy):
    """Copy's tokens and layout, x as long as long_copy's; the answer is x backwards."""

    Params = ReverseParams
    difficulties = {"easy": {"n": 32}, "hard": {"n": 256}}
    harder = {"n": "larger", "vocab": "larger"}  # reach back up to 2n; more values
    # Copy length against state size (Jelassi et al. 2024, Sec. 2-3), mirrored: at 32
    # tokens all three mechanisms measured reversed x, at 96 cosFormer fell to 0.95 and at
    # 128 to 0.68 (docs/TASKS.md, "Why n 128").
    ladder = Ladder(
        axis=("n",),
        source="Jelassi et al. 2024, Repeat After Me (arXiv 2402.01032), Sec. 2-3",
        baseline={"n": 64},
        steps=({"n": 96}, {"n": 128}),
    )

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p = self.params
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=generator.device)
        return batch_from_parts([x, self.sep], [x.flip(1)], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        # position n + j answers x at position n - 1 - j
        return targets_at(inputs, slice(n, None), inputs[:, :n].flip(1))
