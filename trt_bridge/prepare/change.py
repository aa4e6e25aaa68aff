"""What a sanitizing pass changed (one record per node touched)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    pass_name: str
    node: str  # '' for model-wide changes
    what: str  # one human-readable line
