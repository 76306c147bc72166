"""dvc.yaml's deps are each stage's real import closure: every lib/ and stages/ file a stage can
import is covered by one of its deps, and no code dep is unused (so `dvc repro` reruns exactly what
a change affects)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpledger.imports import import_closure

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = {"dpledger": REPO / "lib", "stages": REPO}
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def stage_closure(stage: str) -> set[Path]:
    """The stage entrypoint's closure, plus its runner: ``run_stage`` imports
    dpledger.pipeline.<stage> by name."""
    start = [REPO / "stages" / f"{stage}.py"]
    runner = REPO / "lib/dpledger/pipeline" / f"{stage}.py"
    return import_closure(start + ([runner] if runner.is_file() else []), SOURCE_ROOTS)


def code_deps(stage: str) -> list[Path]:
    """The stage's deps that are code (under lib/ or stages/)."""
    deps = [REPO / dep for dep in STAGES[stage]["deps"]]
    return [dep for dep in deps if dep.relative_to(REPO).parts[0] in ("lib", "stages")]


def test_the_closure_follows_function_level_imports_and_parent_packages():
    closure = stage_closure("audit")
    # imported inside run() when audit.dpsgd is set
    assert REPO / "lib/dpledger/audit/dpsgd.py" in closure
    assert REPO / "lib/dpledger/__init__.py" in closure and REPO / "stages/_entry.py" in closure


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_imported_file_is_a_dep_of_the_stage(stage):
    deps = code_deps(stage)
    uncovered = sorted(
        str(f.relative_to(REPO))
        for f in stage_closure(stage)
        if f.name != "__init__.py" or f.parent != REPO / "lib/dpledger"
        if not any(f == dep or dep in f.parents for dep in deps)
    )
    assert uncovered == [], f"dvc.yaml stage {stage} misses deps for {uncovered}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_code_dep_is_unused(stage):
    closure = stage_closure(stage)
    unused = [
        str(dep.relative_to(REPO))
        for dep in code_deps(stage)
        if not any(f == dep or dep in f.parents for f in closure)
    ]
    assert unused == [], f"dvc.yaml stage {stage} lists code it never imports: {unused}"


def test_the_training_fingerprint_covers_every_library_file_the_train_stage_imports():
    from dpledger.pipeline import train_prepare

    code = {path.resolve() for path in train_prepare.training_code()}
    library = [path for path in stage_closure("train") if (REPO / "lib") in path.parents]
    missing = sorted(str(path.relative_to(REPO)) for path in library if path.resolve() not in code)
    assert missing == [], f"a change to {missing} would not restart a resumed training run"
    noise_generator = REPO / "lib/dpledger/philox_normal.py"  # left engine/ once, and was missed
    assert noise_generator.resolve() in code


def test_every_stage_param_is_a_params_yaml_section_whatever_the_data_dir():
    """A stage's ``params`` name sections of params.yaml, never a path: the report listed
    ``${data_dir}``, which is the section ``data`` only while dvc-vars.yaml's data_dir is ``data``;
    with the LM example's ``examples/lm/data`` (make lm) DVC stopped with "Parameters
    'examples/lm/data' are missing"."""
    sections = set(yaml.safe_load((REPO / "params.yaml").read_text()))
    for name, stage in STAGES.items():
        for param in stage.get("params", []):
            assert isinstance(param, str) and "${" not in param, (name, param)
            assert param.split(".")[0] in sections, (name, param)
