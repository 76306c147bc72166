"""The rendered report: warnings first in both files, every section in order, links that resolve,
a self-contained HTML page, 'not run' for missing outputs, and a render well inside 10 s."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dpledger.params import load_params
from dpledger.pipeline import run_stage
from dpledger.pipeline.report import run
from dpledger.report import render_report
from helpers.report_fixtures import ALL_PROBLEMS, PLOTS, Problems, fabricate_project, report_params

WARNING_KINDS = ["audit-contradicted", "sampler-mismatch", "verify-failed", "mc-failure"]
SECTIONS_IN_ORDER = [
    "## Headline",
    "### Privacy claim",
    "### Empirical audit",
    "### Implementation tests",
    "### Training",
    "## Group-level ε",
    "## Mechanism",
    "## Plots",
    "## Provenance",
    "## Reproduce",
]


def render(root: Path, **report) -> tuple[dict, str, str]:
    metrics = run(report_params(**report), root)
    return (
        metrics,
        (root / "reports/report.md").read_text(),
        (root / "reports/report.html").read_text(),
    )


class _BodyOutline(HTMLParser):
    """Top-level elements inside <main> (tag, class), and every tag with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.top: list[tuple[str, str]] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._in_main = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "main":
            self._in_main, self.depth = True, 0
            return
        if self._in_main and tag not in {"img", "br", "meta"}:
            if self.depth == 0:
                self.top.append((tag, dict(attrs).get("class") or ""))
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "main":
            self._in_main = False
        elif self._in_main and tag not in {"img", "br", "meta"}:
            self.depth -= 1


def outline(html: str) -> _BodyOutline:
    parser = _BodyOutline()
    parser.feed(html)
    return parser


def markdown_before_first_alert(markdown: str) -> str:
    return markdown.split("> [!", 1)[0]


def test_clean_run_has_no_warning_and_says_so_first(tmp_path):
    metrics, markdown, html = render(fabricate_project(tmp_path))
    assert (
        metrics["warnings"] == 0 and metrics["warning_kinds"] == "none" and metrics["figures"] == 7
    )
    assert markdown_before_first_alert(markdown).strip() == "# dpledger report"
    assert markdown.split("\n\n")[1].startswith("> [!TIP]")
    assert "[!CAUTION]" not in markdown
    assert outline(html).top[:2] == [("h1", ""), ("div", "alert tip")]
    assert json.loads((tmp_path / "metrics/report.json").read_text()) == metrics


def test_all_planted_problems_are_warned_about_before_anything_else(tmp_path):
    metrics, markdown, html = render(fabricate_project(tmp_path, ALL_PROBLEMS))
    assert metrics["warning_kinds"].split(",") == WARNING_KINDS
    head, rest = markdown.split("## Headline", 1)
    assert markdown_before_first_alert(head).strip() == "# dpledger report"
    assert head.count("> [!CAUTION]") == 4
    for phrase in (
        "ε_emp ≥ 4.2",
        "'poisson' sampler but training used 'shuffle'",
        "minibatch_clipping (p = 1e-4)",
        "failure probability is 0.001",
    ):
        assert phrase in head
    top = outline(html).top
    assert top[0] == ("h1", "")
    assert top[1:5] == [("div", "alert caution")] * 4
    assert html.index("Audit contradicts") < html.index('id="headline"')


@pytest.mark.parametrize(
    "problems, kind",
    [
        (Problems(sampler_mismatch=True), "sampler-mismatch"),
        (Problems(verify_failed=True), "verify-failed"),
        (Problems(audit_contradicted=True), "audit-contradicted"),
        (Problems(mc_failure_probability=2e-6), "mc-failure"),
    ],
)
def test_each_problem_alone_is_the_first_thing_in_both_files(tmp_path, problems, kind):
    metrics, markdown, html = render(fabricate_project(tmp_path, problems))
    assert metrics["warning_kinds"] == kind
    assert markdown.split("\n\n")[1].startswith("> [!CAUTION]")
    assert outline(html).top[1] == ("div", "alert caution")


