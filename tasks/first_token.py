"""first_token: ``x_1 .. x_n SEP x_1``. One answer: the first token of the sequence.

Data tokens are 0..vocab-1 and SEP is ``vocab``. The only answer is predicted at SEP
(input position n), which must recall x_1 from position 0, n positions back. One attention
head whose SEP query selects the key of position 0 (absolute positions, or position 0 as
the one key with no predecessor) copies it. Without attention the model at SEP sees only
SEP and its position, which say nothing about x_1.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    SepTask,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class FirstTokenParams:
    n: int = 64  # length of x
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        require_at_least("first_token", self, n=1, vocab=2)


@TASKS.register("first_token", category="Memory", description="x SEP x_1: recall the first token")
class FirstToken(SepTask):
    Params = FirstTokenParams
    difficulties = {"easy": {"n": 16}, "hard": {"n": 256}}
    harder = {"n": "larger", "vocab": "larger"}  # x_1 further back; more values
    # Recall distance: x_1 is n positions back; a decaying state forgets it (Zoology, Arora
    # et al. 2023, Sec. 3; Based, Arora et al. 2024, Sec. 3). Linear attention and
    # cosFormer recalled it at 256 at quick's grown lr (docs/TASKS.md).
    ladder = Ladder(
        axis=("n",),
        source="Zoology (Arora et al. 2023), Sec. 3; Based (Arora et al. 2024), Sec. 3",
        baseline={"n": 128},
        steps=({"n": 256}, {"n": 512}),
    )
    length_param = "n"
    computes = {"fixed positions": "the answer is the token at position 0, by definition"}

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def recall_distance(self) -> int:
        """SEP (input position n) against x_1 at position 0: n."""
        return self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p = self.params
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=generator.device)
        return batch_from_parts([x, self.sep], [x[:, :1]], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        return targets_at(inputs, self.params.n, inputs[:, 0])  # SEP answers the first token
