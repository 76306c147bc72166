"""The library's import graph points one way: no import circle, and no module importing from a
layer above it.

The layers, bottom first (a module may import its own package and any strictly lower layer; packages
sharing a layer may not import each other):

 0. ``errors``: the house exception types.
 1. ``io``, ``paths``, ``plugins``, ``philox_normal``, ``imports``, ``precision``,
    ``local_folders``, ``quiet``, ``devices``, ``validation``: atomic files, where the stages'
    outputs live, ``module:callable`` loading, the counter-based noise generator, the reading of
    import statements, full-precision guards (autocast, TF32), the refusal of code in model
    folders, the muting of third-party log noise, the one device resolver and the shared validators
    (the house wording of a refused value); each needs only ``errors``.
 2. ``plotting``, ``ledger``: the shared figure style (writes through ``io``); the checkpoints that
    carry the privacy ledger (written through ``io``).
 3. ``mechanisms``: correlation matrices, their RMSE, streaming correlated noise.
 4. ``accounting``: the privacy ledger; it describes mechanisms, so it sits above them (and the
    choice of the correlation matrix by the accountant's σ, ``accounting/optimize.py``, is
    calibration).
 5. ``sampling``: batch samplers, each stating the accounting law it is accounted as.
 6. ``params``, ``seals``: the typed schema of params.yaml (it asks accountants and samplers what is
    allowed); the seals of the calibration record and the schedule, checked by every stage that
    reads them.
 7. ``engine``: the Book-Keeping DP engine.
 8. ``data``: datasets and loaders.
 9. ``models``: the model zoo and tasks (a task knows its data).
10. ``verify``, ``audit``: evidence about a trainer and about the privacy claim.
11. ``report``: renders the artifacts; it reads them, never recomputes them.
12. ``pipeline``: the stage runners, which tie everything together.
13. ``cli``: the console script.

Import statements are read by :mod:`dpledger.imports`, the machinery of the deps test and of the
train stage's code fingerprint: function-level imports count, and a lazy package (``_HOMES``)
imports every module it names.
"""

from __future__ import annotations

from pathlib import Path

from dpledger.imports import imported_modules, module_file

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"dpledger": REPO / "lib", "stages": REPO}

LAYERS = (
    ("errors",),
    (
        "io",
        "paths",
        "plugins",
        "philox_normal",
        "imports",
        "precision",
        "local_folders",
        "quiet",
        "devices",
        "validation",
    ),
    ("plotting", "ledger"),
    ("mechanisms",),
    ("accounting",),
    ("sampling",),
    ("params", "seals"),
    ("engine",),
    ("data",),
    ("models",),
    ("verify", "audit"),
    ("report",),
    ("pipeline",),
    ("cli",),
)
LAYER = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
KNOWN_CIRCLES: dict[tuple[str, str], str] = {}
"""Import edges (package, module) the circle check skips, each with the reason it still stands. None
today: the engine's rule registry moved to engine/layers/registry.py (issue 26), which its rule
modules import instead of the package that imports them."""
LIB = REPO / "lib"
PACKAGE_ROOT = LIB / "dpledger" / "__init__.py"


def module_name(path: Path) -> str:
    """``dpledger.engine.bk`` for lib/dpledger/engine/bk.py, ``dpledger.engine`` for its
    __init__.py."""
    parts = path.relative_to(LIB).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_package(path: Path) -> str:
    """The layer name of a library file: ``engine`` for anything under lib/dpledger/engine/."""
    return path.relative_to(LIB / "dpledger").parts[0].removesuffix(".py")


def import_graph() -> dict[Path, set[Path]]:
    """Each library file and the library files its import statements name (parent packages left
    out)."""
    files = sorted((LIB / "dpledger").rglob("*.py"))
    graph = {}
    for path in files:
        names = imported_modules(path, SOURCE_ROOTS)
        targets = {module_file(name, SOURCE_ROOTS) for name in names}
        graph[path] = {t for t in targets if t is not None and t != path and LIB in t.parents}
    return graph


