"""Hyperparameter search that cannot see the test set, with Optuna.

The objective of a trial is the **validation** HR@10 of the round selected on validation (the
best validation HR@10 over the run's rounds), averaged over the tuning seeds; the search never
reads a test metric: each trial trains on a split whose test items and test negatives are
replaced by the validation ones, so no test figure is even computed. Tuning seeds are held
out from the seeds the results tables use (default: tune on seed 100, report seeds 0, 1, 2).

A study lives in an SQLite file and resumes: running the same command again continues with the
trials still to do, and a trial that an interruption left running is marked failed and tried
again with the same parameters. More processes can tune one study together: start the first
as usual and the others with ``join`` (they leave running trials alone, so they cannot tell an
interrupted trial from another process's).

Searched: server lr and client lr (log scale), the two SAM radii (FedRecGEL only), the number
of rounds, the server optimizer, its schedule and the score network's weight decay, the client's
private steps before its SAM step, the negatives per positive, the embedding size and the
weight decay of the private embeddings (ranges in :data:`SPACE` and :data:`CHOICES`). A trial
evaluates every
``eval_every`` rounds and reports its best validation HR@10 so far; pruning (median of earlier
trials at the same round) stops trials that fall clearly behind. A new study can start from
given settings (``first``), e.g. the paper's with a larger server step, so that the sampler
has one sensible point before it explores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedrecgel.clitools import bounds
from fedrecgel.config import current_names
from fedrecgel.data import Split
from fedrecgel.simulate import RoundRecord, Simulator, TrainConfig

if TYPE_CHECKING:  # optuna is imported where a study runs (it pulls in storage clients)
    import optuna

#: the validation metric a study maximises
OBJECTIVE = "hr@10"
#: rounds a trial may choose (the validation-selected round is within them)
ROUND_CHOICES: tuple[int, ...] = (100, 200, 300)
SERVER_OPTIMIZERS: tuple[str, ...] = ("adam", "fedadam", "fedyogi")
#: private Adam steps before the SAM step a trial may choose (0: the paper)
LOCAL_STEPS: tuple[int, ...] = (0, 1, 3, 5, 10)
#: server step-size schedules a trial may choose
SERVER_DECAYS: tuple[str, ...] = ("constant", "cosine")
#: decoupled weight decay of the score network a trial may choose (0: the paper)
SERVER_WEIGHT_DECAYS: tuple[float, ...] = (0.0, 1.0, 3.0, 10.0)
#: sampled negatives per positive a trial may choose (4: the paper)
N_NEGATIVES: tuple[int, ...] = (2, 4, 8)
#: embedding sizes a trial may choose (32: the paper)
FACTORS: tuple[int, ...] = (16, 32, 64)
#: decoupled weight decay of a client's private embeddings a trial may choose (0: the paper)
CLIENT_WEIGHT_DECAYS: tuple[float, ...] = (0.0, 0.1, 0.3, 1.0)
#: the categorical settings and their choices
CHOICES: dict[str, tuple[Any, ...]] = {
    "optimizer": SERVER_OPTIMIZERS,
    "local_steps": LOCAL_STEPS,
    "server_decay": SERVER_DECAYS,
    "server_weight_decay": SERVER_WEIGHT_DECAYS,
    "n_negatives": N_NEGATIVES,
    "factor": FACTORS,
    "client_weight_decay": CLIENT_WEIGHT_DECAYS,
}
#: (low, high) of the log-scale searched settings. The paper's server step (Adam, 0.001) is the
#: low end: at it item rows barely move in 100 rounds on the real datasets.
SPACE: dict[str, tuple[float, float]] = {
    "server_lr": (1e-3, 0.1),
    "client_lr": (1e-3, 1.0),
    "rho_sh": (1e-3, 0.2),
    "rho_ns": (1e-3, 0.5),
}


@dataclass(frozen=True)
class TuneSpec:
    """One study: where it is stored, what it tunes and on which seeds."""

    storage: Path
    study: str
    base: TrainConfig
    n_trials: int = 30
    seeds: tuple[int, ...] = (100,)
    round_choices: tuple[int, ...] = ROUND_CHOICES
    sampler_seed: int = 0
    #: evaluate (and report to the pruner) every this many rounds, and at the last round
    eval_every: int = 10
    #: settings of the first trials of a new study (searched keys only)
    first: tuple[dict[str, Any], ...] = ()
    #: the pruner's patience: completed trials before it prunes, rounds before it judges
    prune_after_trials: int = 2
    prune_after_rounds: int = 30
    #: another process is tuning this study too: leave its running trials alone
    join: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.n_trials < 1:
            raise ValueError(f"n_trials must be >= 1, got {self.n_trials}")
        if not self.seeds:
            raise ValueError("at least one tuning seed is needed")
        most = int(bounds("rounds")["le"])
        if (
            not self.round_choices
            or not 1 <= min(self.round_choices) <= max(self.round_choices) <= most
        ):
            raise ValueError(f"round choices must be in 1..{most}, got {self.round_choices}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        for params in self.first:
            unknown = set(params) - {*SPACE, "rounds", *CHOICES}
            if unknown:
                raise ValueError(f"first trial: unknown settings {sorted(unknown)}")
            if "rounds" in params and params["rounds"] not in self.round_choices:
                raise ValueError(
                    f"first trial: rounds {params['rounds']!r} is not one of the round choices "
                    f"{self.round_choices}"
                )
            try:
                self.base.replace(**params)
            except ValueError as err:
                raise ValueError(f"first trial: {err}") from None


def validation_only(split: Split) -> Split:
    """``split`` with its test candidates replaced by the validation ones, so that nothing a
    trial computes involves a test item."""
    if split.val_items is None or split.val_negatives is None:
        raise ValueError(
            f"{split.name}: tuning needs a validation item per user (load the split with "
            "validation=True)"
        )
    return replace(
        split,
        test_items=split.val_items,
        test_negatives=split.val_negatives,
        val_items=None,
        val_negatives=None,
    )


def suggest(trial: optuna.Trial, base: TrainConfig, round_choices: Sequence[int]) -> TrainConfig:
    """The trial's config: ``base`` with the searched settings drawn by ``trial``."""
    names = ["server_lr", "client_lr"]
    if base.method == "fedrecgel":
        names += ["rho_sh", "rho_ns"]
    values: dict[str, Any] = {n: trial.suggest_float(n, *SPACE[n], log=True) for n in names}
    values["rounds"] = trial.suggest_categorical("rounds", list(round_choices))
    for name, choices in study_choices(base).items():
        values[name] = trial.suggest_categorical(name, list(choices))
    return base.replace(**values)