def test_mc_failure_probability_at_or_below_the_threshold_is_not_a_warning(tmp_path):
    root = fabricate_project(tmp_path, Problems(mc_failure_probability=1e-6))
    assert render(root, mc_failure_warning=1e-6)[0]["warnings"] == 0
    assert render(root, mc_failure_warning=9.9e-7)[0]["warning_kinds"] == "mc-failure"


def test_training_past_the_accounted_budget_is_a_warning(tmp_path):
    root = fabricate_project(tmp_path)
    train = json.loads((root / "metrics/train.json").read_text())
    (root / "metrics/train.json").write_text(
        json.dumps({**train, "epsilon_spent": 3.2, "steps_done": 240})
    )
    metrics, markdown, _ = render(root)
    # 3.2 is not the record's ε either
    assert metrics["warning_kinds"] == "sources-disagree,budget-exceeded"
    assert (
        "Training spent ε = 3.2, more than the claimed ε = 3.001; took 240 steps but the "
        "accountant covered 225" in markdown
    )


def test_audit_above_the_claim_without_a_valid_bound_is_not_a_contradiction(tmp_path):
    """The uncorrected ``max`` threshold's ε_emp is no lower bound: the audit's inconclusive verdict
    stands."""
    root = fabricate_project(tmp_path)
    audit = json.loads((root / "metrics/audit.json").read_text())
    invalid = {
        **audit,
        "epsilon_emp": 9.0,
        "threshold_method": "max",
        "threshold_valid": False,
        "verdict": "inconclusive",
    }
    (root / "metrics/audit.json").write_text(json.dumps(invalid))
    assert "audit-contradicted" not in render(root)[0]["warning_kinds"]
    older = {key: value for key, value in invalid.items() if key != "verdict"}
    (root / "metrics/audit.json").write_text(json.dumps(older))
    assert "audit-contradicted" not in render(root)[0]["warning_kinds"]
    (root / "metrics/audit.json").write_text(json.dumps({**older, "threshold_valid": True}))
    assert "audit-contradicted" in render(root)[0]["warning_kinds"]


def test_sections_come_in_the_order_of_the_issue(tmp_path):
    _, markdown, html = render(fabricate_project(tmp_path, ALL_PROBLEMS))
    positions = [markdown.index(f"\n{heading}\n") for heading in SECTIONS_IN_ORDER]
    assert positions == sorted(positions)
    assert markdown.index("[!CAUTION]") < positions[0]
    html_headings = re.findall(r"<h[23] id=\"[^\"]*\">([^<]*)</h[23]>", html)
    assert [h for h in html_headings if h in {s.split(" ", 1)[1] for s in SECTIONS_IN_ORDER}] == [
        s.split(" ", 1)[1] for s in SECTIONS_IN_ORDER
    ]


def test_headline_shows_claim_audit_verdicts_utility_and_cost(tmp_path):
    _, markdown, _ = render(fabricate_project(tmp_path))
    headline = markdown.split("## Headline", 1)[1].split("###", 1)[0]
    for expected in (
        "ε = 3.001 at δ = 1e-5",  # 3.0000049 rounded up, never down
        "accountant pld",
        "`poisson` used, `poisson` accounted",
        "ε_emp ≥ 0.83",
        "confidence 95 %",
        "observations 100,000",
        "✅ **consistent**",
        "3 / 3 passed",
        "minibatch_clipping p = 0.44",
        "88.61 %",
        "5120 examples/s",
        "training wall time 12.7 s",
    ):
        assert expected in headline, expected


def test_details_show_assumptions_group_epsilon_mechanism_and_defensive_audit_json(tmp_path):
    _, markdown, _ = render(fabricate_project(tmp_path))
    assert "- zero-out adjacency; every intermediate model is released" in markdown
    assert "| `rdp` | 3.41 | 1e-5 | RDP conversion |" in markdown
    # shared assumptions are not repeated
    assert "| `pld` | 3.001 | 1e-5 | as listed above |" in markdown
    assert "| group_size | mog | conversion | linear | note |" in markdown
    assert "| 4 | 13.91 | 15.2 | 12.01 |   |" in markdown  # every group ε rounded up
    assert "| 8 | 31.2 | ∞ | 24.01 | PLD tail |" in markdown
    assert "| `metrics/calibrate.json: mechanism_rmse` | 0.0421 |" in markdown
    assert "| `threat_models.partially_informed.fpr` | 0.01 |" in markdown
    assert "… (5000 items)" in markdown  # a long list is summarised, not dumped
    assert "| `epsilon` | 3.0000049 |" in markdown  # the full-precision metrics listing
    assert "| `ledger.steps` | 225 |" in markdown  # artifacts/train/*.json
    assert (
        "| `opacus_only` | — | — | 0 | ⚪ **skipped** | not applicable to this trainer |"
        in markdown
    )


