"""The report of a language model: the headline reads test perplexity where an image classifier
reads test accuracy, and the loss and perplexity curves render (Markdown and HTML) beside the same ε
evidence."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from dpledger.pipeline.report import run
from helpers.report_fixtures import _png, fabricate_project, report_params


def _lm_project(root: Path) -> Path:
    fabricate_project(root)
    metrics = json.loads((root / "metrics/train.json").read_text())
    del metrics["test_accuracy"]
    metrics.update(
        {"test_perplexity": 123.456, "train_perplexity": 118.2, "test_loss": math.log(123.456)}
    )
    (root / "metrics/train.json").write_text(json.dumps(metrics))
    verify = json.loads((root / "metrics/verify.json").read_text())
    (root / "metrics/verify.json").write_text(
        json.dumps({**verify, "battery_model": "train.model = 'hf' (causal-lm)"})
    )
    shutil.rmtree(root / "plots/train")
    (root / "plots/train").mkdir()
    for name in ("loss", "perplexity"):
        (root / "plots/train" / f"{name}.png").write_bytes(_png("train", name))
        (root / "plots/train" / f"{name}.csv").write_text("step,value\n1,5.0\n2,4.5\n")
    return root


def test_headline_shows_perplexity_and_the_report_holds_its_curves_beside_the_epsilon_evidence(
    tmp_path,
):
    root = _lm_project(tmp_path)
    run(report_params(), root)
    markdown = (root / "reports/report.md").read_text()
    headline = markdown[markdown.index("## Headline") :].split("\n\n")[1]
    assert (
        "| **Test perplexity** | **123.5** |" in headline and "train perplexity 118.2" in headline
    )
    assert "Test accuracy" not in headline
    # which model the implementation tests trained
    assert "on train.model = 'hf' (causal-lm): " in headline
    html = (root / "reports/report.html").read_text()
    for stage, name in (
        ("train", "loss"),
        ("train", "perplexity"),
        ("calibrate", "epsilon_vs_step"),
    ):
        assert (
            f"figures/{stage}-{name}.png" in markdown
            and (root / f"reports/figures/{stage}-{name}.png").stat().st_size
        )
        assert f'alt="{name.replace("_", " ").capitalize().replace("Epsilon", "ε")}"' in html


def test_the_lm_report_loads_in_chromium(tmp_path):
    from helpers import browser

    if browser.CHROMIUM is None:
        pytest.skip("no chromium")
    root = _lm_project(tmp_path / "project")
    run(report_params(), root)
    facts, requested, logs, _ = browser.open_page(
        root / "reports/report.html", tmp_path / "chromium"
    )
    assert all(url.startswith(("file:", "data:")) for url in requested)
    assert not [entry for entry in logs if "exception" in json.dumps(entry).lower()]
    loaded = {image["alt"] for image in facts["images"] if image["complete"] and image["width"] > 0}
    assert {"Loss", "Perplexity", "ε vs step"} <= loaded
