"""bigram: ``x_1 T(x_1) x_2 T(x_2) .. x_n T(x_n)`` for a fixed random successor table T.

A control task that needs no attention. T maps each of the tokens 0..vocab-1 to a successor
and is drawn once, at construction, from ``table_seed`` (so the train, validation and test
sets of one task share it; another seed is another table). The x_i are uniform and the
answers are the T(x_i). There is no SEP: each answer depends only on the token just read,
so the residual stream alone (embedding and MLP, a lookup table) solves it. It shows
that a mechanism does not break what needs no mixing between positions.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, Task, require_at_least, targets_at, teacher_forced


@dataclass(frozen=True)
class BigramParams:
    n: int = 32  # number of (x, T(x)) pairs
    vocab: int = 32  # number of tokens
    table_seed: int = 0  # seed of the successor table T

    def __post_init__(self):
        require_at_least("bigram", self, n=1, vocab=2, table_seed=0)


@TASKS.register(
    "bigram",
    category="Patterns",
    description="x T(x) pairs: a fixed random successor table (control, needs no attention)",
    control=True,  # the audit expects its current-token baseline to solve it
)
class Bigram(Task):
    Params = BigramParams
    difficulties = {"easy": {"vocab": 16}, "hard": {"vocab": 128}}
    # vocab: a larger successor table to learn. n only adds answers of the same kind;
    # larger, as more positions give a mechanism more to mix into the token just read.
    # table_seed has no direction (another seed is another table, no harder): undeclared.
    harder = {"n": "larger", "vocab": "larger"}
    length_param = "n"

    def __init__(self, **overrides) -> None:
        super().__init__(**overrides)
        # its own generator: the table depends on table_seed alone, never on the data seed
        table_rng = torch.Generator().manual_seed(self.params.table_seed)
        self.table = torch.randint(self.params.vocab, (self.params.vocab,), generator=table_rng)

    @property
    def vocab_size(self) -> int:
        return self.params.vocab

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n - 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        pairs = torch.stack([x, self.table.to(dev)[x]], dim=2)
        sequences = pairs.reshape(n, 2 * p.n)
        answer = torch.zeros_like(sequences, dtype=torch.bool)
        answer[:, 1::2] = True
        return teacher_forced(sequences, answer).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # every x_i position answers the successor of the token read there
        successors = self.table.to(inputs.device)[inputs[:, 0::2]]
        return targets_at(inputs, slice(0, None, 2), successors)
