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


#: what huggingface_hub / transformers raise (or chain) when the Hub cannot be reached
_UNREACHABLE_TYPES = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "ConnectError", "Timeout")
_UNREACHABLE_TEXTS = ("couldn't connect to", "cannot find the requested files in the local cache", "offline mode")


def hub_unreachable(exc: BaseException, name: str) -> RopescaleError | None:
    """The one line for a Hub id that cannot be fetched because the Hub is unreachable (offline,
    ``HF_HUB_OFFLINE=1``, no network) and is not in the local cache; None for other failures
    (a missing repository, a gated one...), which keep their own message.

    transformers says "We couldn't connect to 'https://huggingface.co'..." without saying what to do
    on a machine that will never reach it: give a local folder.
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        names = {c.__name__ for c in type(link).__mro__}
        text = str(link).lower()
        if names & set(_UNREACHABLE_TYPES) or any(t in text for t in _UNREACHABLE_TEXTS):
            import os

            why = "HF_HUB_OFFLINE=1" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else "no network"
            return RopescaleError(
                f"'{name}' is a Hugging Face Hub id, and the Hub is unreachable here ({why}) with nothing of it in "
                "the local cache; point --model at a local folder holding its config.json, tokenizer and weights "
                f"(e.g. `hf download {name} --local-dir DIR` where the Hub is reachable, then copy DIR here)"
            )
        link = link.__cause__ or link.__context__
    return None


class RecipeError(RopescaleError, ValueError):
    """A training recipe or override is invalid (one-line message); ``ropescale.training.config.ConfigError``."""
