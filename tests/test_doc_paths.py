"""Every project path the documentation, the compose file, the deployment files and the scripts
name exists (docker-compose.yml pointed to a docs/DATASETS.md the project does not have)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a path under one of the project's folders, as the text writes it (placeholders skipped)
PATH = re.compile(
    r"(?<![\w./-])((?:docs|bench|harness|deploy|scripts|services|fedrecgel|tests|loadtest)/[\w./-]*\w)"
)


def _texts() -> list[Path]:
    files = [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), ROOT / "docker-compose.yml"]
    files += [p for p in (ROOT / "deploy").rglob("*") if p.is_file()]
    return [*files, *ROOT.glob("scripts/*.sh")]


def test_every_project_path_named_in_the_docs_exists() -> None:
    missing = []
    for path in _texts():
        text = path.read_text(errors="replace")
        for m in PATH.finditer(text):
            placeholder = text[m.end() : m.end() + 1] in ("<", "*", "{")  # docs/<name>.md
            if not placeholder and not (ROOT / m.group(1)).exists():
                missing.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
    assert not missing, missing
