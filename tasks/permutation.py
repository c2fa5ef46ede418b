"""permutation: the word problem of a permutation group, dense: ``g_1 .. g_n``, and at the
position of g_i the answer p_i = g_1 ∘ g_2 ∘ .. ∘ g_i, the running product.

Composition order: permutations of {0..k-1} in one-line notation (a tuple t maps x to t[x]),
``(a ∘ b)(x) = a(b(x))``, and p_i = p_(i-1) ∘ g_i: the newest element acts first. Elements
are numbered in ``itertools.permutations`` order (lexicographic, so 0 is the identity),
filtered to the even ones for A5; Z5 numbers the powers c^0 .. c^4 of the 5-cycle
c = (1 2 3 4 0). Tokens are the element numbers; an answer is an element too, with the same
ids.

Layout (the State category's, shared with mod_counting): the answers are labels of the
positions they stand at, never tokens of the stream (``Task.answers_in_stream`` False). Fed
back (``g_1 p_1 g_2 p_2 ..``), p_i would be one table lookup from p_(i-1) and g_i: a chain
of lookups, the chain-of-thought escape that Merrill, Petty & Sabharwal (2024, "The illusion
of state in state-space models") rule out. Here the model must carry the state itself.

Known solution: a recurrence that holds the state (a k x k permutation matrix) and
multiplies by each input; a transformer of fixed depth cannot for S5 and A5 at every length
(NC1-complete word problems), and can for the solvable S3 and the abelian control Z5 only
through the shortcuts of Liu et al. (2023). An attention-only model has no such solution:
this task sits outside the default suite (docs/TASKS.md, "State tracking").
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, ShortcutRule, Task, require_at_least

GROUPS = ("S3", "S5", "A5", "Z5")
ABELIAN = ("Z5",)


def is_even(perm: tuple[int, ...]) -> bool:
    inversions = sum(a > b for a, b in itertools.combinations(perm, 2))
    return inversions % 2 == 0


@functools.cache
def elements(group: str) -> tuple[tuple[int, ...], ...]:
    """The group's permutations, in their token order (see the module docstring)."""
    if group == "Z5":
        powers, current = [], tuple(range(5))
        for _ in range(5):
            powers.append(current)
            current = tuple((x + 1) % 5 for x in current)  # c ∘ current, c = (1 2 3 4 0)
        return tuple(powers)
    degree = int(group[1:])
    perms = itertools.permutations(range(degree))
    return tuple(p for p in perms if group[0] == "S" or is_even(p))


@functools.cache
def _table(group: str) -> torch.Tensor:
    members = elements(group)
    index = {p: i for i, p in enumerate(members)}
    rows = [[index[tuple(a[x] for x in b)] for b in members] for a in members]
    return torch.tensor(rows, dtype=torch.long)


def multiplication_table(group: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """(|G|, |G|): ``table[a, b]`` is the number of a ∘ b (built once per group)."""
    return _table(group).to(device)


def running_products(words: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """(n, L) prefix products of the (n, L) words: a parallel scan (Hillis and Steele) in
    log2(L) steps of table lookups; composition is associative, so any grouping is exact."""
    products, size = words.clone(), table.shape[0]
    shift = 1
    while shift < words.shape[1]:
        earlier = products[:, :-shift]
        products[:, shift:] = table.flatten()[earlier * size + products[:, shift:]]
        shift *= 2
    return products


@dataclass(frozen=True)
class PermutationParams:
    group: str = "S5"  # S3, S5, A5 (non-abelian), or Z5 (the abelian control)
    n: int = 32  # length of the word, every prefix product an answer

    def __post_init__(self):
        named = {g.lower(): g for g in GROUPS}
        if not isinstance(self.group, str) or self.group.lower() not in named:
            raise ValueError(
                f"permutation has no group {self.group!r} (groups: {', '.join(GROUPS)})"
            )
        object.__setattr__(self, "group", named[self.group.lower()])  # frozen: canonical
        require_at_least("permutation", self, n=1)


@TASKS.register(
    "permutation",
    aliases=("word_problem",),
    category="State",
    suite="extended",
    description="g_1 .. g_n: at each g_i, the running product g_1 .. g_i in a permutation group",
)
class Permutation(Task):
    Params = PermutationParams
    # the solvable S3 and the non-solvable S5 (NC1-complete word problem); longer words
    difficulties = {"easy": {"group": "S3"}, "hard": {"n": 64}}
    harder = {"n": "larger"}  # a longer product (group: no order, see the docstring)
    length_param = "n"
    answers_in_stream = False  # labels at the inputs' positions: never fed back

    @property
    def table(self) -> torch.Tensor:
        return multiplication_table(self.params.group)

    @property
    def vocab_size(self) -> int:
        return len(elements(self.params.group))

    @property
    def seq_len(self) -> int:
        return self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        dev = generator.device
        words = torch.randint(self.vocab_size, (n, self.params.n), generator=generator, device=dev)
        products = running_products(words, self.table.to(dev))
        return Batch(words, products).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        """One composition per position, left to right: p_i from p_(i-1) and g_i alone."""
        table = self.table.to(inputs.device)
        words = inputs.clamp(0, self.vocab_size - 1)
        product, answers = words[:, 0], [words[:, 0]]
        for i in range(1, inputs.shape[1]):
            product = table[product, words[:, i]]
            answers.append(product)
        return torch.stack(answers, dim=1)

    def shortcut_rules(self) -> list[ShortcutRule]:
        table = self.table

        def recent(inputs: torch.Tensor) -> torch.Tensor:
            words = inputs.clamp(0, self.vocab_size - 1)
            product = words.clone()
            for back in range(1, 4):  # g_(i-3) ∘ .. ∘ g_i: the older prefix forgotten
                product[:, back:] = table[words[:, :-back], product[:, back:]]
            return product

        rules = [ShortcutRule("last 4", "the product of the last 4 elements only", recent)]
        if self.params.group not in ABELIAN:  # order does not matter in Z5: no shortcut there

            def reversed_order(inputs: torch.Tensor) -> torch.Tensor:
                words = inputs.clamp(0, self.vocab_size - 1)
                product, answers = words[:, 0], [words[:, 0]]
                for i in range(1, inputs.shape[1]):
                    product = table[words[:, i], product]  # g_i ∘ .. ∘ g_1
                    answers.append(product)
                return torch.stack(answers, dim=1)

            description = "the product in the reverse order, as if the group were abelian"
            rules.append(ShortcutRule("order ignored", description, reversed_order))
        return rules

    def token_name(self, token: int) -> str:
        if 0 <= token < self.vocab_size:
            return "".join(map(str, elements(self.params.group)[token]))
        return super().token_name(token)
