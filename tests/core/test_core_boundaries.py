"""The core library stays free of the services, of HTTP, database and Redis code, and of unsafe
deserialisation."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import fedrecgel

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "sqlalchemy",
    "alembic",
    "redis",
    "psycopg",
)


def package_imports(package: Path) -> list[tuple[str, int, str]]:
    """(file, line, imported module) of every import statement in every module of the package
    at ``package``, at any depth (inside functions too), relative imports resolved."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] != "__init__":
            parts = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            if isinstance(node, ast.Import):
                out += [(str(rel), node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts[: len(parts) - node.level + 1]
                    name = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    name = node.module or ""
                out.append((str(rel), node.lineno, name))
    return out


def test_no_core_module_imports_the_services_or_their_dependencies_even_lazily() -> None:
    found = package_imports(ROOT / "fedrecgel")
    bad = [
        f"{file}:{line}: {name}"
        for file, line, name in found
        if name.split(".")[0] in ("services", "tests", *FORBIDDEN)
    ]
    assert bad == []
    # the scan sees imports inside functions (matplotlib is only ever imported in one)
    assert "matplotlib" in {n for _, _, n in found}
    assert len({f for f, _, _ in found}) >= 10


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "core"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "m.py").write_text(
        "def f():\n    from services.launcher import up\n    import redis\n"
        "    from .. import other\n    from .x import y\n"
    )
    assert [(n, line) for _, line, n in package_imports(pkg)] == [
        ("services.launcher", 2),
        ("redis", 3),
        ("core", 4),
        ("core.sub.x", 5),
    ]


def test_importing_every_core_module_pulls_in_no_service_dependency() -> None:
    mods = [
        m.name
        for m in pkgutil.walk_packages(fedrecgel.__path__, "fedrecgel.")
        if "datasets" not in m.name
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {(*FORBIDDEN, 'services')!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core imports service packages: {out.stdout}"
    assert "fedrecgel.cli" in mods and "fedrecgel.sam" in mods


def test_no_pickle_or_torch_load_anywhere_in_the_project() -> None:
    root = ROOT
    hits = []
    for path in [
        *root.glob("fedrecgel/**/*.py"),
        *root.glob("services/**/*.py"),
        *root.glob("bench/**/*.py"),
    ]:
        text = path.read_text()
        # spelled in pieces so that this file does not itself match a search for them
        for needle in ("import pickle", "torch." + "load(", "pickle." + "load"):
            if needle in text:
                hits.append(f"{path.relative_to(root)}: {needle}")
    assert hits == []
