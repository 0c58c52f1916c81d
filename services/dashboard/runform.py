"""The start-a-run form, derived from the run configuration's own schema: every field of
:class:`~fedrecgel.run_config.RunConfig` with its default, bounds and description as the core
config declares them (no default is written here again), filled with a shipped preset's
settings as ``fedrec up`` takes them (the ``default`` preset first: the run settings' own
defaults are the paper's, which at FilmTrust's 100 rounds rank about as popularity does), but
for ``eval_every``: the form keeps the run settings' evaluation every round, which the charts
show (``fedrec up`` evaluates every 10th)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

from fedrecgel.config import SIMULATOR_ONLY
from fedrecgel.presets import PRESETS_FILE, over_http, stored
from fedrecgel.run_config import RunConfig

#: the form's two groups of inputs
TRAINING = "Model, training and rounds"
PRIVACY = "Privacy: differential privacy and secure aggregation"


def is_privacy_setting(name: str) -> bool:
    """Whether a run setting shapes the run's privacy (the dp_*, secagg_* settings, the
    target epsilon, the cohort sampling that the accounting depends on)."""
    return name.startswith(("dp_", "secagg_", "secure_aggregation")) or name in (
        "target_epsilon",
        "sampling",
    )


@dataclass(frozen=True)
class FormField:
    """One input of the form."""

    name: str
    label: str
    help: str
    kind: str  # "integer", "number", "choice", "boolean", "text"
    default: Any  # the run settings' own (what a preset that leaves the field out gives)
    value: Any  # what the form shows first: the default preset's, else ``default``
    required: bool
    optional: bool  # may be left empty (null)
    minimum: float | None
    maximum: float | None
    exclusive_minimum: bool
    choices: tuple[str, ...]
    max_length: int | None
    group: str

    @property
    def step(self) -> str:
        """The HTML ``step`` of a number input."""
        return "1" if self.kind == "integer" else "any"


def _field(name: str, spec: dict[str, Any], required: bool, first: dict[str, Any]) -> FormField:
    optional = False
    if "anyOf" in spec:  # X | None
        options = [s for s in spec["anyOf"] if s.get("type") != "null"]
        optional = len(options) < len(spec["anyOf"])
        spec = {**spec, **options[0]}
    kind = {"integer": "integer", "number": "number"}.get(spec.get("type", ""), "text")
    if "enum" in spec:
        kind = "choice"
    if spec.get("type") == "boolean":  # a switch: a choice of the two JSON values
        spec = {
            **spec,
            "enum": ["true", "false"],
            "default": "true" if spec["default"] else "false",
        }
        kind = "boolean"
    minimum = spec.get("minimum", spec.get("exclusiveMinimum"))
    default = spec.get("default")
    return FormField(
        name=name,
        label=spec.get("title", name),
        help=spec.get("description", ""),
        kind=kind,
        default=default,
        value=first.get(name, default),
        required=required,
        optional=optional,
        minimum=minimum,
        maximum=spec.get("maximum", spec.get("exclusiveMaximum")),
        exclusive_minimum="exclusiveMinimum" in spec,
        choices=tuple(spec.get("enum", ())),
        max_length=spec.get("maxLength"),
        group=PRIVACY if is_privacy_setting(name) else TRAINING,
    )


#: the preset the form shows first
FIRST_PRESET = "default"


def _shown(value: Any) -> Any:
    """A switch's value as its select shows it."""
    return ("true" if value else "false") if isinstance(value, bool) else value


@functools.cache
def form_presets() -> dict[str, dict[str, Any]]:
    """The settings each preset fills the form with, by name: the shipped presets (the private
    preset's clip norm fixed, as the aggregator keeps it, and as ``fedrec up`` takes it), and
    ``paper``, the run settings' own defaults (the paper's, with FilmTrust's radii); a field a
    preset leaves out takes the run settings' default. Read once (the shipped file); not to be
    changed by callers."""
    out: dict[str, dict[str, Any]] = {FIRST_PRESET: {}, "paper": {}}
    for name, preset in stored(PRESETS_FILE).items():
        out[name] = {k: _shown(v) for k, v in over_http(preset["settings"]).items()}
    return out


def run_form_fields() -> list[FormField]:
    """The form's inputs: the catalogue size first, then the run settings in their order
    (those only the simulator runs left out: the aggregator refuses them)."""
    schema = RunConfig.model_json_schema()
    required = set(schema.get("required", ()))
    props = {n: p for n, p in schema["properties"].items() if n not in SIMULATOR_ONLY}
    order = sorted(props, key=lambda n: (n not in required, list(props).index(n)))
    first = form_presets()[FIRST_PRESET]
    return [_field(n, props[n], n in required, first) for n in order]


def run_form_groups() -> list[tuple[str, list[FormField]]]:
    """The form's inputs in their groups: training first, then privacy."""
    fields = sorted(run_form_fields(), key=lambda f: f.group == PRIVACY)
    return [(g, list(fs)) for g, fs in itertools.groupby(fields, key=lambda f: f.group)]
