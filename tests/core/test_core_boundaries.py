"""The core library stays free of HTTP, database and Redis code, and of unsafe deserialisation."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import fedrecgel

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


def test_importing_every_core_module_pulls_in_no_service_dependency():
    mods = [m.name for m in pkgutil.iter_modules(fedrecgel.__path__, "fedrecgel.")]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core imports service packages: {out.stdout}"
    assert "fedrecgel.cli" in mods and "fedrecgel.sam" in mods


def test_no_pickle_or_torch_load_anywhere_in_the_project():
    root = Path(__file__).resolve().parents[1]
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
