"""Named settings for ``fedrec train --preset``: the paper's, and ones found by ``fedrec tune``.

* ``paper``: the faithful settings (the defaults of :mod:`fedrecgel.config`, with the SAM radii
  the authors used on the dataset, :data:`PAPER_RHO`);
* ``tuned-<dataset>``: the best validation settings of a study on that dataset
  (``fedrec tune --save-preset``), stored in ``presets.json`` beside this module with the
  study's figures;
* ``tuned``: ``tuned-<dataset>`` when the dataset has one, else the settings learned across the
  tuned datasets (geometric mean of step sizes and radii, median rounds, the most common
  optimizer), so a new dataset never gets settings picked on its own test set.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

PRESETS_FILE = Path(__file__).with_name("presets.json")
#: settings averaged on a log scale when learned across datasets
_LOG_SCALE = ("server_lr", "client_lr", "rho_sh", "rho_ns")
#: (rho_sh, rho_ns) the authors used per dataset (ALGORITHM.md) where they are not the defaults
#: (FilmTrust's are)
PAPER_RHO: dict[str, tuple[float, float]] = {
    "amazon-video": (0.01, 0.2),
    "lastfm-2k": (0.01, 0.01),
}


class PresetError(ValueError):
    """Unknown preset, or no tuned preset to learn from."""


def stored(path: Path = PRESETS_FILE) -> dict[str, dict[str, Any]]:
    """The presets saved by ``fedrec tune`` (name -> {"settings": ..., "study": ...})."""
    if not path.is_file():
        return {}
    data: dict[str, dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return data


def save(name: str, settings: dict[str, Any], about: dict[str, Any], path: Path) -> None:
    """Store ``settings`` as preset ``name`` (with what the study measured) in ``path``."""
    if not name.startswith("tuned-"):
        raise PresetError(f"a saved preset is named tuned-<dataset>, got {name!r}")
    data = stored(path)
    data[name] = {"settings": settings, "study": about}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def learned_default(presets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Settings learned across every ``tuned-<dataset>`` preset."""
    tuned = [p["settings"] for n, p in sorted(presets.items()) if n.startswith("tuned-")]
    if not tuned:
        raise PresetError("no tuned preset yet: run `fedrec tune --save-preset` first")
    out: dict[str, Any] = {}
    for key in sorted({k for s in tuned for k in s}):
        values = [s[key] for s in tuned if key in s]
        if key in _LOG_SCALE:
            out[key] = math.exp(statistics.fmean(math.log(v) for v in values))
        elif key == "rounds":
            out[key] = int(statistics.median_low(values))
        else:
            out[key] = Counter(values).most_common(1)[0][0]
    return out


def resolve(name: str, dataset: str, path: Path = PRESETS_FILE) -> dict[str, Any]:
    """The TrainConfig settings of preset ``name`` for ``dataset``."""
    if name == "paper":
        rho = PAPER_RHO.get(dataset)
        return {"rho_sh": rho[0], "rho_ns": rho[1]} if rho else {}
    presets = stored(path)
    if name == "tuned":
        own = presets.get(f"tuned-{dataset}")
        return dict(own["settings"]) if own else learned_default(presets)
    if name in presets:
        return dict(presets[name]["settings"])
    known = ["paper", "tuned", *sorted(presets)]
    raise PresetError(f"unknown preset {name!r}; known: {', '.join(known)}")
