"""`dpledger report`: render the report from the current tree, or compare its headline with a git
revision."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the ``dpledger`` app."""

    @app.command("report")
    def report(
        compare: Optional[str] = typer.Option(
            None,
            "--compare",
            metavar="REV",
            help="print REV's headline beside this tree's instead of rendering",
        ),
        params: Path = typer.Option(Path("params.yaml"), help="params file to read"),
        root: Path = typer.Option(
            Path("."), help="project root holding metrics/, artifacts/ and plots/"
        ),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of text"),
    ) -> None:
        """Render reports/report.md and reports/report.html from the stages' outputs (no stage is
        rerun).

        With --compare REV: print REV's headline beside this tree's (Markdown for a PR comment);
        write nothing.
        """
        if compare is not None:
            _print_comparison(compare, params, root, as_json)
        else:
            _render(params, root, as_json)


def _render(params: Path, root: Path, as_json: bool) -> None:
    from dpledger.params import load_params
    from dpledger.pipeline.report import run

    metrics = run(load_params(params), root)
    if as_json:
        typer.echo(json.dumps(metrics, indent=2))
        return
    report_dir = root / "reports"
    typer.echo(
        f"wrote {report_dir / 'report.md'}, {report_dir / 'report.html'} "
        f"({metrics['figures']} figures)"
    )
    if metrics["warnings"]:
        typer.echo(f"{metrics['warnings']} warning(s): {metrics['warning_kinds']}")


def _print_comparison(revision: str, params: Path, root: Path, as_json: bool) -> None:
    from dpledger.params import load_params
    from dpledger.report.compare import compare_headlines, comparison_document, revision_metrics
    from dpledger.report.inputs import load_inputs
    from dpledger.report.markdown import render_markdown

    threshold = load_params(params).report.mc_failure_warning
    short, old = revision_metrics(root, revision)
    rows = compare_headlines(old, load_inputs(root).metrics, mc_failure_warning=threshold)
    old_label, new_label = (
        f"{revision} ({short})" if short != revision else revision,
        "working tree",
    )
    if as_json:
        typer.echo(
            json.dumps(
                {"old": old_label, "new": new_label, "rows": [asdict(r) for r in rows]}, indent=2
            )
        )
    else:
        typer.echo(render_markdown(comparison_document(rows, old_label, new_label)), nl=False)