def test_params_versions_commit_and_reproduction_are_included(tmp_path):
    _, markdown, _ = render(fabricate_project(tmp_path))
    provenance = markdown.split("## Provenance", 1)[1]
    for package in ("dpledger", "torch", "dp-accounting", "numpy", "python"):
        assert f"| {package} | `" in provenance
    assert "| git commit | `unknown` |" in provenance  # tmp_path is no git repository
    assert "group_sizes: [1, 2, 4, 8]" in provenance and "mc_failure_warning: 1.0e-06" in provenance
    assert "make repro" in provenance.split("## Reproduce", 1)[1]


def markdown_image_links(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown) + re.findall(
        r"<img [^>]*src=\"([^\"]+)\"", markdown
    )


def test_committed_report_links_resolve(repo_root):
    report = repo_root / "reports" / "report.md"
    if not report.exists():
        pytest.skip("no reports/report.md in this checkout yet (dvc repro writes it)")
    links = markdown_image_links(report.read_text())
    assert all((report.parent / link).is_file() for link in links), links


def test_every_image_path_in_the_markdown_exists(tmp_path):
    _, markdown, _ = render(fabricate_project(tmp_path))
    links = markdown_image_links(markdown)
    assert len(links) == sum(len(names) for names in PLOTS.values())
    for link in links:
        assert (tmp_path / "reports" / link).is_file(), link
        stage, name = Path(link).name.split("-", 1)
        assert (tmp_path / "reports" / link).read_bytes() == (
            tmp_path / "plots" / stage / name
        ).read_bytes()


def test_html_is_self_contained(tmp_path):
    _, _, html = render(fabricate_project(tmp_path, ALL_PROBLEMS))
    tags = outline(html).tags
    assert not [t for t, _ in tags if t in {"script", "link", "iframe", "object", "embed"}]
    sources = [attrs.get("src") or "" for t, attrs in tags if t == "img"]
    assert len(sources) == 7 and all(src.startswith("data:image/png;base64,") for src in sources)
    assert not [
        attrs for _, attrs in tags if any(k in attrs for k in ("href", "srcset", "background"))
    ]
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "url(" not in style and "@import" not in style and "@font-face" not in style
    assert "default-src 'none'" in html  # the Content-Security-Policy forbids fetching anything


def test_stale_figures_are_removed_on_rerender(tmp_path):
    root = fabricate_project(tmp_path)
    render(root)
    (root / "plots/audit/tradeoff_curve.png").unlink()
    metrics, markdown, _ = render(root)
    assert metrics["figures"] == 6 and "tradeoff_curve" not in markdown
    assert not (root / "reports/figures/audit-tradeoff_curve.png").exists()


@pytest.mark.parametrize(
    "skip", [("verify",), ("audit",), ("train", "verify", "audit"), tuple(PLOTS)]
)
def test_missing_stage_outputs_show_not_run(tmp_path, skip):
    metrics, markdown, html = render(fabricate_project(tmp_path, skip=skip))
    assert metrics["stages_not_run"] == len(skip)
    assert "**Evidence missing.**" in markdown and all(
        f"{stage} (not run)" in markdown for stage in skip
    )
    assert "⚪ **not run**" in markdown and 'class="badge neutral">not run<' in html
    # a notice, neither warning nor all-clear
    assert "[!CAUTION]" not in markdown and "[!TIP]" not in markdown
    assert markdown.split("\n\n")[1].startswith("> [!NOTE]")


def test_unreadable_json_is_reported_not_fatal(tmp_path):
    root = fabricate_project(tmp_path)
    (root / "metrics/audit.json").write_text("{not json")
    (root / "artifacts/verify/verify.json").write_text("[1, 2")
    metrics, markdown, _ = render(root)
    assert metrics["stages_not_run"] == 1
    assert "audit (unreadable:" in markdown
    assert "artifacts/verify/verify.json could not be read" in markdown


