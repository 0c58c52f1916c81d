"""The image carries the packages and three deploy scripts, and no test code: the build context
admits nothing of tests/, bench/ or harness/ (the helpers the two share), and no module of the
packages imports a test tool."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = {
    "pytest",
    "hypothesis",
    "schemathesis",
    "locust",
    "tests",
    "bench",
    "harness",
    "fastapi.testclient",
}


def _admitted(path: str, rules: list[str]) -> bool:
    """Docker's .dockerignore semantics: the last matching rule wins; ``!`` re-admits."""
    admitted = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.rstrip("/")
        if (
            fnmatch.fnmatch(path, pattern)
            or path.startswith(pattern + "/")
            or fnmatch.fnmatch(path, pattern.replace("**/", "*/"))
        ):
            admitted = negate
    return admitted


def test_the_build_context_admits_no_test_code() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (
        "tests/conftest.py",
        "tests/support/loopback.py",
        "harness/loopback.py",
        "bench/speed.py",
        "loadtest/locustfile.py",
        "docs/API.md",
        ".env",
    ):
        assert not _admitted(path, rules), path
    assert _admitted("fedrecgel/model.py", rules) and _admitted("services/cli.py", rules)
    copies = [
        line
        for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY") and "--from=" not in line
    ]
    for line in copies:
        assert not any(folder in line for folder in ("tests", "bench", "harness")), line


def test_no_package_module_imports_a_test_tool() -> None:
    offenders = []
    for package in ("fedrecgel", "services"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    if name in TEST_ONLY or name.split(".")[0] in TEST_ONLY - {
                        "fastapi.testclient"
                    }:
                        offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
