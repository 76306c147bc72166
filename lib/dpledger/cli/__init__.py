"""The ``dpledger`` console script: the pipeline stages plus the utility commands.

Every command prints one line (no traceback) for an error a user can act on and exits with code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dpledger.errors import DpledgerError
from dpledger.params import STAGES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="dpledger: DP-SGD training with evidence that the reported epsilon holds.",
)


@app.command("stage")
def stage(
    name: str = typer.Argument(..., help=f"one of: {', '.join(STAGES)}"),
    params: Path = typer.Option(Path("params.yaml"), help="params file to read"),
    root: Path = typer.Option(Path("."), help="project root the outputs are written under"),
) -> None:
    """Run one pipeline stage exactly as `dvc repro` does."""
    from dpledger.pipeline import run_stage

    if name not in STAGES:
        raise DpledgerError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    run_stage(name, params, root)


def _register_commands() -> None:
    from dpledger.cli import accounting, audit, report, sampling, verify

    for module in (accounting, sampling, verify, audit, report):
        module.register(app)


_register_commands()


def main() -> None:
    """Console-script entry: run the app, turning a :class:`DpledgerError` into one line and exit
    code 2."""
    try:
        app()  # standalone mode: usage errors, --help and typer.Exit end the process themselves
    except DpledgerError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
