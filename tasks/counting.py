"""counting: ``x_1 .. x_n q SEP c``. The answer is the number of times q occurs in x.

Data tokens are 0..vocab-1, SEP is ``vocab`` and the number tokens ``vocab + 1 + c`` for the
counts c = 0..n come last. The count is drawn uniformly from 0..n (q is placed at c random
positions, the rest are tokens other than q), so the label is balanced and every number
token occurs. At SEP the model must bring q forward from the position before, attend to the
data tokens equal to q and turn that attention into a count: softmax averages, so a sink
(a position every query also attends to, with a fixed score) makes the weight left on the
sink 1 / (1 + c), which an MLP can read off.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, SepTask, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class CountingParams:
    n: int = 32  # length of x
    vocab: int = 16  # number of data tokens

    def __post_init__(self):
        require_at_least("counting", self, n=1, vocab=2)


@TASKS.register(
    "counting",
    category="Arithmetic",
    description="x q SEP c: count the occurrences of the query token q in x",
)
class Counting(SepTask):
    Params = CountingParams
    difficulties = {"easy": {"n": 16}, "hard": {"n": 64}}
    length_param = "n"

    def number(self, count: int) -> int:
        """The token of the count ``count`` (0..n)."""
        return self.params.vocab + 1 + count

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1 + self.params.n + 1

    @property
    def seq_len(self) -> int:
        return self.params.n + 2

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        q = torch.randint(p.vocab, (n, 1), generator=generator, device=dev)
        count = torch.randint(p.n + 1, (n, 1), generator=generator, device=dev)
        # a random rank per position: the c positions of lowest rank hold q
        rank = torch.rand(n, p.n, generator=generator, device=dev).argsort(dim=1).argsort(dim=1)
        # q + 1..vocab-1 mod vocab is uniform over the tokens other than q
        shift = torch.randint(1, p.vocab, (n, p.n), generator=generator, device=dev)
        x = torch.where(rank < count, q, (q + shift) % p.vocab)
        return batch_from_parts([x, q, self.sep], [self.number(0) + count], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        count = (inputs[:, :n] == inputs[:, n : n + 1]).sum(dim=1)
        return targets_at(inputs, n + 1, self.number(0) + count)  # SEP answers the count

    def token_name(self, token: int) -> str:
        if token > self.sep:
            return f"#{token - self.number(0)}"
        return super().token_name(token)
