"""Export a tuning study (``fedrec tune``'s SQLite file) to JSON for the results page: every
trial's settings, state, validation value and intermediate reports (best validation HR@10 so
far, by round).

    .venv/bin/python -m bench.export_study runs/tune/<study>.db [--study NAME]

Writes bench/results/accuracy/studies/<study>.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from bench.bench_cli import fail

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "accuracy" / "studies"


def export(db: Path, name: str | None = None) -> dict[str, Any]:
    """The study's trials as a JSON-ready dict."""
    storage = f"sqlite:///{db.resolve()}"
    names = optuna.get_all_study_names(storage)
    name = name or (names[0] if names else None)
    if name not in names:
        raise LookupError(f"{db} holds no study {name or ''}".rstrip() + f" (it holds {names})")
    study = optuna.load_study(study_name=name, storage=storage)
    return {
        "study": name,
        "trials": [
            {
                "number": t.number,
                "state": t.state.name,
                "params": t.params,
                "value": t.value,
                "reports": {str(k): v for k, v in sorted(t.intermediate_values.items())},
            }
            for t in study.get_trials(deepcopy=False)
        ],
    }


def main(db: Path, study: str | None = None) -> None:
    if not db.is_file():  # opening it would create an empty database there
        raise fail(f"{db}: no such file (a study's SQLite file, from fedrec tune)")
    try:
        data = export(db, study)
    except LookupError as err:
        raise fail(str(err)) from None
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{data['study']}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{data['study']}: {len(data['trials'])} trials")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
