"""report.html as a person sees it: headless Chromium opens it offline; every image loads, nothing
is fetched, the page is not blank, and the warnings are the first thing on it.

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated
JSON on file descriptors 3 and 4), which needs nothing beyond the standard library.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from dpledger.pipeline.report import run
from helpers.browser import CHROMIUM, LOCAL_SCHEMES, open_page
from helpers.report_fixtures import ALL_PROBLEMS, fabricate_project, report_params

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)"
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = fabricate_project(tmp_path_factory.mktemp("project"), ALL_PROBLEMS)
    run(report_params(), root)
    facts, requested, logs, shot = open_page(
        root / "reports" / "report.html", tmp_path_factory.mktemp("chromium")
    )
    keep = os.environ.get("DPLEDGER_REPORT_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(shot)
    return {"root": root, "facts": facts, "requested": requested, "logs": logs, "shot": shot}


def test_every_image_loads_in_chromium(rendered):
    images = rendered["facts"]["images"]
    assert len(images) == 7
    assert all(image["complete"] and image["width"] > 0 for image in images), images


def test_no_request_leaves_the_page(rendered):
    urls = rendered["requested"] + rendered["facts"]["resources"]
    assert rendered["requested"], "the page load itself must be observed"
    assert all(url.startswith(LOCAL_SCHEMES) for url in urls), urls
    blocked = [
        log for log in rendered["logs"] if "entry" in log and log["entry"]["level"] == "error"
    ]
    assert not blocked, blocked


def test_screenshot_is_not_blank(rendered):
    image = np.asarray(Image.open(io.BytesIO(rendered["shot"])).convert("RGB"), dtype=np.int16)
    assert image.shape[0] > 900 and image.shape[1] == 1280
    background = np.median(image.reshape(-1, 3), axis=0)
    differs = np.abs(image - background).sum(axis=2) > 60
    assert differs.mean() > 0.01, "less than 1% of the page differs from its background"
    assert differs.any(axis=1).mean() > 0.3, "most of the page's rows are empty"
    red = (image[..., 0] > 180) & (image[..., 1] < 90) & (image[..., 2] < 90)
    assert red[: image.shape[0] // 3].any(), (
        "the red warning styling is missing from the top of the page"
    )


def test_warning_is_the_first_thing_on_the_page(rendered):
    assert "alert caution" in rendered["facts"]["firstBlock"]
    assert rendered["facts"]["firstText"].startswith("WARNING")


def test_committed_report_html_loads_offline(repo_root, tmp_path):
    html = repo_root / "reports" / "report.html"
    if not html.exists():
        pytest.skip("no reports/report.html in this checkout yet (dvc repro writes it)")
    facts, requested, logs, _ = open_page(html, tmp_path / "chromium")
    assert all(image["complete"] and image["width"] > 0 for image in facts["images"]), facts[
        "images"
    ]
    assert all(url.startswith(LOCAL_SCHEMES) for url in requested + facts["resources"]), requested
    assert not [log for log in logs if "entry" in log and log["entry"]["level"] == "error"]
