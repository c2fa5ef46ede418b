"""retrieval: find the marked value in a haystack (needle in a haystack).

Layout ``x_0 .. x_{n-1} MARKER v``: a haystack of n data tokens in which position p (uniform
in 0..n-2) holds MARKER, so the value v = x_{p+1} follows it; then MARKER again as the query
and v as the answer. MARKER appears nowhere else. The value is drawn like the rest of the
haystack, so nothing but its place tells it apart. Data tokens are 0..vocab-1, MARKER is
``vocab``.

Known solution: an induction head. A previous-token head writes "my previous token is
MARKER" into position p+1; at the final MARKER a matching head attends there and copies v
(two layers). Without attention the final MARKER carries no information about v.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class RetrievalParams:
    n: int = 64  # haystack length, marker and value included
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        require_at_least("retrieval", self, n=2, vocab=2)


@TASKS.register(
    "retrieval",
    category="Memory",
    description="emit the value that followed the single marker in a haystack",
)
class Retrieval(Task):
    Params = RetrievalParams
    difficulties = {"easy": {"n": 32}, "hard": {"n": 256}}
    length_param = "n"

    @property
    def marker(self) -> int:
        return self.params.vocab

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"MARKER": self.marker}

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        haystack = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        where = torch.randint(p.n - 1, (n, 1), generator=generator, device=dev)
        haystack.scatter_(1, where, self.marker)
        value = haystack.gather(1, where + 1)
        return batch_from_parts([haystack, self.marker], [value], device)  # MARKER: the query

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        # The first MARKER among positions 0..n-2; on garbage input without one, argmax
        # returns 0 and the answer is x_1.
        where = (inputs[:, : n - 1] == self.marker).long().argmax(dim=1, keepdim=True)
        return targets_at(inputs, n, inputs.gather(1, where + 1).squeeze(1))
