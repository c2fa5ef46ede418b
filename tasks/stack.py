"""stack: emit the value each POP removes from a stack, where it lies under a finished sub-stack.

Layout ``o_1 v_1 .. o_ops v_ops``: a stream of ``ops`` operations of two tokens each, ``PUSH v``
(push the value v) or ``POP a`` where a is the value popped. The stream climbs, then
unwinds: each op of its first half is a PUSH with probability ``climb`` (0.7), each of the
second half a POP with that probability (a PUSH on an empty stack, and the last op a POP
whenever the stack is non-empty). The answers are the a of the *nested* POPs: those whose
value was pushed before a dip, a POP that a PUSH followed, so that between the PUSH and its
POP lies a finished sub-stack of varying shape, and where the stack holds at least 4 values
(the popped one included). Every other POP's a is given. An example without an asked POP is
drawn again. There is no SEP: the answers are interleaved with the prompt, each computable
from the ops before it. Values are tokens 0..values-1, PUSH is ``values``, POP is
``values + 1``. A training also learns every other POP's a (``practice``), unscored: trained
on the nested POPs alone, softmax did not learn them under quick (docs/TASKS.md).

Why this layout (suite v3): suite v2 asked every POP after a POP in runs of ops that
repeated with probability 0.75, so the stack below a run of POPs had mostly been pushed by
one run of PUSHes: at the k-th POP of a run, the value 2k-1 ops back was the answer (0.87,
chance 0.06), "the token 5 back" scored 0.56, and the audit's fixed-lag, 8-token-window
and relabelled families all found it. A nested POP's PUSH lies behind a sub-stack of any
shape, so no count within the run and no fixed lag finds it; the 64 values and a stack at
least 4 deep keep "the most frequent value still on the stack" (a bag, no order) down.
``climb=0 nested=false ops=16 values=16`` is suite v2's layout; ``every_pop`` is suite v1's
(every POP asked, each op a PUSH with probability 0.5), which the slay-paper protocol runs.

Known solution: at a POP, attend to the most recent PUSH whose value has not been popped yet
and copy its value. "Not popped yet" is a matter of depth: a counting head gives the stack
depth at every op (pushes minus pops so far), and the wanted PUSH is the latest one that
left the stack at the POP's current depth; a further layer matches that depth and copies the
value token after the PUSH. Without attention a POP knows nothing about the stack.
"""

from dataclasses import dataclass

import numpy as np
import torch

from synthbench.core.task import (
    IGNORE,
    TASKS,
    Batch,
    Ladder,
    ShortcutRule,
    Task,
    require_at_least,
    teacher_forced,
)

RUN_PERSISTENCE = 0.75  # suite v2 (climb 0): the probability that an op repeats the one before
# suite v3 asks a POP only where the stack holds at least this many values (the popped one
# included): on a shallow stack "a value still on it" is nearly the answer
ASKED_DEPTH = 4
MAX_CLIMB = 0.9  # above it a stream has almost no dip, so almost no nested POP to ask
MAX_DRAWS = 200  # rounds of drawing streams again before an example without an answer is an error


@dataclass(frozen=True)
class StackParams:
    ops: int = 48  # operations in the stream
    values: int = 64  # number of value tokens
    every_pop: bool = False  # suite v1: every POP asked, ops drawn independently
    # the probability of a PUSH in the first half of the stream, of a POP in the second: the
    # stack grows deep, with dips, and unwinds (suite v3); 0: suite v2's runs
    climb: float = 0.7
    # ask only a POP whose value was pushed before a dip (a POP that a PUSH followed), so
    # that it lies under a finished sub-stack (suite v3); False: every POP after a POP (v2)
    nested: bool = True
    # a training also learns every POP that is not asked (``Batch.practice``), scored on the
    # asked ones alone: the easy POPs teach the depth-tracking that the nested ones need
    # (seed 100, softmax at quick: 0.20 on the asked ones alone); False: suite v3's first
    # layout, and suite v1 and v2, which train on the asked POPs only
    practice: bool = True

    def __post_init__(self):
        # PUSH PUSH POP POP at least (suite v1's PUSH POP)
        # suite v3's nested POPs need room: a stack 4 deep and a dip (PUSH PUSH PUSH PUSH
        # PUSH POP PUSH POP POP at least), and 16 ops give one in 4 streams an asked POP
        least = 2 if self.every_pop else 16 if self.nested else 4
        require_at_least("stack", self, ops=least, values=2)
        if self.climb and not 0.5 <= self.climb <= MAX_CLIMB:
            raise ValueError(
                f"stack needs climb in [0.5, {MAX_CLIMB}] or 0 (suite v2), got {self.climb}"
            )


