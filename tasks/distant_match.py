"""distant_match: ``x_1 .. x_n SEP y_1 a_1 .. y_m a_m``, a_j = YES if y_j == x_j else NO.

Dense layout (the default): after x and SEP, m = ``probes`` probe tokens y_j, each followed
by its verdict a_j (the answer): does y_j equal x_j, the token at the same index of x, about
n positions back? A fair coin per probe decides whether y_j is x_j or the token at another
index of x, drawn uniformly among the indices whose token differs from x_j, so the classes
are balanced and every probe is a token of x either way.

Why a NO probe comes from x (suite v3): drawn uniformly from the other tokens, a NO probe
occurred in x less often than a YES probe (which occurs at least once, at its own index),
and a table on how often the probe has occurred so far scored 0.59 against chance 0.50 (the
audit's counts family). Drawn from x at a random index, a NO probe is a token picked by
occurrence, as a YES probe is.
Data tokens are 0..vocab-1, then SEP = ``vocab``, NO = ``vocab + 1``, YES = ``vocab + 2``.

``probes=0`` is suite v1's one-answer layout ``x SEP a``, a = YES if x_n == x_1 (x_n set
equal to x_1 or to another token by a coin). With one label per sequence seeds either
solved it or sat at chance (softmax 0.67 +- 0.29 under quick); and there, in NO examples
the last token was drawn afresh, so a YES example's x_1 occurred once more in x: counting it
scored 0.58. Here x is uniform and only the probes vary.

Known solution: at y_j a head attends to position j of x by position (a learned offset of
about n), brings x_j in, and the model compares it with the current token: a matching head
whose score depends on the token pair, or a previous-token-style head followed by an
equality readout. Without attention the model at a probe sees only y_j and its position: at
chance (1/2).
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    ShortcutRule,
    Task,
    answered_pairs,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class DistantMatchParams:
    n: int = 64  # length of x
    vocab: int = 16  # number of data tokens
    probes: int = 16  # probes y_j against x_j, at most n (0: suite v1's one-answer layout)

    def __post_init__(self):
        require_at_least("distant_match", self, n=2, vocab=2, probes=0)
        if self.probes > self.n:
            raise ValueError(
                f"distant_match needs probes <= n, got probes={self.probes}, n={self.n}"
            )


@TASKS.register(
    "distant_match",
    category="Long-Range",
    description="x SEP y_1 a_1 .. y_m a_m: does each probe y_j equal x_j, n tokens back?",
)
class DistantMatch(Task):
    Params = DistantMatchParams
    difficulties = {"easy": {"n": 32}, "hard": {"n": 128}}  # hard: the default until suite v2
    # n: x_j sits about n back. vocab: smaller is harder, as with fewer values a NO probe
    # is more often a token that occurs near index j too, so only the exact index tells
    # (and in v1's layout a NO token was often absent from x). probes: each adds an answer of the
    # same kind, so fewer is harder (one label per sequence was suite v1's failure);
    # 0 is suite v1's one-answer layout, at that hard end.
    harder = {"n": "larger", "vocab": "smaller", "probes": "smaller"}
    # Recall distance: x_j is n + 1 positions back; mechanisms whose state decays lose it
    # with distance, attention does not (Zoology, Arora et al. 2023, Sec. 3; Based, Arora
    # et al. 2024, Sec. 3). At n 64 and 128 linear attention and cosFormer sat near 0.6
    # where softmax reached 1.00 (docs/TASKS.md).
    ladder = Ladder(
        axis=("n",),
        source="Zoology (Arora et al. 2023), Sec. 3; Based (Arora et al. 2024), Sec. 3",
        baseline={"n": 32},
        steps=({"n": 64}, {"n": 128}),
    )
    length_param = "n"

    @property
    def no(self) -> int:
        return self.params.vocab + 1

    @property
    def yes(self) -> int:
        return self.params.vocab + 2

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.vocab, "NO": self.no, "YES": self.yes}

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 3

    @property
    def seq_len(self) -> int:
        return self.params.n + 2 * self.params.probes if self.params.probes else self.params.n + 1

    def recall_distance(self) -> int:
        """y_j (input position n + 2j - 1) against x_j at j - 1: n + 1 at j = 1 (one answer:
        SEP at n against x_1 at 0, n)."""
        return self.params.n + 1 if self.params.probes else self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        m = p.probes or 1  # suite v1: one comparison, of x_n with x_1
        same = torch.rand(n, m, generator=generator, device=dev) < 0.5
        compared = x[:, :m]
        if p.probes:
            other = self._other_token_of_x(x, m, generator)
        else:  # suite v1: a uniform token other than x_1, shifted by 1..vocab-1 on the cycle
            shift = 1 + torch.randint(p.vocab - 1, (n, m), generator=generator, device=dev)
            other = (compared + shift) % p.vocab
        probe = torch.where(same, compared, other)
        verdict = torch.where(same, self.yes, self.no)
        if not p.probes:
            x[:, -1:] = probe
            return batch_from_parts([x, self.sep], [verdict], device)
        pairs, is_verdict = answered_pairs(probe, verdict)
        return batch_from_parts([x, self.sep], [pairs], device, answer_mask=is_verdict)

    def _other_token_of_x(self, x: torch.Tensor, m: int, generator: torch.Generator):
        """(n, m): for each j < m, x at an index drawn uniformly among those whose token
        differs from x_j (a uniform other token where every token of x is x_j)."""
        n, length = x.shape
        keys = torch.rand(n, m, length, generator=generator, device=x.device)
        differs = x.unsqueeze(1) != x[:, :m].unsqueeze(2)  # (n, m, length)
        index = keys.masked_fill(~differs, 2.0).argmin(dim=2)
        shift = 1 + torch.randint(
            self.params.vocab - 1, (n, m), generator=generator, device=x.device
        )
        uniform = (x[:, :m] + shift) % self.params.vocab
        return torch.where(differs.any(dim=2), x.gather(1, index), uniform)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        p = self.params
        if not p.probes:
            match = inputs[:, 0] == inputs[:, p.n - 1]
            return targets_at(inputs, p.n, torch.where(match, self.yes, self.no))  # at SEP
        probe_pos = torch.arange(p.n + 1, p.n + 2 * p.probes, 2, device=inputs.device)
        match = inputs[:, probe_pos] == inputs[:, : p.probes]
        return targets_at(inputs, probe_pos, torch.where(match, self.yes, self.no))

    def shortcut_rules(self):
        p = self.params
        if not p.probes:
            return []

        def anywhere(inputs: torch.Tensor) -> torch.Tensor:
            seen = (inputs.unsqueeze(2) == inputs[:, : p.n].unsqueeze(1)).any(dim=2)
            return torch.where(seen, self.yes, self.no)

        description = "YES if the probe occurs anywhere in x (not at its own index)"
        return [ShortcutRule("occurs in x", description, anywhere)]
