"""Files that run code when unpickled: each creates a marker file, so a test can tell it never ran."""

from __future__ import annotations

from pathlib import Path

import torch


class Payload:
    """Unpickled, it calls ``open(marker, "w")``: the marker file appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_payload(path: Path, marker: Path) -> Path:
    """Write ``path`` as ``torch.save`` would write a state dict, with the payload inside."""
    torch.save({"state": {}, "param_groups": [], "payload": Payload(marker)}, path)
    return path
