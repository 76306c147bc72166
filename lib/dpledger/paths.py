"""Where each stage's outputs live under the project root: declared once, read by the stages and
the report.

It sits at the package root, below both ``pipeline`` (which writes these files) and ``report``
(which reads them), so the report never imports the pipeline. The same paths appear in
``dvc.yaml`` (outs, metrics, plots).
"""

from __future__ import annotations

from pathlib import Path

ARTIFACTS = Path("artifacts")
CALIBRATION_DIR = ARTIFACTS / "calibration"
CALIBRATION = CALIBRATION_DIR / "calibration.json"
SCHEDULE_DIR = ARTIFACTS / "schedule"
SCHEDULE_HEADER = SCHEDULE_DIR / "schedule.json"
TRAIN_DIR = ARTIFACTS / "train"
PUBLISHED_DIR = ARTIFACTS / "model"  # the model to share, with its card (models/publish.py)
VERIFY_DIR = ARTIFACTS / "verify"
VERIFY = VERIFY_DIR / "verify.json"
AUDIT_DIR = ARTIFACTS / "audit"
AUDIT = AUDIT_DIR / "audit.json"


def metrics(stage: str) -> Path:
    """The stage's flat metrics (``dvc metrics diff``)."""
    return Path("metrics") / f"{stage}.json"


def plots(stage: str) -> Path:
    """The stage's plots folder (CSV and PNG, ``dvc plots diff``)."""
    return Path("plots") / stage
