"""compression: run-length dedup, ``x`` made of k runs, then SEP and the k run values.

Layout ``x_1 .. x_n SEP r_1 .. r_k``: a prompt of n tokens made of k runs of k distinct data
tokens r_1..r_k, the run lengths a random composition of n into k positive parts (k-1
distinct cut points among the n-1 gaps); then SEP and r_1..r_k (the answers). Data tokens
are 0..vocab-1, SEP is ``vocab``.

Known solution: r_j starts the j-th run, at a position that varies per example. Since the
run values are distinct, r_j is the token that follows the run of r_{j-1}: a previous-token
head writes each token's predecessor into it, and at the answer position holding r_{j-1} a
matching head attends to the position whose predecessor is r_{j-1} but whose own token
differs (the run boundary) and copies it; at SEP it attends to position 0 (two layers).
Without attention an answer position sees only r_{j-1} and its own position.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, SepTask, batch_from_parts, targets_at

from .selective_copy import nth_marked


@dataclass(frozen=True)
class CompressionParams:
    # 16 runs over 64 tokens, where linear attention and cosFormer fall behind at the quick
    # model's width (quick, seeds 0-2: softmax 0.99, linear 0.60; at 8 runs over 32 tokens
    # all three reach 0.97)
    k: int = 16  # runs in the prompt (answers)
    n: int = 64  # prompt length
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        if not 1 <= self.k <= min(self.n, self.vocab) or self.vocab < 2:
            raise ValueError(
                f"compression needs 1 <= k <= n, k <= vocab and vocab >= 2, got "
                f"k={self.k}, n={self.n}, vocab={self.vocab}"
            )


@TASKS.register(
    "compression",
    category="Robustness",
    description="run-length dedup: emit the value of each run of repeated tokens",
)
class Compression(SepTask):
    Params = CompressionParams
    difficulties = {
        "easy": {"k": 8, "n": 32, "vocab": 16},
        "hard": {"k": 32, "n": 128, "vocab": 64},
    }
    # k: more runs to carry (at k = n every run is one token and it is copy); n: longer
    # runs, more positions that share a run's predecessor; vocab: more values
    harder = {"k": "larger", "n": "larger", "vocab": "larger"}
    length_param = "n"

    @property
    def seq_len(self) -> int:
        return self.params.n + self.params.k

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        values = torch.rand(n, p.vocab, generator=generator, device=dev).argsort(dim=1)[:, : p.k]
        gaps = torch.rand(n, p.n - 1, generator=generator, device=dev).argsort(dim=1)
        starts = torch.zeros(n, p.n, dtype=torch.long, device=dev)
        starts.scatter_(1, gaps[:, : p.k - 1] + 1, 1)  # a new run starts after each cut
        prompt = values.gather(1, starts.cumsum(dim=1))
        return batch_from_parts([prompt, self.sep], [values], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        p = self.params
        prompt = inputs[:, : p.n]
        starts = torch.ones_like(prompt, dtype=torch.bool)
        starts[:, 1:] = prompt[:, 1:] != prompt[:, :-1]
        # on garbage input surplus runs are dropped and a missing answer is 0
        answers = nth_marked(prompt, starts, p.k, 0)
        return targets_at(inputs, slice(p.n, p.n + p.k), answers)
