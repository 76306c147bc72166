"""What the report says, in order: warnings, headline, the evidence behind it, group-level epsilon,
mechanism, plots, provenance and how to reproduce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from dpledger.report import evidence
from dpledger.report.checks import Finding
from dpledger.report.document import (
    Alert,
    Block,
    BulletList,
    Code,
    CodeBlock,
    Document,
    Figure,
    Heading,
    Paragraph,
    Table,
    text,
)
from dpledger.report.formatting import humanize
from dpledger.report.headline import headline
from dpledger.report.inputs import UPSTREAM_STAGES, ReportInputs
from dpledger.report.provenance import UNKNOWN
from dpledger.report.utility import utility_section

# The order the figures are listed in: claim, tests, audit, training, batches.
FIGURE_STAGE_ORDER = ("calibrate", "verify", "audit", "train", "schedule")


@dataclass(frozen=True)
class Provenance:
    """Where the report comes from: the validated params, package versions and git commit."""

    params: dict[str, Any]
    versions: dict[str, str]
    commit: str


def build_document(
    title: str, inputs: ReportInputs, findings: list[Finding], provenance: Provenance
) -> Document:
    """The whole report as blocks; warnings come first, right under the title."""
    blocks: list[Block] = [
        *_findings_blocks(findings, inputs),
        *headline(inputs, findings),
        *evidence.privacy_claim(inputs),
        *evidence.audit_details(inputs),
        *evidence.verify_details(inputs),
        *evidence.training_details(inputs),
        *utility_section(inputs),
        *evidence.group_section(inputs),
        *evidence.mechanism_section(inputs),
        *_plots_section(inputs),
        *_provenance_section(inputs, provenance),
        *_reproduce_section(provenance),
    ]
    return Document(title=title, blocks=tuple(blocks))


def figure_target(stage: str, png_name: str) -> str:
    """Where a stage's PNG is copied beside report.md (and linked from it)."""
    return f"figures/{stage}-{png_name}"


# --- warnings ---------------------------------------------------------------------------------


def _findings_blocks(findings: list[Finding], inputs: ReportInputs) -> list[Block]:
    blocks: list[Block] = [
        Alert("caution" if f.severity == "warning" else "note", f.title, text(f.message))
        for f in findings
    ]
    if not findings and not inputs.not_run():
        all_clear = (
            "The claimed ε survives every check this report makes: "
            "the sampler used is the one accounted, "
            "training stayed within the accounted steps and ε, every implementation test passed, "
            "and the audit does not contradict the claim."
        )
        blocks.append(Alert("tip", "No warnings", text(all_clear)))
    return blocks


# --- plots, provenance, reproduction ------------------------------------------------------------


def _plots_section(inputs: ReportInputs) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Plots")]
    if not any(inputs.plots.values()):
        return [*blocks, Paragraph(text("No stage wrote a PNG plot."))]
    for stage in FIGURE_STAGE_ORDER:
        pngs = inputs.plots.get(stage) or []
        if pngs:
            blocks.append(Heading(3, humanize(stage)))
            blocks.extend(
                Figure(
                    humanize(png.stem),
                    png,
                    figure_target(stage, png.name),
                    f"plots/{stage}/{png.name}",
                )
                for png in pngs
            )
    return blocks


def _provenance_section(inputs: ReportInputs, provenance: Provenance) -> list[Block]:
    rows = [(text("git commit"), text(Code(provenance.commit)))]
    rows += [(text(name), text(Code(version))) for name, version in provenance.versions.items()]
    stages = [(text(stage), text(inputs.status[stage])) for stage in UPSTREAM_STAGES]
    blocks: list[Block] = [
        Heading(2, "Provenance"),
        Table(("source", "version"), tuple(rows)),
        Table(("stage", "outputs"), tuple(stages)),
        Paragraph(
            text(
                "The exact parameters (",
                Code("params.yaml"),
                " after validation, defaults filled in):",
            )
        ),
        CodeBlock(_params_yaml(provenance.params), "yaml"),
    ]
    if inputs.problems:
        blocks.append(BulletList(tuple(text(problem) for problem in inputs.problems)))
    return blocks


class _ParamsDumper(yaml.SafeDumper):
    """Block mappings as in params.yaml, lists on one line (``group_sizes: [1, 2, 4, 8]``)."""


_ParamsDumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True),
)


def _params_yaml(params: dict[str, Any]) -> str:
    return yaml.dump(params, Dumper=_ParamsDumper, sort_keys=False, allow_unicode=True).rstrip()


def _reproduce_section(provenance: Provenance) -> list[Block]:
    commands = [
        ("make repro", "install into .venv, then `dvc repro` with the params above"),
        ("dpledger report", "re-render this report from the existing outputs"),
        ("dpledger report --compare main", "headline of main and of this tree, side by side"),
        ("dvc metrics diff main --md", "every metric that changed"),
    ]
    if provenance.commit != UNKNOWN:
        commands.insert(
            0, (f"git checkout {provenance.commit}", "the code this report was rendered from")
        )
    width = max(len(command) for command, _ in commands) + 2
    script = "\n".join(f"{command.ljust(width)}# {comment}" for command, comment in commands)
    return [Heading(2, "Reproduce"), CodeBlock(script, "bash")]
