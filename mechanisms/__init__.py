"""Built-in attention mechanisms; importing this package registers them in MECHANISMS."""

from . import cosformer, linear, none, performer, rewa, rff, slay, softmax, yat  # noqa: F401
