"""Built-in attention mechanisms; importing this package registers them in MECHANISMS."""

from . import linear, none, softmax  # noqa: F401
