"""Render the report from the outputs under a project root and write reports/ atomically."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpledger import io
from dpledger.params import Params
from dpledger.report.checks import Finding, find_findings
from dpledger.report.content import Provenance, build_document
from dpledger.report.document import Document
from dpledger.report.html import render_html
from dpledger.report.inputs import ReportInputs, load_inputs
from dpledger.report.markdown import render_markdown
from dpledger.report.provenance import git_commit, package_versions

REPORT_DIR = Path("reports")


@dataclass(frozen=True)
class RenderedReport:
    """The report in both formats, before anything is written."""

    inputs: ReportInputs
    findings: list[Finding]
    document: Document
    markdown: str
    html: str

    def metrics(self) -> dict[str, Any]:
        """Flat summary for metrics/report.json, so `dvc metrics diff` shows a new warning."""
        warnings = [f.kind for f in self.findings if f.severity == "warning"]
        return {
            "warnings": len(warnings),
            "warning_kinds": ",".join(warnings) or "none",
            "notices": sum(f.severity == "notice" for f in self.findings),
            "stages_not_run": len(self.inputs.not_run()),
            "figures": len(self.document.figures()),
        }


def render_report(params: Params, root: str | Path) -> RenderedReport:
    """Read every upstream output under ``root`` and render Markdown and HTML (writes nothing)."""
    root = Path(root)
    inputs = load_inputs(root)
    findings = find_findings(
        inputs.metrics,
        mc_failure_warning=params.report.mc_failure_warning,
        details=inputs.details,
        status=inputs.status,
        train_files=inputs.train_files,
        seals=inputs.seal_problems,
    )
    provenance = Provenance(
        params=params.model_dump(mode="json"), versions=package_versions(), commit=git_commit(root)
    )
    document = build_document(params.report.title, inputs, findings, provenance)
    return RenderedReport(
        inputs, findings, document, render_markdown(document), render_html(document)
    )


def write_report(params: Params, root: str | Path) -> RenderedReport:
    """Render, then write reports/figures/ (as a whole), reports/report.md and
    reports/report.html."""
    root = Path(root)
    report = render_report(params, root)
    out = root / REPORT_DIR
    with io.atomic_dir(out / "figures") as figures:
        for figure in report.document.figures():
            shutil.copyfile(figure.source, figures / Path(figure.target).name)
    io.write_text(out / "report.md", report.markdown)
    io.write_text(out / "report.html", report.html)
    return report
