"""How a trained model is scored on a fixed set of examples: the per-example token accuracy
and exact match over answer positions, teacher-forced (``evaluate``, a learning curve's
points) and also free-running with standard errors (``held_out_metrics``, the test sets),
and ``Diverged`` for logits that are not finite. It is apart from train.py because scoring
needs nothing of a training (no optimizer, schedule, seed or row) and is read by more than
one trainer: ``train_eval`` scores its model with it, and a pack
(synthbench/run/stacked_models.py) scores its stacked members with its pieces
(``teacher_forced_metrics``, ``evaluation_batches``, ``mean_scores``) under vmap.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from synthbench.core.model import Model
from synthbench.core.task import IGNORE, Batch


def answer_metrics(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: token accuracy over its answer positions, and exact match (all right)."""
    mask = targets != IGNORE
    correct = ((logits.argmax(dim=-1) == targets) & mask).sum(dim=1)
    n_answers = mask.sum(dim=1)
    return correct / n_answers.clamp(min=1), (correct == n_answers).float()


class Diverged(Exception):
    """Training produced a non-finite loss, gradient or logit."""


def mean_and_se(per_example: torch.Tensor) -> tuple[float, float]:
    """The mean over examples and its standard error (0 for a single example)."""
    n = per_example.numel()
    se = per_example.std().item() / math.sqrt(n) if n > 1 else 0.0
    return per_example.mean().item(), se


def teacher_forced_metrics(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``answer_metrics`` of an evaluation pass, whose logits must be finite."""
    if not torch.isfinite(logits).all():
        raise Diverged("non-finite logits at evaluation")
    return answer_metrics(logits, targets)


def evaluation_batches(data: Batch, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, targets) of ``data`` in slices of ``batch_size`` examples."""
    for start in range(0, data.inputs.shape[0], batch_size):
        yield data.inputs[start : start + batch_size], data.targets[start : start + batch_size]


def mean_scores(scores: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """``evaluate``'s metrics from the per-example (token accuracy, exact match) of each slice."""
    token_acc, exact = zip(*scores, strict=True)
    return {
        "token_acc": torch.cat(token_acc).mean().item(),
        "exact_match": torch.cat(exact).mean().item(),
    }


@torch.no_grad()
def evaluate(model: Model, data: Batch, batch_size: int) -> dict[str, float]:
    """Token accuracy and exact match, teacher-forced (``held_out_metrics`` adds their standard
    errors and free-running generation)."""
    model.eval()
    scores = [
        teacher_forced_metrics(model(inputs), targets)
        for inputs, targets in evaluation_batches(data, batch_size)
    ]
    model.train()
    return mean_scores(scores)


@torch.no_grad()
def held_out_metrics(
    model: Model, data: Batch, batch_size: int, feed_back: bool = True
) -> dict[str, float]:
    """``evaluate``'s metrics with their standard errors, and the token accuracy of answers
    generated free-running (greedy), ``free_token_acc`` (and its ``_se``): every answer token
    is fed back to the model as the model produced it, not as the data has it.
    ``feed_back=False``, for a task whose answers are labels that never enter the stream
    (``Task.answers_in_stream``): nothing is written back, one pass, and the free-running
    accuracy is the teacher-forced one.

    Exact, and in parallel (Jacobi iteration): a pass over the whole sequence predicts every
    answer; each is written where the next position reads it back, and the pass is repeated
    for the examples where some fed-back token changed. An example whose fed-back tokens all
    equal the predictions is generated: that fixed point is unique, since each answer depends
    on the tokens before it only. After k passes the first k answers are final, so it takes at
    most one pass per answer, and far fewer where answers do not hang on each other (a copied
    token does not depend on the one copied before it): 0.15x the time of fixing one answer
    per pass on slay-paper (docs/BENCHMARKS.md). An example answered right takes one pass (its
    free-running and teacher-forced answers coincide: so exact match is the same either way).
    The first pass is the teacher-forced one, and gives ``evaluate``'s metrics.
    """
    model.eval()
    token_acc, exact, free = [], [], []
    for start in range(0, data.inputs.shape[0], batch_size):
        inputs = data.inputs[start : start + batch_size].clone()
        targets = data.targets[start : start + batch_size]
        answer = targets != IGNORE
        # an answer predicted at i is read back at i + 1 (the last position reads nothing);
        # labels that are not tokens of the stream are never read back (one pass)
        fed_back = answer[:, :-1] & feed_back
        predicted = torch.empty_like(targets)
        active = torch.arange(len(inputs), device=inputs.device)
        first_pass = True
        while len(active):
            logits = model(inputs[active])
            if first_pass:  # teacher-forced: every input as the data has it
                acc, em = teacher_forced_metrics(logits, targets)
                token_acc.append(acc)
                exact.append(em)
                first_pass = False
            guess = logits.argmax(dim=-1)
            predicted[active] = guess
            read = inputs[active, 1:]
            feeds = fed_back[active]
            changed = (feeds & (guess[:, :-1] != read)).any(dim=1)
            inputs[active, 1:] = torch.where(feeds, guess[:, :-1], read)
            active = active[changed]
        correct = ((predicted == targets) & answer).sum(dim=1)
        free.append(correct / answer.sum(dim=1).clamp(min=1))
    model.train()
    metrics = {}
    for name, per_example in (
        ("token_acc", token_acc),
        ("exact_match", exact),
        ("free_token_acc", free),
    ):
        metrics[name], metrics[f"{name}_se"] = mean_and_se(torch.cat(per_example))
    return metrics