def without_known_circles(graph: dict[Path, set[Path]]) -> dict[Path, set[Path]]:
    """The graph less the edges of :data:`KNOWN_CIRCLES`."""
    skip = {(package, f"{package}.{module}") for package, module in KNOWN_CIRCLES}
    return {
        source: {t for t in targets if (module_name(source), module_name(t)) not in skip}
        for source, targets in graph.items()
    }


def find_circle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    """One import circle as [a, b, …, a], or None (depth-first search with grey/black marks)."""
    state: dict[Path, str] = {}
    stack: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (circle := visit(target)):
                return circle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def upward_imports(graph: dict[Path, set[Path]]) -> list[str]:
    """Every import from a layer above (or from a peer package of the same layer), as 'a -> b'."""
    found = []
    for source, targets in graph.items():
        for target in targets - {PACKAGE_ROOT}:
            low, high = top_package(target), top_package(source)
            if low != high and LAYER[low] >= LAYER[high]:
                found.append(f"{module_name(source)} -> {module_name(target)}")
    return sorted(found)


def test_every_library_package_has_a_layer():
    files = (LIB / "dpledger").rglob("*.py")
    packages = {top_package(path) for path in files if path != PACKAGE_ROOT}
    assert sorted(packages - set(LAYER)) == [], "add the new package to LAYERS and the docstring"


def test_the_package_root_imports_nothing_of_ours():
    assert import_graph()[PACKAGE_ROOT] == set()


def test_no_import_circle():
    circle = find_circle(without_known_circles(import_graph()))
    assert circle is None, "import circle: " + " -> ".join(module_name(path) for path in circle)


def test_no_module_imports_from_a_layer_above():
    assert upward_imports(import_graph()) == []


def test_each_known_circle_still_stands():
    edges = import_graph().items()
    graph = {module_name(source): {module_name(t) for t in targets} for source, targets in edges}
    gone = [(package, m) for package, m in KNOWN_CIRCLES if f"{package}.{m}" not in graph[package]]
    assert gone == [], f"remove {gone} from KNOWN_CIRCLES: the import is gone"


ENGINE_FORBIDDEN = ("params", "sampling", "io", "pipeline", "audit", "report")
"""What the engine may not import, so that it is a library a user can take alone (with ``errors``,
``precision``, ``devices`` and ``philox_normal`` below it)."""


def engine_imports_of(packages: tuple[str, ...], graph: dict[Path, set[Path]]) -> list[str]:
    """Every import by an engine module of one of ``packages``, as 'a -> b'."""
    engine = LIB / "dpledger" / "engine"
    return sorted(
        f"{module_name(source)} -> {module_name(target)}"
        for source, targets in graph.items()
        if engine in source.parents
        for target in targets
        if target != PACKAGE_ROOT and top_package(target) in packages
    )


def test_the_engine_imports_nothing_of_the_pipeline_side():
    assert engine_imports_of(ENGINE_FORBIDDEN, import_graph()) == []


def test_the_engine_check_catches_an_import_of_io():
    bk, io_file = LIB / "dpledger/engine/bk.py", LIB / "dpledger/io.py"
    graph = {bk: {io_file}}
    assert engine_imports_of(ENGINE_FORBIDDEN, graph) == ["dpledger.engine.bk -> dpledger.io"]


def test_the_checks_catch_a_circle_and_an_upward_import():
    engine, report = LIB / "dpledger/engine/bk.py", LIB / "dpledger/report/inputs.py"
    pipeline = LIB / "dpledger/pipeline/paths.py"
    verify = LIB / "dpledger/verify/flawed_trainers.py"
    assert find_circle({engine: {report}, report: {engine}}) == [engine, report, engine]
    assert upward_imports({report: {pipeline}, verify: {engine}}) == [
        "dpledger.report.inputs -> dpledger.pipeline.paths"
    ]
