"""Which of our source files a file can import, read from its import statements (none is run).

One function serves every list of code that must follow the real imports: the train stage's
fingerprint of the code a step depends on, ``dvc.yaml``'s deps
(``tests/pipeline/test_pipeline_deps.py``) and the import layers (``tests/test_import_layers.py``).
Function-level imports count (they run when the function does), and a package that loads its names
lazily from a ``_HOMES`` table (PEP 562) counts as importing every module it names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1]
"""The folder holding the ``dpledger`` package (``lib/`` in the repository)."""
ROOTS: Mapping[str, Path] = {"dpledger": LIBRARY}
"""Top-level package name -> the folder holding it: the code that counts as ours."""


def module_file(name: str, roots: Mapping[str, Path] = ROOTS) -> Path | None:
    """The file of module ``name`` if it is ours (its top package is in ``roots``), else None."""
    root = roots.get(name.split(".")[0])
    if root is None:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path, roots: Mapping[str, Path]) -> str:
    """The dotted package a file of ours lives in (``dpledger.accounting`` for its __init__.py)."""
    for top, root in roots.items():
        if (root / top) in path.parents:
            return ".".join(path.relative_to(root).parent.parts)
    raise ValueError(f"{path} is not under any of {dict(roots)}")


def _is_homes_table(node: ast.AST) -> bool:
    """``_HOMES = {...}``: a lazy package's name -> module table."""
    targets = node.targets if isinstance(node, ast.Assign) else []
    return any(getattr(target, "id", None) == "_HOMES" for target in targets)


def imported_modules(path: Path, roots: Mapping[str, Path] = ROOTS) -> set[str]:
    """Every module an import statement in ``path`` names, at any depth: ``from m import x`` names
    ``m.x`` where that is one of our modules, else ``m``. Parent packages are not named (see
    :func:`import_closure`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if _is_homes_table(node):
            package = _package_of(path, roots)
            names |= {f"{package}.{home.value}" for home in node.value.values}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if module_file(submodule, roots) else node.module)
    return names


def import_closure(start: Iterable[Path], roots: Mapping[str, Path] = ROOTS) -> set[Path]:
    """Our files reachable from ``start`` (included); importing a.b.c runs a/__init__.py and
    a/b/__init__.py too, so those count."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, roots):
            parts = name.split(".")
            prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            files = (module_file(prefix, roots) for prefix in prefixes)
            todo += [f for f in files if f is not None and f not in seen]
    return seen
