"""User-facing errors.

Anything a user can cause (bad method name, bad parameter, missing model, unsupported
architecture, ...) raises a subclass of :class:`RopescaleError` or :class:`ValueError` with a
one-line message; the CLI prints that line and exits non-zero instead of showing a traceback.
"""

from __future__ import annotations


class RopescaleError(Exception):
    """An error caused by user input or environment, reported as one line by the CLI."""


class UnsupportedModelError(RopescaleError):
    """The model has no rotary embedding, or its architecture is not on the supported list."""


class AlreadyScaledError(RopescaleError):
    """The model already carries a RoPE scaling and replacing it was not asked for."""


class MissingDependencyError(RopescaleError):
    """An optional package that this feature needs is not installed."""


class RecipeError(RopescaleError, ValueError):
    """A training recipe or override is invalid (one-line message); ``ropescale.training.config.ConfigError``."""
