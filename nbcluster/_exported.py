"""The code generation of remote functions and actor classes (issue 13).

Each remote function and actor class pickles itself once and reuses the pickle; bumping the
generation makes every one pickle itself again at its next export (after ``%autoreload``,
what their code refers to may have changed).
"""

from __future__ import annotations

__all__ = ["CODE_GENERATION", "refresh_exported_code"]

#: The current generation, in a list so that every importer sees it change.
CODE_GENERATION = [0]


def refresh_exported_code() -> None:
    """Make every remote function and actor class pickle itself again when next used."""
    CODE_GENERATION[0] += 1
