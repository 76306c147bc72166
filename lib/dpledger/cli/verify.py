"""``dpledger verify``: run the debugging battery on any trainer (callable or external command)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from dpledger import validation
from dpledger.errors import ParamsError


def register(app: typer.Typer) -> None:  # noqa: C901  (typer command: options, two modes)
    """Add ``verify`` to the ``dpledger`` app."""

    @app.command("verify")
    def verify(
        trainer: str = typer.Option(
            "dpledger", help="'dpledger', 'reference', 'opacus', 'zoo:NAME' or pkg.module:fn"
        ),
        command: Optional[str] = typer.Option(
            None,
            help="external command template with {init} {data} {out} {clip_norm} {noise_multiplier} {batch_size} {steps} {lr} {seed}; "  # noqa: E501
            "replaces --trainer",
        ),
        optimizer: str = typer.Option(
            "sgd", help="sgd | adam (Adam: warm-up steps, small σ; SGD-only tests skipped)"
        ),
        seed: int = typer.Option(
            0, min=0, max=2**32 - 1, help="seed of the synthetic task and of the trainer's noise"
        ),
        significance: float = typer.Option(
            0.01, help="family-wise significance (Holm over the stochastic tests)"
        ),
        plots: Optional[Path] = typer.Option(None, help="folder to write one CSV + PNG per test"),
        self_check: bool = typer.Option(
            False, "--self-check", help="run the battery on correct and zoo trainers"
        ),
        seeds: int = typer.Option(3, min=1, help="--self-check: seeds per trainer"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
        progress: bool = typer.Option(True, help="progress bar on stderr"),
    ) -> None:
        """Test a DP-SGD implementation for clipping and noise bugs; exit code 1 when a bug is
        found."""
        from dpledger.params.verify import VerifyParams
        from dpledger.pipeline.verify import trainer_from_params
        from dpledger.verify.battery import OPTIMIZERS, run_battery

        validation.within("--significance", significance, 0, 0.5)
        validation.one_of("--optimizer", optimizer, OPTIMIZERS)
        if self_check:
            _self_check(seeds, optimizer, significance, as_json)
            return
        if plots is not None:
            _check_writable_folder(plots)
        try:
            settings = VerifyParams(
                trainer=trainer, command=command, optimizer=optimizer, significance=significance
            )
        except ValidationError as error:
            first = error.errors()[0]
            raise ParamsError(
                f"--{first['loc'][0]} = {first['input']!r} is invalid: {first['msg']}"
            ) from None
        function, name = trainer_from_params(settings)
        result = run_battery(
            function,
            trainer_name=name,
            seed=seed,
            optimizer=optimizer,
            significance=significance,
            progress=progress,
        )
        if plots is not None:
            from dpledger.verify.plots import write_plots

            write_plots(result, plots)
        if as_json:
            typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
        else:
            typer.echo(
                f"{'PASSED' if result.passed else 'BUG FOUND'}: {name} "
                f"({result.training_steps} training steps, {result.wall_time_s:.1f} s, "
                f"Holm at {significance})"
            )
            for finding in result.findings:
                typer.echo(f"  {finding}")
        if not result.passed:
            # not typer.Exit: the console script runs click with standalone_mode=False
            raise SystemExit(1)


def _check_writable_folder(folder: Path) -> None:
    """Refuse ``--plots`` before the battery runs (minutes) rather than after: it must be, or be
    creatable as, a folder this process may write."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == folder and not folder.is_dir():
        raise ParamsError(f"--plots = {str(folder)!r} is invalid: it exists and is not a folder")
    if not existing.is_dir():
        raise ParamsError(
            f"--plots = {str(folder)!r} is invalid: {str(existing)!r} is a file, not a folder"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ParamsError(
            f"--plots = {str(folder)!r} is invalid: {str(existing)!r} is not writable"
        )


def _self_check(seeds: int, optimizer: str, significance: float, as_json: bool) -> None:
    from dpledger.verify.self_check import self_check

    rows = self_check(range(seeds), optimizer=optimizer, significance=significance)
    if as_json:
        typer.echo(json.dumps([row.to_json() for row in rows], indent=2, ensure_ascii=False))
    else:
        for row in rows:
            typer.echo(
                f"{row.trainer:32s} {row.correct}/{row.seeds} classified correctly (expected: "
                f"{row.expected})"
            )
    if any(row.correct < row.seeds for row in rows):
        raise SystemExit(1)
