"""Sampling commands: which samplers exist and what accounts for each; statistics of a saved
schedule."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dpledger.errors import ParamsError


def samplers(as_json: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the built-in samplers, the accounted sampler each is (or none), and their options."""
    from dpledger.sampling import describe_samplers

    rows = describe_samplers()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        accounted = row["accounted_as"] or "NONE (no sound accountant)"
        options = ", ".join(row["options"]) or "-"
        typer.echo(f"{row['name']:<{width}}  accounted as: {accounted:<26}  options: {options}")
        typer.echo(f"{'':<{width}}  {row['description']}")
    typer.echo(
        "plugins: module:callable(dataset_size, batch_size, epochs, seed) "
        "-> iterable of index arrays;"
    )
    typer.echo(
        "         an accounted_as attribute names the accounted sampler it declares itself equivalent to"  # noqa: E501
    )


def schedule_stats(
    folder: Path = typer.Argument(
        Path("artifacts/schedule"), help="folder holding schedule.npz and schedule.json"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
) -> None:
    """Batch-size statistics, padding and coverage of a saved schedule."""
    from dpledger.sampling import Schedule
    from dpledger.sampling.stats import schedule_stats as stats_of

    if not (folder / "schedule.npz").exists() or not (folder / "schedule.json").exists():
        raise ParamsError(
            f"folder = {str(folder)!r} is invalid: it holds no schedule.npz and schedule.json"
        )
    from dpledger.io import reading_artifact

    with reading_artifact(folder, "schedule"):
        schedule = Schedule.load(folder)
    stats = stats_of(schedule)
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
        return
    width = max(len(key) for key in stats)
    for key, value in stats.items():
        typer.echo(
            f"{key:<{width}}  {value:.3f}"
            if isinstance(value, float)
            else f"{key:<{width}}  {value}"
        )


def register(app: typer.Typer) -> None:
    """Add ``dpledger samplers`` and ``dpledger schedule-stats``."""
    app.command("samplers")(samplers)
    app.command("schedule-stats")(schedule_stats)
