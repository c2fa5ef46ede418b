"""sort: ``x_1 .. x_n SEP sorted(x)``. The answer is x in increasing order.

x holds n distinct data tokens (drawn without replacement), so the answer is a strictly
increasing run: after SEP the model emits min(x), and after each answer y it emits the
smallest token of x larger than y. Data tokens are 0..vocab-1 and SEP is ``vocab``. Every
answer depends only on x, which the causal model has read in full before SEP. One
attention head solves it: the query is the current token y, the keys score the prompt
tokens by value (high for the smallest value above y, low for values <= y), and the value
copies the winner. Without attention the model sees only y and its position, which do not
determine the next token.

The vocabulary is 8 times n at every preset, so that consecutive answers are about 8 apart:
in suite v1 (vocab 2n) the next answer was y + 1 half the time, and y and the position alone
scored 0.50.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, Ladder, SepTask, batch_from_parts, targets_at


@dataclass(frozen=True)
class SortParams:
    n: int = 16  # length of x
    vocab: int = 128  # number of data tokens; x is n distinct ones

    def __post_init__(self):
        if self.n < 1 or self.vocab < 2 or self.vocab < self.n:
            raise ValueError(
                f"sort needs n >= 1 and vocab >= max(n, 2) (x has n distinct tokens), "
                f"got n={self.n}, vocab={self.vocab}"
            )


@TASKS.register("sort", category="Basic", description="x SEP sorted(x): sort distinct tokens")
class Sort(SepTask):
    Params = SortParams
    difficulties = {"easy": {"n": 8, "vocab": 64}, "hard": {"n": 32, "vocab": 256}}
    # vocab: a smaller one packs x densely, so the next answer is often y + 1 (the module
    # docstring: vocab 2n let y and the position alone score 0.50)
    harder = {"n": "larger", "vocab": "larger"}
    # Longer sequences to sort, each answer a comparison over all of x: a fixed-size state
    # must hold x whole, as for a copy (Jelassi et al. 2024). Linear attention sorted 48
    # over 384 at quick's grown lr (docs/TASKS.md), so the ladder starts at 16 over 512.
    ladder = Ladder(
        axis=("n",),
        source="Jelassi et al. 2024, Repeat After Me (arXiv 2402.01032); measured here",
        baseline={"n": 16, "vocab": 512},
        steps=({"n": 32}, {"n": 64}),
    )
    length_param = "n"
    computes = {
        "elimination": "the next answer is the smallest token of x not yet emitted: sorting "
        "is that elimination"
    }

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        # the first n columns of a random permutation: n distinct tokens in random order
        x = torch.rand(n, p.vocab, generator=generator, device=dev).argsort(dim=1)[:, : p.n]
        return batch_from_parts([x, self.sep], [x.sort(dim=1).values], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        # position n + j answers sorted(x)_j
        return targets_at(inputs, slice(n, None), inputs[:, :n].sort(dim=1).values)
