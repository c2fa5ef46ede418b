"""The task interface: a parameter dataclass, a vectorised generator and a causal oracle.

Every task lays its sequences out for a causal model as ``prompt SEP answer``. A generator
builds whole sequences ``S`` of length ``T`` plus a mask of the answer tokens; the model
reads ``inputs = S[:, :-1]`` and at every position predicts the next token, so
``targets[:, i] = S[:, i + 1]`` where ``S[:, i + 1]`` is an answer token and ``IGNORE``
elsewhere (teacher forcing, loss on answer positions only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from synthbench.params import REQUIRED, resolve_params
from synthbench.registry import Registry

CATEGORIES = ("Basic", "Arithmetic", "Long-Range", "Memory", "Patterns", "Reasoning", "Robustness")
IGNORE = -100  # the target outside answer positions (torch's cross-entropy ignore_index)

TASKS: Registry[type[Task]] = Registry(
    "task",
    entry_point_group="synthbench.tasks",
    builtins="synthbench.tasks",
    required=("category", "description"),
    choices={"category": CATEGORIES},
)


@dataclass
class Batch:
    inputs: torch.Tensor  # (n, L) int64 token ids
    targets: torch.Tensor  # (n, L) int64: next-token labels at answer positions, IGNORE elsewhere

    @property
    def answer_mask(self) -> torch.Tensor:
        return self.targets != IGNORE

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device), self.targets.to(device))


def teacher_forced(sequences: torch.Tensor, answer_mask: torch.Tensor) -> Batch:
    """Turn full sequences (n, T) and their answer-token mask (n, T) into a Batch of length T-1."""
    targets = sequences[:, 1:].masked_fill(~answer_mask[:, 1:], IGNORE)
    return Batch(sequences[:, :-1].contiguous(), targets.contiguous())


class Task:
    """Base class of a task generator.

    Subclasses set ``Params`` (a frozen dataclass with defaults; ``__post_init__`` raises
    ``ValueError`` on invalid values), optionally ``difficulties`` (preset name -> parameter
    overrides), and implement ``vocab_size``, ``seq_len``, ``generate`` and ``solve``.
    """

    Params: ClassVar[type]
    difficulties: ClassVar[dict[str, dict[str, Any]]] = {}
    # The integer parameter that sets the sequence length; ``--eval-length-mult`` scales it
    # to test length generalisation. None when the task has no length knob. Token ids whose
    # count depends on it (number tokens) come last, so a longer task keeps every id of the
    # shorter one with the same meaning.
    length_param: ClassVar[str | None] = None

    def __init__(self, **overrides: Any) -> None:
        defaults = {
            f.name: REQUIRED if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(self.Params)
        }
        params = resolve_params(f"task {type(self).__name__}", defaults, overrides)
        self.params = self.Params(**params)

    @classmethod
    def from_difficulty(cls, difficulty: str = "default", **overrides: Any) -> Task:
        presets = {"default": {}, **cls.difficulties}
        if difficulty not in presets:
            raise ValueError(f"unknown difficulty {difficulty!r} (presets: {', '.join(presets)})")
        return cls(**{**presets[difficulty], **overrides})

    def at_length(self, mult: float) -> Task:
        """The same task with its length knob scaled by ``mult`` (rounded to an integer)."""
        if self.length_param is None:
            raise ValueError(f"task {type(self).__name__} has no length parameter")
        length = getattr(self.params, self.length_param)
        return type(self)(**{**self.param_dict(), self.length_param: round(length * mult)})

    def param_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    @property
    def vocab_size(self) -> int:
        """Exact number of token ids the task uses (data tokens and special tokens)."""
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        """Length L of ``Batch.inputs``."""
        raise NotImplementedError

    def generate(self, n: int, generator: torch.Generator, device: str = "cpu") -> Batch:
        """``n`` examples drawn with ``generator`` only (never the global RNG), no Python
        loop over examples."""
        raise NotImplementedError

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        """Oracle: the targets of ``inputs``, each computed from its causal prefix
        ``inputs[:, : i + 1]`` alone; IGNORE outside answer positions."""
        raise NotImplementedError

    def token_name(self, token: int) -> str:
        """How a token is shown to a person (special tokens override this)."""
        return str(token)
