"""YAML from users' files, read so that nothing is silently dropped.

PyYAML's ``safe_load`` keeps the last of two equal keys in a mapping: a suite with ``factor: 4`` and,
further down the same entry, ``factor: 8`` runs ×8 without a word. :func:`safe_load` reads like
``yaml.safe_load`` (the same safe types only) and refuses a key given twice, naming the file, the key
and both lines. Every YAML ropescale reads from a user goes through it: suites, training recipes and
the run folders' resolved ``config.yaml``, accelerate configs.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import RopescaleError


class DuplicateKeyError(RopescaleError):
    """A YAML mapping names the same key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (merge keys ``<<`` aside)."""

    source = "<string>"

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(
                        f"{self.source}: key '{key}' is given twice (lines {first} and {line}); keep one"
                    )
                lines[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str, source: str = "<string>") -> Any:
    """``yaml.safe_load(text)`` that refuses duplicate keys.

    Args:
        text: the YAML document.
        source: the file it came from, named in the error.

    Raises:
        DuplicateKeyError: ``<source>: key 'factor' is given twice (lines 5 and 9); keep one``.
        yaml.YAMLError: the text is not YAML (as ``yaml.safe_load``).
    """
    loader = _UniqueKeyLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


__all__ = ["DuplicateKeyError", "safe_load"]
