"""Named settings for ``fedrec train --preset``: the paper's, and ones found by ``fedrec tune``.

* ``paper``: the faithful settings (the defaults of :mod:`fedrecgel.config`, with the SAM radii
  the authors used on the dataset, :data:`PAPER_RHO`);
* ``tuned-<dataset>``: the best validation settings of a study on that dataset
  (``fedrec tune --save-preset``), with the study's figures: the shipped ones in
  ``presets.json`` beside this module (package data, never written), the user's own in
  :func:`user_presets_file` (or a file they name), which win over shipped ones of the same name;
* ``default``: what ``fedrec train`` runs when no preset is named: settings chosen across the
  shipped datasets on validation items only (``presets.json``, its ``rule`` says how; the
  leave-one-dataset-out check is ``bench/default_rule.py``);
* ``private``: what ``fedrec train`` runs when no preset is named and the run is
  differentially private (``presets.json``, its ``rule`` says how it was chosen): server SGD
  with momentum (a server Adam scales DP noise up to the signal's size on every coordinate),
  adaptive clipping, fewer rounds, Poisson cohorts, and the popularity prior under 0.9 of the
  budget;
* ``tuned``: ``tuned-<dataset>`` when the dataset has one, else ``default`` (chosen across
  datasets with a leave-one-dataset-out check), else, in a presets file without a default, the
  settings learned across its tuned datasets (geometric mean of step sizes and radii, median
  rounds, the most common optimizer); a new dataset never gets settings picked on its own
  test set.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from fedrecgel.config import current_names

#: the presets shipped with the package (read only)
PRESETS_FILE = Path(__file__).with_name("presets.json")
#: settings averaged on a log scale when learned across datasets
_LOG_SCALE = ("server_lr", "client_lr", "rho_sh", "rho_ns")
#: (rho_sh, rho_ns) the authors used per dataset (the paper's settings) where they are not the defaults
#: (FilmTrust's are)
PAPER_RHO: dict[str, tuple[float, float]] = {
    "amazon-video": (0.01, 0.2),
    "lastfm-2k": (0.01, 0.01),
}


#: the run settings (RunParams fields) a preset may set
PRESET_FIELDS = (
    "server_lr",
    "client_lr",
    "rounds",
    "optimizer",
    "rho_sh",
    "rho_ns",
    "local_steps",
    "client_weight_decay",
    "server_beta1",
    "server_beta2",
    "server_momentum",
    "server_warmup",
    "server_decay",
    "server_weight_decay",
    "n_negatives",
    "factor",
    "layers",
    "fraction",
    "weighting",
    "sampling",
    "dp_clip",
    "dp_clip_quantile",
    "dp_prior_share",
    "dp_prior_items",
    "rank_fit_steps",
    "rank_fit_lr",
)


#: the private preset's clip norm where it cannot adapt (over HTTP: the aggregator keeps C fixed):
#: the median upload norm bench/dp_scale.py measured, the C of the DP rows in docs/RESULTS.md
FIXED_PRIVATE_CLIP = 0.25


def over_http(settings: dict[str, Any]) -> dict[str, Any]:
    """A preset's ``settings`` as a run over HTTP takes them: the aggregator keeps the clip norm
    fixed and refuses an adaptive one (``dp_clip_quantile``, simulator only), so a preset that
    adapts it from a ``dp_clip`` gets :data:`FIXED_PRIVATE_CLIP` instead."""
    out = dict(settings)
    if out.pop("dp_clip_quantile", None) is not None and "dp_clip" in out:
        out["dp_clip"] = FIXED_PRIVATE_CLIP
    return out


class PresetError(ValueError):
    """Unknown preset, or no tuned preset to learn from."""


def user_presets_file() -> Path:
    """Where ``fedrec tune --save-preset`` saves by default, and ``fedrec train --preset``
    looks besides the shipped presets: ``presets.json`` in the user's configuration folder
    (``$XDG_CONFIG_HOME/fedrecgel``, else ``~/.config/fedrecgel`` on Linux)."""
    return Path(typer.get_app_dir("fedrecgel")) / "presets.json"


def stored(*paths: Path) -> dict[str, dict[str, Any]]:
    """The presets saved by ``fedrec tune`` (name -> {"settings": ..., "study": ...}) in
    ``paths`` (default: the shipped ones, then the user's), a later file's winning over an
    earlier one's of the same name; a missing file holds none. Settings saved under an older
    name are read by their name now (:func:`fedrecgel.config.current_names`)."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths or (PRESETS_FILE, user_presets_file()):
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # a folder, no permission, not UTF-8 JSON
            raise PresetError(f"cannot read presets from {path}: {err}") from None
        if not isinstance(data, dict) or not all(
            isinstance(p, dict) and isinstance(p.get("settings"), dict) for p in data.values()
        ):
            raise PresetError(
                f"{path} is not a presets file (an object of name -> {{'settings': {{...}}}})"
            )
        out.update({n: {**p, "settings": current_names(p["settings"])} for n, p in data.items()})
    return out


def check_target(name: str, path: Path) -> dict[str, dict[str, Any]]:
    """The presets already in ``path``, after checking that preset ``name`` may be saved there
    (PresetError otherwise); ``fedrec tune`` asks before its study, not after."""
    if not name.startswith("tuned-"):
        raise PresetError(f"a saved preset is named tuned-<dataset>, got {name!r}")
    if path.resolve().is_relative_to(PRESETS_FILE.parent.resolve()):
        raise PresetError(
            f"{path} is inside the installed package; save presets elsewhere (the default is "
            f"{user_presets_file()})"
        )
    return stored(path)


def save(name: str, settings: dict[str, Any], about: dict[str, Any], path: Path) -> None:
    """Store ``settings`` as preset ``name`` (with what the study measured) in ``path``
    (created with its folder; replaced whole, never left half written). The package's own
    files are refused: a preset of the user's is no change to the installed package."""
    data = check_target(name, path)
    data[name] = {"settings": settings, "study": about}
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise PresetError(f"cannot save presets in {path}: {err.strerror or err}") from None


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


def resolve(name: str, dataset: str, *paths: Path) -> dict[str, Any]:
    """The run settings of preset ``name`` for ``dataset``, from ``paths`` (see :func:`stored`)."""
    if name == "paper":
        rho = PAPER_RHO.get(dataset)
        return {"rho_sh": rho[0], "rho_ns": rho[1]} if rho else {}
    presets = stored(*paths)
    if name == "default" and name not in presets:
        raise PresetError(f"no default preset in {', '.join(map(str, paths))}")
    if name == "tuned":
        own = presets.get(f"tuned-{dataset}") or presets.get("default")
        return dict(own["settings"]) if own else learned_default(presets)
    if name in presets:
        return dict(presets[name]["settings"])
    known = ["paper", "tuned", *sorted(n for n in presets if n not in ("paper", "tuned"))]
    raise PresetError(f"unknown preset {name!r}; known: {', '.join(known)}")


def run_settings(name: str, dataset: str, *paths: Path) -> dict[str, Any]:
    """Preset ``name``'s settings for ``dataset`` (RunParams fields, what a run config over
    HTTP carries), from the shipped presets, the user's and ``paths``; PresetError for an
    unknown preset or a setting a preset may not set."""
    files = (PRESETS_FILE, user_presets_file(), *paths)
    settings = resolve(name, dataset, *files)
    if unknown := sorted(set(settings) - set(PRESET_FIELDS)):
        raise PresetError(
            f"preset {name}: unknown setting(s) {', '.join(unknown)}; a preset sets "
            f"{', '.join(PRESET_FIELDS)}"
        )
    return settings


def preset_note(name: str, dataset: str, *paths: Path) -> str | None:
    """One line on what preset ``name`` gives ``dataset`` where a run could not tell it
    otherwise (None where the name says it all): which preset ``tuned`` took (the dataset's
    own, else ``default``, else settings learned across the tuned ones), that a
    ``tuned-<dataset>`` preset was tuned on another dataset, or that its study did not beat
    popularity on validation (saved with ``fedrec tune --save-preset --force``). Read from the
    shipped presets, the user's and ``paths``, as :func:`run_settings` reads them."""
    presets = stored(PRESETS_FILE, user_presets_file(), *paths)
    if name == "tuned":
        own = f"tuned-{dataset}"
        if own in presets:
            poor = _below_popularity(presets[own])
            return f"preset tuned: using {own}" + (f"; warning: {poor}" if poor else "")
        if "default" in presets:
            return f"preset tuned: no {own} preset saved; using the default preset"
        tuned = ", ".join(sorted(n for n in presets if n.startswith("tuned-")))
        return f"preset tuned: no {own} preset saved; using the settings learned across {tuned}"
    if not name.startswith("tuned-") or name not in presets:
        return None
    tuned_on = (presets[name].get("study") or {}).get("dataset") or name.removeprefix("tuned-")
    problems = [
        *([f"was tuned on {tuned_on}, not {dataset}"] if tuned_on != dataset else []),
        *([poor] if (poor := _below_popularity(presets[name])) else []),
    ]
    return f"warning: preset {name} " + "; ".join(problems) if problems else None


def _below_popularity(preset: dict[str, Any]) -> str | None:
    """What is wrong with a preset whose study recorded a best validation HR@10 not above
    popularity's on the same items (saved with --force); None otherwise, or when its study
    did not record popularity's figure (saved before it did)."""
    study = preset.get("study") or {}
    best, pop = study.get("validation_hr@10"), study.get("popularity_validation_hr@10")
    if best is None or pop is None or best > pop:
        return None
    return (
        f"its study reached validation HR@10 {best:.4f}, not above popularity's {pop:.4f} "
        "(saved with --force)"
    )


def shown_defaults(fields: dict[str, Any]) -> dict[str, str]:
    """What a command's help shows as the default of each run setting a shipped ``default`` or
    ``private`` preset sets (``fields``: the settings' own defaults): the value a run takes when
    no --preset is named, the default preset's, and the private preset's where a DP run takes
    another. Settings neither sets keep their own default's display."""
    default, private = (resolve(name, "", PRESETS_FILE) for name in ("default", "private"))
    out: dict[str, str] = {}
    for name in (n for n in fields if n in default or n in private):
        value = default.get(name, fields[name])
        text = f"{'none' if value is None else value}" + (": default preset" * (name in default))
        if name in private and private[name] != value:
            text += f"; {private[name]}: private preset"
        out[name] = text
    return out
