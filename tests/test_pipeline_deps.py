"""dvc.yaml's deps are each stage's real import closure: every lib/ and stages/ file a stage can import is
covered by one of its deps, and no code dep is unused (so `dvc repro` reruns exactly what a change affects)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"dpledger": REPO / "lib", "stages": REPO}
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def module_file(name: str) -> Path | None:
    """The file of module ``name`` if it is ours (dpledger.* or stages.*), else None."""
    root = SOURCE_ROOTS.get(name.split(".")[0])
    if root is None:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, at any depth (function-level imports count:
    they run when the function does): ``from m import x`` names ``m.x`` where that is one of our modules,
    else ``m``; a package that loads its names lazily from a ``_HOMES`` table counts as importing every
    module it names. Parent packages are not named (importing them is the closure's business)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_HOMES" for t in node.targets):
            package = ".".join(path.relative_to(SOURCE_ROOTS["dpledger"]).parent.parts)
            names |= {f"{package}.{home.value}" for home in node.value.values}  # a lazy package (PEP 562)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if module_file(submodule) else node.module)
    return names


def import_closure(start: list[Path]) -> set[Path]:
    """Our files reachable from ``start``; importing a.b.c runs a/__init__.py and a/b/__init__.py too."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            todo += [f for i in range(1, len(parts) + 1) if (f := module_file(".".join(parts[:i]))) and f not in seen]
    return seen


def stage_closure(stage: str) -> set[Path]:
    """The stage entrypoint's closure, plus its runner: ``run_stage`` imports dpledger.pipeline.<stage> by name."""
    start = [REPO / "stages" / f"{stage}.py"]
    runner = REPO / "lib/dpledger/pipeline" / f"{stage}.py"
    return import_closure(start + ([runner] if runner.is_file() else []))


def code_deps(stage: str) -> list[Path]:
    """The stage's deps that are code (under lib/ or stages/)."""
    deps = [REPO / dep for dep in STAGES[stage]["deps"]]
    return [dep for dep in deps if dep.relative_to(REPO).parts[0] in ("lib", "stages")]


def test_the_closure_follows_function_level_imports_and_parent_packages():
    closure = stage_closure("audit")
    assert REPO / "lib/dpledger/audit/dpsgd.py" in closure  # imported inside run() when audit.dpsgd is set
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
        str(dep.relative_to(REPO)) for dep in code_deps(stage) if not any(f == dep or dep in f.parents for f in closure)
    ]
    assert unused == [], f"dvc.yaml stage {stage} lists code it never imports: {unused}"