def test_user_text_is_escaped(tmp_path):
    root = fabricate_project(tmp_path)
    verify = json.loads((root / "artifacts/verify/verify.json").read_text())
    verify["tests"][0]["diagnosis"] = "a | b <script>alert(1)</script>"
    (root / "artifacts/verify/verify.json").write_text(json.dumps(verify))
    _, markdown, html = render(root, title="<b>PR #12</b>")
    assert "<script>alert" not in html and "&lt;script&gt;" in html and "&lt;b&gt;PR #12" in html
    assert "a \\| b \\<script\\>" in markdown


def test_report_stage_runs_through_the_shared_runner_within_10_seconds(tmp_path):
    root = fabricate_project(tmp_path, ALL_PROBLEMS)
    (root / "params.yaml").write_text(
        (Path(__file__).resolve().parents[2] / "params.yaml").read_text()
    )
    started = time.perf_counter()
    metrics = run_stage("report", root / "params.yaml", root)
    assert time.perf_counter() - started < 10.0
    assert metrics["warnings"] == 4 and (root / "reports/report.html").stat().st_size > 50_000


def test_render_writes_nothing(tmp_path):
    root = fabricate_project(tmp_path)
    report = render_report(load_params(Path(__file__).resolve().parents[2] / "params.yaml"), root)
    assert report.markdown.startswith("# dpledger report") and not (root / "reports").exists()


def _use_plugin_sampler(root: Path, declared: str, train_mismatch: bool | None) -> None:
    header_path = root / "artifacts/schedule/schedule.json"
    header = json.loads(header_path.read_text())
    header.update(sampler="mylib:sampler", sampler_params={"accounted_as": declared})
    header_path.write_text(json.dumps(header))
    schedule = json.loads((root / "metrics/schedule.json").read_text())
    (root / "metrics/schedule.json").write_text(
        json.dumps({**schedule, "sampler": "mylib:sampler"})
    )
    if train_mismatch is None:
        (root / "metrics/train.json").unlink()
    else:
        train = json.loads((root / "metrics/train.json").read_text())
        train.update(sampler_used="mylib:sampler", sampler_mismatch=train_mismatch)
        (root / "metrics/train.json").write_text(json.dumps(train))


def test_plugin_sampler_declared_equivalent_is_a_notice_not_a_warning(tmp_path):
    root = fabricate_project(tmp_path)
    _use_plugin_sampler(root, declared="poisson", train_mismatch=False)
    metrics, markdown, _ = render(root)
    assert metrics["warnings"] == 0
    assert (
        "**Sampler equivalence declared, not proven.** The batches came from the plugin sampler "
        "'mylib:sampler'" in markdown
    )


def test_plugin_declared_as_another_sampler_is_a_mismatch_even_before_training(tmp_path):
    root = fabricate_project(tmp_path)
    _use_plugin_sampler(root, declared="fixed", train_mismatch=None)
    metrics, markdown, _ = render(root)
    assert metrics["warning_kinds"] == "sampler-mismatch"
    assert (
        "training used 'mylib:sampler' (declared equivalent to 'fixed')"
        in markdown.split("## Headline")[0]
    )


def test_nested_metrics_break_dvc_metrics_diff_and_are_flagged(tmp_path):
    root = fabricate_project(tmp_path)
    audit = json.loads((root / "metrics/audit.json").read_text())
    (root / "metrics/audit.json").write_text(json.dumps({**audit, "per_threat_model": {"wc": 1.0}}))
    metrics, markdown, _ = render(root)
    assert metrics["warnings"] == 0 and metrics["notices"] == 1
    assert (
        "**Metrics not flat.** Nested values in metrics/\\*.json (audit.per_threat_model)"
        in markdown
    )
    # report.json itself is flat
    assert all(isinstance(v, (int, float, str, bool)) for v in metrics.values())


def test_a_renderer_that_cannot_draw_every_block_kind_fails_when_defined():
    from dpledger.report.renderer import Renderer

    with pytest.raises(TypeError, match="renderer Partial does not draw: .*figure"):

        class Partial(Renderer):
            def heading(self, block):
                return block.title
