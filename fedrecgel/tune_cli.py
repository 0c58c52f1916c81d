"""``fedrec tune``: search a dataset's settings on validation only, resumably, and save them as a
preset (see :mod:`fedrecgel.tune` and :mod:`fedrecgel.presets`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedrecgel.clitools import (
    DatasetOption,
    config_error,
    console,
    fail,
    load_data,
    out_dir,
    parse_seeds,
    run_option_help,
)
from fedrecgel.config import DEFAULTS, ConfigError, RunParams, check
from fedrecgel.data import DataError, Split
from fedrecgel.presets import PresetError, check_target, save, user_presets_file
from fedrecgel.simulate import TrainConfig
from fedrecgel.tune import ROUND_CHOICES, TuneSpec, best_settings, finished, tune

#: federated methods a study can tune
TUNABLE = ("fedrecgel", "fedncf", "fedmf")


def tune_command(
    dataset: DatasetOption = DEFAULTS.dataset,
    data_dir: Annotated[Path | None, typer.Option(help="Folder with the raw datasets.")] = None,
    protocol: Annotated[str, typer.Option(help="paper or clean (see fedrec train).")] = "paper",
    split_dir: Annotated[
        Path | None, typer.Option(help="A ready split instead (see fedrec train).")
    ] = None,
    method: Annotated[str, typer.Option(help=f"One of {', '.join(TUNABLE)}.")] = "fedrecgel",
    trials: Annotated[int, typer.Option(min=1, max=10_000, help="Trials in all.")] = 30,
    seeds: Annotated[
        str, typer.Option(help="Tuning seeds (keep them apart from the seeds you report).")
    ] = "100",
    rounds: Annotated[
        str, typer.Option(help="Round counts a trial may choose, comma-separated.")
    ] = ",".join(map(str, ROUND_CHOICES)),
    fraction: Annotated[float, typer.Option(help=run_option_help("fraction"))] = DEFAULTS.fraction,
    eval_every: Annotated[
        int,
        typer.Option(min=1, help="Evaluate (and report to the pruner) every this many rounds."),
    ] = 10,
    first: Annotated[
        list[str] | None,
        typer.Option(
            help='Settings of a first trial of a new study, as JSON (e.g. \'{"server_lr": '
            "0.01}'); repeatable."
        ),
    ] = None,
    join: Annotated[
        bool,
        typer.Option(
            help="Tune alongside a process already running this study (its running trials "
            "are not taken for interrupted ones)."
        ),
    ] = False,
    storage: Annotated[
        Path | None,
        typer.Option(help="SQLite file of the study (default: runs/tune/<study>.db)."),
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (default: <dataset>-<method>-<protocol>).")
    ] = None,
    save_preset: Annotated[
        str | None,
        typer.Option(help="Save the best settings as this preset (tuned-<dataset>)."),
    ] = None,
    presets_file: Annotated[
        Path | None,
        typer.Option(
            help="Where --save-preset saves (default: presets.json in the user's configuration "
            "folder, which fedrec train --preset reads too)."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            help="--save-preset: save the best settings even when their validation HR@10 is "
            "not above popularity's on the same validation items (refused otherwise)."
        ),
    ] = False,
) -> None:
    """Tune run settings on validation items only (resumable).

    An interrupted study resumes where it stopped.

    Searches step sizes, SAM radii, rounds, the server optimizer and its weight decay, local
    steps, negatives, embedding size and the private embeddings' weight decay."""
    if method not in TUNABLE:
        raise fail(f"--method must be one of {', '.join(TUNABLE)}")
    seed_list = parse_seeds(seeds)
    try:  # the bounds of a run's fraction, before the data is read
        check({"fraction": fraction}, RunParams)
    except ConfigError as err:
        raise config_error(err) from None
    if force and not save_preset:
        raise fail("--force is a setting of --save-preset; it would change nothing")
    target = presets_file or user_presets_file()
    if save_preset:  # a name or file that cannot take the result fails before the study
        try:
            check_target(save_preset, target)
        except PresetError as err:
            raise fail(str(err)) from None
    try:
        round_choices = tuple(int(r) for r in rounds.split(",") if r.strip())
    except ValueError:
        raise fail(f"--rounds must be comma-separated integers, got {rounds!r}") from None
    try:
        split = load_data(dataset, data_dir, True, protocol, split_dir)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    try:
        first_trials = tuple(json.loads(f) for f in first or [])
    except json.JSONDecodeError as err:
        raise fail(f"--first must be a JSON object: {err}") from None
    if not all(isinstance(f, dict) for f in first_trials):
        raise fail("--first must be a JSON object")
    name = study or f"{split.name}-{method}-{protocol}"
    spec = TuneSpec(
        storage=storage or Path("runs") / "tune" / f"{name}.db",
        study=name,
        base=TrainConfig(method=method, fraction=fraction),  # type: ignore[arg-type]
        n_trials=trials,
        seeds=tuple(seed_list),
        round_choices=round_choices,
        eval_every=eval_every,
        first=first_trials,
        join=join,
    )
    out_dir(spec.storage.parent, "--storage")  # a place the study cannot be kept fails now
    if why := _not_a_study_file(spec.storage):
        raise fail(f"--storage {spec.storage}: {why}")
    try:
        result = tune(split, spec, progress=console.print)
    except ValueError as err:
        raise fail(str(err)) from None
    best = best_settings(result)
    console.print(
        f"study {name} ({spec.storage}): {finished(result)} trials; best validation HR@10 "
        f"{result.best_value:.4f} with {best}"
    )
    if save_preset:
        floor = _popularity_floor(split, result.best_value, force)
        about = {
            "study": name,
            "validation_hr@10": result.best_value,
            "popularity_validation_hr@10": floor,
            "trials": finished(result),
            "tuning_seeds": list(seed_list),
            "method": method,
            "protocol": protocol,
            "dataset": split.name,
        }
        try:
            save(save_preset, best, about, target)
        except PresetError as err:
            raise fail(str(err)) from None
        console.print(f"saved preset {save_preset} in {target}")


def _popularity_floor(split: Split, best: float, force: bool) -> float:
    """Popularity's validation HR@10 on the study's validation items, printed beside the
    study's best; a best not above it is refused (unless ``force``): such settings have
    learned nothing personal, and ``fedrec train --preset tuned`` would take them unasked."""
    from fedrecgel.baselines import popularity

    pop = popularity(split).rounds[0].val["hr@10"]
    console.print(
        f"best validation HR@10 {best:.4f}; popularity on the same validation items {pop:.4f}"
    )
    if best <= pop and not force:
        raise fail(
            f"the study's best validation HR@10 {best:.4f} is not above popularity's "
            f"{pop:.4f}: the preset was not saved (more --trials resume the study; --force "
            "saves it anyway)"
        )
    if best <= pop:
        console.print("warning: saving a preset that does not beat popularity (--force)")
    return float(pop)


def _not_a_study_file(path: Path) -> str | None:
    """Why ``path`` cannot hold a study (a folder, or a file that is not SQLite), else None."""
    if path.is_dir():
        return "is a folder (name the study's SQLite file)"
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot read it ({err.strerror or err})"
    if head and head != b"SQLite format 3\x00":
        return "is not an SQLite file (a study is kept in one)"
    return None
