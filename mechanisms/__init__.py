"""Built-in attention mechanisms; importing this package registers them in MECHANISMS."""

# imported for their registration only
from . import (  # noqa: F401
    based,
    cosformer,
    deltanet,
    gated_deltanet,
    gla,
    h3,
    linear,
    mamba2,
    none,
    performer,
    retnet,
    rewa,
    rff,
    s4d,
    slay,
    softmax,
    window,
    yat,
)
