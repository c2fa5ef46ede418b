"""Built-in attention mechanisms; importing this package registers them in MECHANISMS."""

from . import linear, softmax  # noqa: F401
