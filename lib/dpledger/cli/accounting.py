"""Utility commands of this concern (filled in by its issue)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the ``dpledger`` app."""
