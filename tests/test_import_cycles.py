"""No two modules of the project import each other, directly or through others.

Every ``import`` statement counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a cycle hidden in a function is still a cycle of the design.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedrecgel", "services", "bench", "harness", "tests")


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted name of a source file (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every Python module of the project, by dotted name."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Dotted names an AST imports (``from a import b`` yields ``a.b`` and ``a``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (with the packages that import runs, other
    than its own enclosing packages, which are loaded before it anyway)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        deps: set[str] = set()
        for target in imported_names(tree, name, path.name == "__init__.py"):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in modules and dep != name and dep not in own:
                    deps.add(dep)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (first module repeated at the end), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        return list(err.args[1])
    return None


def test_the_project_has_no_import_cycle() -> None:
    modules = project_modules()
    assert "services.client_sim.worker" in modules and "fedrecgel.sam" in modules
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(reversed(cycle or []))


def sys_path_edits(tree: ast.AST) -> list[int]:
    """Lines of an AST that touch ``sys.path`` (``sys.path.insert(...)``, ``from sys import
    path``)."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "sys"
            and any(alias.name == "path" for alias in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_bench_and_harness_import_nothing_of_the_tests_and_leave_sys_path_alone() -> None:
    """The benchmarks run as ``python -m bench.NAME`` from the repository's root: what they share
    with the tests is in ``harness``, not in ``tests`` (whose conftest and test modules they
    imported), and nothing edits ``sys.path`` to reach a sibling module by its bare name."""
    offenders = []
    for name, path in project_modules().items():
        if name.split(".")[0] not in ("bench", "harness"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(ROOT)
        imported = imported_names(tree, name, path.name == "__init__.py")
        offenders += [f"{rel}: imports {n}" for n in sorted(imported) if n.split(".")[0] == "tests"]
        offenders += [f"{rel}:{line}: sys.path" for line in sys_path_edits(tree)]
    assert "bench.report" in project_modules() and "harness.loopback" in project_modules()
    assert offenders == []


def test_the_check_sees_an_import_of_the_tests_and_a_sys_path_edit() -> None:
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nfrom tests.support import loopback\n")
    assert sys_path_edits(tree) == [2]
    assert "tests.support.loopback" in imported_names(tree, "bench.x", False)


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "services"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from services.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from services import a\n    return a\n")
    (pkg / "c.py").write_text("import services.a\n")
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.glob("*.py"))}
    graph = import_graph(modules)
    assert graph["services.c"] == {"services.a"}
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"services.a", "services.b"}