@TASKS.register(
    "stack",
    category="Reasoning",
    description="PUSH v / POP streams: emit the value each nested POP removes",
)
class Stack(Task):
    Params = StackParams
    difficulties = {"easy": {"ops": 40}, "hard": {"ops": 96}}
    # ops: longer streams, deeper stacks; values: more values; climb: a deeper stack
    harder = {"ops": "larger", "values": "larger", "climb": "larger"}
    # Longer streams, deeper stacks: a stack is state tracking beyond finite groups
    # (Merrill et al. 2024; Grazzi et al. 2024), and a deeper stack holds more values. From
    # 40 ops (the easy preset): at 24 and 32 a stream's shape puts the asked value at a
    # lag the audit's fixed-position copy finds (0.28, 0.23 against a line of 0.22).
    ladder = Ladder(
        axis=("ops",),
        source="Merrill et al. 2024 (arXiv 2404.08819); Grazzi et al. 2024 (arXiv 2411.12537)",
        baseline={"ops": 40},
        steps=({"ops": 64}, {"ops": 96}),
    )
    length_param = "ops"

    @property
    def push(self) -> int:
        return self.params.values

    @property
    def pop(self) -> int:
        return self.params.values + 1

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"PUSH": self.push, "POP": self.pop}

    @property
    def vocab_size(self) -> int:
        return self.params.values + 2

    @property
    def seq_len(self) -> int:
        return 2 * self.params.ops - 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        sequences = torch.empty(n, 2 * self.params.ops, dtype=torch.long, device=generator.device)
        asked = torch.empty_like(sequences, dtype=torch.bool)
        todo = torch.arange(n, device=generator.device)
        for _ in range(MAX_DRAWS):  # examples without an asked POP are drawn again
            drawn, drawn_asked = self._draw(len(todo), generator)
            keep = drawn_asked.any(dim=1)
            sequences[todo[keep]], asked[todo[keep]] = drawn[keep], drawn_asked[keep]
            todo = todo[~keep]
            if not len(todo):
                return teacher_forced(sequences, asked, self._practice(sequences)).to(device)
        raise ValueError(
            f"stack at {self.param_dict()} asks a POP too rarely: {len(todo)} of {n} streams "
            f"had none in {MAX_DRAWS} draws (more ops, or a climb nearer 0.5)"
        )

    def _practice(self, sequences: torch.Tensor) -> torch.Tensor | None:
        """The mask of every POP's operand (the value it removes), for ``Batch.practice``."""
        if not self.params.practice or self.params.every_pop:  # v1 asks every POP already
            return None
        practice = torch.zeros_like(sequences, dtype=torch.bool)
        practice[:, 1::2] = sequences[:, 0::2] == self.pop
        return practice

    def _draw(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n op streams and the mask of their asked tokens (the a of the POPs ``_asked``
        picks).

        The random numbers are drawn first, in the order the stream consumes them (per op a
        coin, then a value), and the stack is then simulated in numpy: the same streams as
        simulating it in torch op by op, several times faster at a training batch (a dozen
        small operations per op, where torch's per-call cost dominated a quick step)."""
        p, dev = self.params, generator.device
        coins, values = [], []
        for _ in range(p.ops):
            coins.append(torch.rand(n, generator=generator, device=dev))
            values.append(torch.randint(p.values, (n,), generator=generator, device=dev))
        coins, value_of = torch.stack(coins), torch.stack(values).cpu().numpy()
        climbing = bool(p.climb) and not p.every_pop
        if climbing:  # suite v3: up with dips, then down with bumps
            half = p.ops // 2
            heads = torch.cat([coins[:half] < p.climb, coins[half:] < 1 - p.climb])
        else:  # runs: the same op again, or the other one (v1: independent ops)
            heads = coins < (0.5 if p.every_pop else RUN_PERSISTENCE)
        heads = heads.cpu().numpy()

        rows = np.arange(n)
        stack = np.zeros((n, p.ops), dtype=np.int64)  # depth <= ops - 1 at a push
        pushed_at = np.zeros_like(stack)  # the op that pushed each slot's value
        depth = np.zeros(n, dtype=np.int64)
        valley = np.full(n, -1, dtype=np.int64)  # latest POP before a PUSH
        sequences = np.empty((n, 2 * p.ops), dtype=np.int64)
        asked = np.zeros(sequences.shape, dtype=bool)
        was_push = np.ones(n, dtype=bool)
        for i in range(p.ops):
            wants_push = heads[i] if climbing else heads[i] == was_push
            value = value_of[i]
            is_push = depth == 0 if i == p.ops - 1 else wants_push | (depth == 0)
            top_slot = np.maximum(depth - 1, 0)
            top, top_pushed_at = stack[rows, top_slot], pushed_at[rows, top_slot]
            slot = np.minimum(depth, p.ops - 1)
            stack[rows, slot] = np.where(is_push, value, stack[rows, slot])
            pushed_at[rows, slot] = np.where(is_push, i, pushed_at[rows, slot])
            depth += np.where(is_push, 1, -1)
            valley = np.where(is_push & ~was_push, i - 1, valley)
            sequences[:, 2 * i] = np.where(is_push, self.push, self.pop)
            sequences[:, 2 * i + 1] = np.where(is_push, value, top)
            asked[:, 2 * i + 1] = ~is_push & self._asked(
                was_push, valley > top_pushed_at, depth + 1
            )
            was_push = is_push
        return torch.from_numpy(sequences).to(dev), torch.from_numpy(asked).to(dev)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # Re-simulates the stack from the tokens. Even positions hold ops, odd ones operands.
        # On garbage input: a value token where an op should be is a no-op (its operand is
        # skipped); a POP on an empty stack has no answer (IGNORE) and changes nothing; PUSH
        # pushes whatever token follows it, PUSH and POP ids included. Which POPs are asked:
        # ``_asked``, a dip read from the op tokens alone (a POP token before a PUSH token).
        n, L = inputs.shape
        rows = torch.arange(n, device=inputs.device)
        stack = torch.zeros(n, self.params.ops, dtype=torch.long, device=inputs.device)
        pushed_at = torch.zeros_like(stack)
        depth = torch.zeros(n, dtype=torch.long, device=inputs.device)
        valley = torch.full((n,), -1, dtype=torch.long, device=inputs.device)
        targets = torch.full_like(inputs, IGNORE)
        for i in range(0, L, 2):
            op = inputs[:, i]
            is_pop = (op == self.pop) & (depth > 0)
            after_pop = inputs[:, i - 2] == self.pop if i else torch.zeros_like(is_pop)
            # a valley: a POP token right before a PUSH token (by the tokens alone)
            valley = torch.where((op == self.push) & after_pop, i // 2 - 1, valley)
            top_slot = (depth - 1).clamp(min=0)
            top, top_pushed_at = stack[rows, top_slot], pushed_at[rows, top_slot]
            asked = is_pop & self._asked(~after_pop, valley > top_pushed_at, depth)
            targets[:, i] = torch.where(asked, top, IGNORE)
            depth -= is_pop.long()
            if i + 1 < L:  # the last op's operand is not an input; nothing follows it
                is_push = op == self.push
                slot = depth.clamp(max=self.params.ops - 1)  # depth < ops: one push per op
                stack[rows, slot] = torch.where(is_push, inputs[:, i + 1], stack[rows, slot])
                pushed_at[rows, slot] = torch.where(is_push, i // 2, pushed_at[rows, slot])
                depth += is_push.long()
        return targets

    def _asked(
        self, after_push: torch.Tensor, past_valley: torch.Tensor, depth: torch.Tensor
    ) -> torch.Tensor:
        """Which POPs are asked, given whether the op before was a PUSH, whether the value
        popped was pushed before the latest valley (a POP that a PUSH followed), and how
        many values the stack holds at the POP, the popped one included (torch tensors or
        numpy arrays alike)."""
        if self.params.every_pop:  # suite v1: every POP (all True, in either library)
            return after_push | ~after_push
        if self.params.nested:  # suite v3 (a POP past a valley never follows a PUSH)
            return past_valley & ~after_push & (depth >= ASKED_DEPTH)
        return ~after_push  # suite v2

    def shortcut_rules(self):
        p = self.params

        def run_counter(inputs: torch.Tensor) -> torch.Tensor:
            """At the k-th POP of a run of POPs, the value of the op 2k-1 ops back: right
            where the runs before were all PUSHes (suite v2: 0.87)."""
            n, L = inputs.shape
            out = torch.zeros_like(inputs)
            run = torch.zeros(n, dtype=torch.long, device=inputs.device)
            for i in range(0, L, 2):
                run = torch.where(inputs[:, i] == self.pop, run + 1, 0)
                source = 2 * (i // 2 - (2 * run - 1)) + 1  # the operand of that op
                out[:, i] = inputs.gather(1, source.clamp(0, L - 1).unsqueeze(1)).squeeze(1)
            return out

        def stack_bag(inputs: torch.Tensor) -> torch.Tensor:
            """The most frequent value among those pushed and not yet popped (by count:
            pushes minus pops of each value), ignoring their order on the stack."""
            n, L = inputs.shape
            counts = torch.zeros(n, p.values + 2, dtype=torch.long, device=inputs.device)
            out = torch.zeros_like(inputs)
            for i in range(0, L, 2):
                out[:, i] = counts[:, : p.values].argmax(dim=1)
                if i + 1 < L:
                    sign = torch.where(inputs[:, i] == self.push, 1, -1)
                    counts.scatter_add_(1, inputs[:, i + 1 : i + 2], sign.unsqueeze(1))
            return out

        return [
            ShortcutRule("run counter", "k-th POP of a run: the value 2k-1 ops back", run_counter),
            ShortcutRule("stack bag", "the most frequent value still on the stack", stack_bag),
        ]
