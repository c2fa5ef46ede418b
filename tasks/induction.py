"""induction: ``.. A B .. A`` -> ``B``. One answer: the token that followed A before.

The prompt is n tokens over 0..vocab-1 (no special tokens): a token A occurs exactly
twice, at a uniform position p in [0, n-3] and as the last token; B = x_{p+1} differs from
A and is drawn like the other tokens, which are uniform over the vocab - 1 tokens other
than A (so they may repeat, and B may occur elsewhere too). The full sequence is the
prompt followed by B, so the inputs are the n prompt tokens and only the last position has
a target. This is the induction-head circuit of Olsson et al. (2022): a previous-token
head writes each token into the position after it, and at the last position a matching
head with query A attends to the position whose previous token is A and copies its token,
B (two layers). Without attention the model sees only A and its position: chance,
1/(vocab-1).
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class InductionParams:
    n: int = 64  # prompt length, the repeated token A included
    vocab: int = 64  # number of tokens

    def __post_init__(self):
        require_at_least("induction", self, n=3, vocab=2)


@TASKS.register(
    "induction",
    category="Reasoning",
    description="... A B ... A -> B: emit the token that followed the earlier A",
)
class Induction(Task):
    Params = InductionParams
    difficulties = {"easy": {"n": 32}, "hard": {"n": 256}}
    length_param = "n"

    @property
    def vocab_size(self) -> int:
        return self.params.vocab

    @property
    def seq_len(self) -> int:
        return self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        rows = torch.arange(n, device=dev)
        a = torch.randint(p.vocab, (n,), generator=generator, device=dev)
        # every other token uniform over the vocab - 1 tokens other than A
        shift = 1 + torch.randint(p.vocab - 1, (n, p.n), generator=generator, device=dev)
        x = (a.unsqueeze(1) + shift) % p.vocab
        first = torch.randint(p.n - 2, (n,), generator=generator, device=dev)
        x[rows, first] = a
        x[:, -1] = a
        b = x[rows, first + 1]
        return batch_from_parts([x], [b.unsqueeze(1)], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        query = inputs[:, n - 1 : n]
        # the earlier occurrence of the last token (the first one if garbage has several);
        # it sits in [0, n-3], so its successor is a prompt token before the query
        earlier = (inputs[:, : n - 2] == query).long().argmax(dim=1)
        return targets_at(inputs, n - 1, inputs.gather(1, (earlier + 1).unsqueeze(1)).squeeze(1))
