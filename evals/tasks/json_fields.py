"""Reading one key of a JSON object strictly, for the typed records of files ropescale writes
(:mod:`.cell_record`, :mod:`.ruler.record`): the value when it has the type asked, else one line naming
the key and the value, raised as the caller's own error class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def take(
    data: Any,
    key: str,
    kinds: tuple[type, ...],
    what: str,
    where: str = "",
    *,
    error: type[Exception],
    show: Callable[[Any], str] = repr,
) -> Any:
    """``data[key]`` when it is one of ``kinds`` (a bool is no number), else ``error``:
    ``{where}{key} = (missing)`` or ``{where}{key} = {show(value)}: must be {what}``."""
    if key not in data:
        raise error(f"{where}{key} = (missing)")
    value = data[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise error(f"{where}{key} = {show(value)}: must be {what}")
    return value


def only_known(
    data: dict[str, Any],
    known: tuple[str, ...] | list[str],
    schema: str,
    where: str = "",
    *,
    error: type[Exception],
    show: Callable[[Any], str] = repr,
) -> None:
    """``error`` naming the first key (in sorted order) that is not in ``known``: a key a layout does not
    have would not survive its ``to_json`` (a newer writer's), so it is refused, not dropped unsaid."""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise error(f"{where}{unknown[0]} = {show(data[unknown[0]])}: not a key of {schema}")
