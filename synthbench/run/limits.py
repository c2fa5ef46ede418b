"""What a selection of runs may ask for, checked before anything trains.

- at most ``MAX_SEEDS`` seeds (``run --seeds``);
- at most ``MAX_RUNS`` runs in one command unless it says ``--yes`` (counted before the
  grid is expanded: ``runner.plan_size``);
- sequences of at most ``MAX_SEQ_LEN`` tokens, at the trained length and at
  ``--eval-length-mult`` times it;
- no run that needs more memory than the machine (or the GPU) has: ``memory_needed``
  estimates it, roughly and rather low than high, from the protocol's sizes (docs/RUNNING.md,
  "Limits").

The estimate, in bytes (float32 activations, int64 tokens), for a training at batch B and
length L, evaluation at batch E and length L (L' at the longer length), d_model D, H heads,
N layers, vocabulary V:

    parameters  16 (2 V D + V + L D + 4 N D^2)        weights, gradient, two Adam moments
    data        16 L (val + test + B) + 16 L' test     inputs and targets
    training    4 B L (12 N D + 3 V)  [+ 4 Q N B H L^2]
    evaluation  4 E L (4 D + 2 V)     [+ 8 E H L^2]     no autograd graph: a layer at a time
    total       parameters + data + max(training, evaluation at L and at L')

12 D per layer is what the backward keeps per position (torch 2.13 on the CPU measures about
13 for softmax and 24 for the chunked linear core), 3 V the logits, their softmax and its
gradient. The bracketed L^2 terms count only for a quadratic mechanism that holds its L x L
matrices (Q = 4 of them per head and layer; Yat holds about 9): softmax goes
through torch's fused scaled-dot-product kernels, which never do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from synthbench.core.mechanism import MECHANISMS
from synthbench.run.spec import RunSpec

MAX_SEEDS = 1000
# runs one command plans without --yes: the whole suite on every built-in mechanism at 3
# seeds is 22 x 25 x 3 = 1,650; a grid well past that is more likely a typo than a plan
MAX_RUNS = 5000
MAX_SEQ_LEN = 1_000_000  # tokens: the longest built-in task at its hardest preset has 544
PER_LAYER = 12  # activations kept per position for the backward, in units of d_model
QUADRATIC = 4  # L x L matrices an explicit quadratic mechanism keeps per head and layer
# families whose quadratic mechanisms run on torch's fused kernels (no L x L matrix)
FUSED_FAMILIES = frozenset({"softmax"})


def machine_memory(device) -> int | None:
    """Bytes of memory the runs on ``device`` (a torch.device, or None: unknown) can use in
    all: the GPU's for CUDA, the machine's physical memory for the CPU; None where unknown
    (another OS, another device, a Ray cluster)."""
    if device is None:
        return None
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    if device.type != "cpu":
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf, or not these names
        return None


def memory_needed(spec: RunSpec) -> tuple[int, str]:
    """The estimate (module docstring) of the bytes a training and evaluation of ``spec``
    needs, and the sizes it is made of, in words."""
    p = spec.protocol
    task = spec.make_task()
    long_task = task.at_length(spec.eval_length_mult) if spec.eval_length_mult else None
    lengths = [task.seq_len] + ([long_task.seq_len] if long_task else [])
    vocab = max(t.vocab_size for t in (task, *([long_task] if long_task else [])))
    d, h, n, batch, evals = p.d_model, p.n_heads, p.n_layers, p.batch_size, p.eval_batch_size
    entry = MECHANISMS.entry(spec.mechanism)
    explicit = (
        entry.metadata.get("complexity") == "quadratic"
        and entry.metadata.get("family") not in FUSED_FAMILIES
    )
    length, longest = lengths[0], max(lengths)
    parameters = 16 * (2 * vocab * d + vocab + longest * d + 4 * n * d * d)
    data = 16 * length * (p.val_examples + p.test_examples + batch)
    data += 16 * longest * p.test_examples if long_task else 0
    training = 4 * batch * length * (PER_LAYER * n * d + 3 * vocab)
    training += 4 * QUADRATIC * n * batch * h * length**2 if explicit else 0
    evaluation = max(
        4 * evals * ell * (4 * d + 2 * vocab) + (4 * 2 * evals * h * ell**2 if explicit else 0)
        for ell in lengths
    )
    sizes = f"batch {batch} at length {length}" + (
        f", evaluation batch {evals} at length {lengths[1]}" if long_task else ""
    )
    return parameters + data + max(training, evaluation), sizes


def check_runs(specs: Iterable[RunSpec], device) -> None:
    """Raise ValueError, naming the run, for a sequence longer than ``MAX_SEQ_LEN`` or a run
    whose ``memory_needed`` exceeds ``machine_memory(device)``. Seeds share everything
    checked here, so each (task, mechanism, parameters) is checked once."""
    memory = machine_memory(device)
    seen = set()
    for spec in specs:
        key = (
            spec.task,
            json.dumps(spec.task_params, sort_keys=True, default=str),
            spec.mechanism,
            spec.eval_length_mult,
            spec.protocol,
        )
        if key in seen:
            continue
        seen.add(key)
        what = _describe(spec)
        task = spec.make_task()
        if spec.eval_length_mult:
            longer = task.at_length(spec.eval_length_mult).seq_len
            if longer > MAX_SEQ_LEN:
                raise ValueError(
                    f"{what} at {spec.eval_length_mult:g}x length: sequences of {_count(longer)} "
                    f"tokens, more than the {MAX_SEQ_LEN:,} synthbench allows"
                )
        check_length(task, what)
        if memory is None:
            continue
        needed, sizes = memory_needed(spec)
        if needed > memory:
            where = "this machine's" if device.type == "cpu" else f"{device}'s"
            raise ValueError(
                f"{what} needs about {_gib(needed)} of memory ({sizes}; estimate: "
                f"docs/RUNNING.md, Limits), more than {where} {_gib(memory)}"
            )


def check_length(task, what: str) -> None:
    """Raise ValueError naming ``what`` where ``task``'s sequences are longer than
    ``MAX_SEQ_LEN``: generating them would take the machine's memory before failing."""
    if task.seq_len > MAX_SEQ_LEN:
        raise ValueError(
            f"{what}: sequences of {_count(task.seq_len)} tokens, more than the "
            f"{MAX_SEQ_LEN:,} synthbench allows"
        )


def _describe(spec: RunSpec) -> str:
    params = ", ".join(f"{k}={v}" for k, v in spec.task_params.items())
    return f"task {spec.task} ({params}) with {spec.mechanism} under protocol {spec.protocol.name}"


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
