"""Built-in task generators; importing this package registers them in TASKS (the State
tasks, mod_counting and permutation, outside the default suite: suite="extended")."""

from . import (  # noqa: F401
    addition,
    bigram,
    compression,
    copy,
    counting,
    distant_match,
    first_token,
    histogram,
    induction,
    kv_recall,
    long_copy,
    majority,
    mod_counting,
    modular,
    multihop,
    noisy_copy,
    parity,
    pattern,
    permutation,
    retrieval,
    reverse,
    selective_copy,
    sort,
    stack,
)