def study_choices(base: TrainConfig) -> dict[str, tuple[Any, ...]]:
    """:data:`CHOICES`, each with ``base``'s own value among them (a study of a smaller model
    than the paper's can start from it)."""
    return {
        name: choices if getattr(base, name) in choices else (*choices, getattr(base, name))
        for name, choices in CHOICES.items()
    }


def _objective(
    split: Split, spec: TuneSpec, progress: Callable[[str], None] | None
) -> Callable[[optuna.Trial], float]:
    tuning_split = validation_only(split)

    import optuna

    def run(trial: optuna.Trial) -> float:
        cfg = suggest(trial, spec.base, spec.round_choices).replace(eval_every=spec.eval_every)
        per_seed: list[float] = []
        for k, seed in enumerate(spec.seeds):
            best = 0.0

            def seen(rec: RoundRecord, k: int = k) -> None:
                nonlocal best
                if rec.test:  # the validation candidates (see validation_only)
                    best = max(best, rec.test[OBJECTIVE])
                    step = k * max(spec.round_choices) + rec.round
                    trial.report(best, step)
                    if trial.should_prune():
                        raise optuna.TrialPruned()

            Simulator(tuning_split, cfg.replace(seed=seed)).run(on_round=seen)
            per_seed.append(best)
        value = float(np.mean(per_seed))
        trial.set_user_attr("validation_per_seed", per_seed)
        if progress is not None:
            progress(f"trial {trial.number}: validation {OBJECTIVE} {value:.4f} {trial.params}")
        return value

    return run


def open_study(spec: TuneSpec) -> optuna.Study:
    """Create the study or load it from its SQLite file; a trial an interruption left
    RUNNING is marked failed and queued again with its parameters (not when ``spec.join``)."""
    import optuna
    from optuna.trial import TrialState

    spec.storage.parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{spec.storage.resolve()}")
    study = optuna.create_study(
        storage=storage,
        study_name=spec.study,
        direction="maximize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=spec.sampler_seed, n_startup_trials=8),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=spec.prune_after_trials, n_warmup_steps=spec.prune_after_rounds
        ),
    )
    if not study.get_trials(deepcopy=False):
        for params in spec.first:
            # a choice the first settings leave open is the base config's, not a random draw
            own = {k: getattr(spec.base, k) for k in CHOICES if k not in params}
            study.enqueue_trial({**own, **params})
    if spec.join:  # another sampler seed, or both processes would draw the same settings
        seed = spec.sampler_seed + len(study.get_trials(deepcopy=False))
        study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)
    running = () if spec.join else study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
    return study


def finished(study: optuna.Study) -> int:
    """Trials that count towards the budget: completed or pruned."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def tune(
    split: Split, spec: TuneSpec, progress: Callable[[str], None] | None = None
) -> optuna.Study:
    """Run the study until ``spec.n_trials`` trials have finished (resuming a stored one)."""
    spec.validate()
    import optuna

    study = open_study(spec)
    todo = spec.n_trials - finished(study)
    if todo > 0:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study.optimize(_objective(split, spec, progress), n_trials=todo, gc_after_trial=True)
    return study


def best_settings(study: optuna.Study) -> dict[str, Any]:
    """The best trial's settings, as :class:`TrainConfig` field values (a study stored before
    a setting was renamed: by its name now)."""
    return current_names(study.best_trial.params)
