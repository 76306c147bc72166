"""The report a reviewer reads: Markdown (for the PR diff) and self-contained HTML, built from the
stages' outputs.

The report reads artifacts, metrics and plots and never recomputes them; a stage that has not run
is shown as 'not run'. Anything that makes the claimed epsilon untrustworthy comes first.
"""

from dpledger.report.writer import RenderedReport, render_report, write_report

__all__ = ["RenderedReport", "render_report", "write_report"]
