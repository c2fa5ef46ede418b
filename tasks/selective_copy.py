"""selective_copy: copy the data tokens scattered among blanks, in order.

Layout ``p_1 .. p_length SEP x_1 .. x_k``: a prompt of ``length`` positions of which k +
``tail``, chosen at random, hold the data tokens x_1..x_{k+tail} in order and the rest BLANK;
then SEP and the first k of them, x_1..x_k (the answers). Data tokens are 0..vocab-1, BLANK
is ``vocab``, SEP is ``vocab + 1``.

Why the tail (suite v3): when every data token is copied, the next answer is one of the data
tokens not yet emitted, and guessing the most frequent of those (a bag of counts, no order:
the audit's elimination family) scored 0.42 against chance 0.06; the last answer was always
the one token left. With tail tokens after the copied ones the bag never runs out of wrong
candidates. ``tail=0`` is suite v2's layout, which the audit flags.

Known solution: x_j sits at a position that varies per example, so no fixed offset works. A
first head at each data token finds the previous non-blank token (skipping blanks) and writes
it there; at the answer position holding x_{j-1} (SEP for j = 1) an induction head then
attends to the data token whose previous non-blank token is x_{j-1} and copies it. Repeated
data tokens make that match ambiguous; a counting head (rank of a data token among the data
tokens, against the number of answers emitted so far) resolves it.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    Task,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class SelectiveCopyParams:
    length: int = 48  # prompt length, blanks included
    k: int = 8  # data tokens to copy (the answers)
    vocab: int = 32  # number of data tokens
    tail: int = 12  # data tokens after the k copied ones, not copied (0: suite v2's layout)

    def __post_init__(self):
        require_at_least("selective_copy", self, tail=0)
        if not 1 <= self.k <= self.length - self.tail or self.vocab < 2:
            raise ValueError(
                f"selective_copy needs 1 <= k <= length - tail and vocab >= 2, got "
                f"k={self.k}, tail={self.tail}, length={self.length}, vocab={self.vocab}"
            )


def nth_marked(tokens: torch.Tensor, marked: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    """(n, k): the first k tokens where ``marked`` holds, in order; ``fill`` where a row has
    fewer."""
    rank = marked.long().cumsum(dim=1) - 1
    slot = torch.where(marked, rank.clamp(max=k), k)  # unmarked and surplus go to column k
    out = torch.full((tokens.shape[0], k + 1), fill, dtype=tokens.dtype, device=tokens.device)
    return out.scatter(1, slot, tokens)[:, :k]


@TASKS.register(
    "selective_copy",
    category="Memory",
    description="copy the data tokens scattered among blanks, in order",
)
class SelectiveCopy(Task):
    Params = SelectiveCopyParams
    difficulties = {
        "easy": {"length": 32, "k": 4, "tail": 8},
        "hard": {"length": 256, "k": 16, "tail": 16},
    }
    # length: more blanks to skip; k: more tokens to carry in order (at k = length no
    # blank is left and it is copy); vocab: more values, as noisy_copy measured; tail:
    # more data tokens that are not answers (a weaker elimination rule)
    harder = {"length": "larger", "k": "larger", "vocab": "larger", "tail": "larger"}
    # Selectivity (Mamba's selective copying, Gu & Dao 2023, Sec. 3.1): the same 8 tokens
    # among more blanks, at places that vary per example, which a time-invariant state
    # cannot select. The tail of 24 keeps every answer 32 positions from its token
    # (``recall_distance``), beyond the suite's windows.
    ladder = Ladder(
        axis=("length",),
        source="Gu & Dao 2023 (Mamba), Sec. 3.1, selective copying",
        baseline={"length": 64, "tail": 24},
        steps=({"length": 128}, {"length": 192}),
    )
    length_param = "length"

    @property
    def blank(self) -> int:
        return self.params.vocab

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"BLANK": self.blank, "SEP": self.params.vocab + 1}

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 2

    @property
    def seq_len(self) -> int:
        return self.params.length + self.params.k

    def recall_distance(self) -> int:
        """Answer x_j (input position length + j - 1) against its place in the prompt, which
        at least k - j copied and tail data tokens follow: k + tail."""
        return self.params.k + self.params.tail

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        data = torch.randint(p.vocab, (n, p.k + p.tail), generator=generator, device=dev)
        slots = torch.rand(n, p.length, generator=generator, device=dev).argsort(dim=1)
        filled = torch.zeros(n, p.length, dtype=torch.bool, device=dev)
        filled.scatter_(1, slots[:, : p.k + p.tail], True)
        rank = (filled.long().cumsum(dim=1) - 1).clamp(min=0)  # the j-th filled slot gets x_j
        prompt = torch.where(filled, data.gather(1, rank), self.blank)
        return batch_from_parts([prompt, self.sep], [data[:, : p.k]], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        p = self.params
        prompt = inputs[:, : p.length]
        # data tokens are the ids below vocab; on garbage input a missing answer is 0
        answers = nth_marked(prompt, prompt < p.vocab, p.k, 0)
        return targets_at(inputs, slice(p.length, p.length + p.k), answers)
