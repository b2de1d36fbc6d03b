"""Placeholder: the live widget (filled in below)."""

from __future__ import annotations

from typing import Any

__all__ = ["show"]


def show(app: str, url: str) -> Any:
    """Display the live widget of ``app`` under the current cell."""
    return None
