"""The shared typer entrypoint behind every stage module."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage


def main(name: str) -> None:
    """Run stage ``name`` from the command line; a user error prints one line and exits 2, writing
    nothing."""
    app = typer.Typer(add_completion=False)

    @app.command(help=f"Run the {name} stage: read params.yaml, compute, write outputs atomically.")
    def command(
        params: Path = typer.Option(Path("params.yaml"), help="params file"),
        root: Path = typer.Option(Path("."), help="project root for outputs"),
    ) -> None:
        try:
            run_stage(name, params, root)
        except DpledgerError as error:
            typer.echo(f"error: {error}", err=True)
            sys.exit(2)

    app()
