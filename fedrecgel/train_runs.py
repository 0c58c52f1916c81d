"""The runs of ``fedrec train``: the seeds of a federated method on a backend, in this process
(:class:`Simulator`) or one Ray actor per shard of users
(:class:`fedrecgel.ray_backend.RaySimulator`), with the progress bar; or a reference point
(:mod:`fedrecgel.baselines`).

What the ray backend refuses is refused here, before any data is loaded or Ray started, with a
message naming the option (:func:`ray_problem`).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedrecgel.clitools import config_error, console, fail, option_flag
from fedrecgel.cohort import groups_summary
from fedrecgel.config import DEFAULTS, MAX_MODEL_PARAMS, ConfigError
from fedrecgel.data import Split
from fedrecgel.full_ranking import ServedModel, full_ranking_line, whole_catalogue
from fedrecgel.simulate import RoundRecord, RunResult, Simulator, TrainConfig, with_seed

BACKENDS = ("inprocess", "ray")
#: shards of the ray backend when --shards is not given (one actor each)
RAY_SHARDS = 2


@dataclass(frozen=True)
class Backend:
    """Where the clients of ``fedrec train`` run: ``name`` (inprocess or ray); for ray the
    cluster to join (None: a local one) and the folder of the shard actors' checkpoints."""

    name: str = "inprocess"
    address: str | None = None
    checkpoint_dir: Path | None = None


def ray_problem(
    method: str, federated: bool, run: dict[str, Any], grouping_given: bool
) -> str | None:
    """Why ``fedrec train --backend ray`` cannot run these settings (None when it can)."""
    if not federated:
        return f"--backend ray trains the federated methods; --method {method} is not one"
    from fedrecgel.ray_backend import ray_missing

    dp = run.get("dp_noise") is not None or run.get("target_epsilon") is not None
    for on, what in (
        (dp, "differential privacy (--dp-noise, --target-epsilon): each client's update is "
         "clipped before it is summed"),
        (run.get("secure_aggregation", "off") != "off", "--secure-aggregation: it masks each "
         "client's update"),
        (run.get("clip") is not None, "--clip: the server clips each client's update"),
    ):  # fmt: skip
        if on:
            return f"--backend ray uploads one sum per shard of users and cannot run {what}"
    if grouping_given and run.get("upload_grouping") != "worker":
        return (
            "--backend ray sums each shard's clients in its actor (--upload-grouping worker); "
            "per-client uploads are not sent through the actors"
        )
    missing = ray_missing()
    return None if missing is None else escape(missing)  # [distributed] is no markup


def _reachable(address: str) -> str | None:
    """Why nothing answers at a ``host:port`` address (None: it answers, or it is another
    form, such as ``auto``, that Ray resolves itself). Ray waits minutes for a silent one."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        return f"nothing answers at {address}: {err.strerror or err}"
    return None


@contextmanager
def _cluster(backend: Backend, shards: int) -> Iterator[None]:
    """Ray for the seeds of a run: the cluster at ``backend.address``, or a local one."""
    from fedrecgel.ray_backend import ray_cluster

    where = f"the Ray cluster at {backend.address}" if backend.address else "a local Ray"
    verb = "join" if backend.address else "start"
    if backend.address is not None and (why := _reachable(backend.address)) is not None:
        raise fail(f"--address: {why} (start one with `ray start --head`)")
    with ExitStack() as stack:
        try:
            resources = stack.enter_context(ray_cluster(backend.address, shards))
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise fail(f"cannot {verb} {where}: {err}") from None
        console.print(
            f"ray backend: {shards} shard actors on {where} ({resources.get('CPU', 0):g} CPUs)"
        )
        yield


def _simulator(split: Split, cfg: TrainConfig, backend: Backend, out: Path) -> Simulator:
    if backend.name == "inprocess":
        return Simulator(split, cfg)
    from fedrecgel.ray_backend import RaySimulator

    folder = backend.checkpoint_dir or out / "ray-checkpoints"
    return RaySimulator(split, cfg, folder / f"seed-{cfg.seed}")


def train_seeds(
    split: Split,
    base: TrainConfig,
    seeds: list[int],
    backend: Backend,
    out: Path,
    quiet: bool,
    full_ranking: bool = False,
) -> list[RunResult]:
    """Train ``base`` once per seed on ``backend`` (its shards: ``base.shards``); with
    ``full_ranking`` each run's served model is also ranked over the whole catalogue."""
    results = []
    lost: tuple[type[Exception], ...] = ()
    cluster: Any = nullcontext()
    if backend.name == "ray":
        from fedrecgel.ray_backend import ShardLost

        lost, cluster = (ShardLost,), _cluster(backend, base.shards)
    with cluster:
        for seed in seeds:
            cfg = with_seed(base, seed)
            try:
                sim = _simulator(split, cfg, backend, out)
            except ConfigError as err:
                raise config_error(err) from None
            except ValueError as err:
                raise fail(str(err)) from None
            except lost as err:  # the ray backend: actors that did not start
                raise fail(str(err), code=1) from None
            try:
                results.append(_run(sim, cfg, seed, quiet, full_ranking))
            except lost as err:  # the ray backend: a shard lost for good
                raise fail(str(err), code=1) from None
            finally:
                close = getattr(sim, "close", None)
                if close is not None:
                    close()
    return results


def _run(sim: Simulator, cfg: TrainConfig, seed: int, quiet: bool, full: bool) -> RunResult:
    if sim.privacy is not None:
        p = sim.privacy
        console.print(
            f"differential privacy ({p.mode}): clip {p.clip:g}"
            + ("" if p.clip_quantile is None else f" adapting to quantile {p.clip_quantile:g}")
            + ", noise multiplier "
            f"{p.noise:.4g}, {p.sampling} sampling (q {p.q:.4g}), {sim.total_rounds} "
            f"rounds -> epsilon {p.epsilon(sim.total_rounds):.3f} at delta {p.delta:.3g}"
        )
        if cfg.optimizer != "sgd":
            console.print(
                f"note: server {cfg.optimizer} scales each coordinate's step by its "
                "own size, so DP noise moves every coordinate about as far as the signal; "
                "server sgd keeps noise and signal in proportion (the private preset, "
                "which a DP run without --preset takes; see docs/RESULTS.md)"
            )
    if cfg.cohort_groups is not None:
        console.print(groups_summary(sim.users, cfg.cohort_groups, seed))
    with Progress(
        TextColumn(f"seed {seed}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        task = progress.add_task("train", total=sim.total_rounds, info="")

        served = ServedModel() if full else None
        offer = None if served is None else served.follow(sim)

        def on_round(rec: RoundRecord) -> None:
            progress.update(task, advance=1, info=round_line(rec))
            if offer is not None:
                offer(rec)

        res = sim.run(on_round)
    if served is not None:
        res.full_ranking = whole_catalogue(sim.split, served)
        console.print(full_ranking_line(res.full_ranking), highlight=False, soft_wrap=True)
    return res


def round_line(rec: RoundRecord) -> str:
    """One round's line: loss, HR@10 when evaluated, epsilon when private."""
    hr = f" HR@10 {rec.test['hr@10']:.4f}" if rec.test else ""
    eps = f" epsilon {rec.epsilon:.3f}" if rec.epsilon is not None else ""
    return f"round {rec.round} loss {rec.loss:.4f}{hr}{eps}"


def with_backend(base: TrainConfig, backend: Backend, shards: int | None) -> TrainConfig:
    """``base`` with the backend's shards (and, for ray, its upload grouping)."""
    if backend.name == "ray":
        return base.replace(shards=shards or RAY_SHARDS, upload_grouping="worker")
    return base.replace(shards=shards or 1)


#: settings of the federated DP runs that DP popularity has no use for (it bounds each user's
#: contribution with --dp-max-items and releases its counts once)
FEDERATED_DP_SETTINGS = ("dp_clip", "dp_mode")


def baseline_problem(
    method: str, run: dict[str, Any], dp_max_items: int | None, given: list[str]
) -> str | None:
    """Why the privacy settings do not fit ``method`` (None when they do); ``given``: the run
    settings named on the command line."""
    dp = run.get("dp_noise") is not None or run.get("target_epsilon") is not None
    if dp_max_items is not None and dp_max_items < 1:
        return f"--dp-max-items must be at least 1, got {dp_max_items}"
    if dp_max_items is not None and not (method == "popularity" and dp):
        return (
            "--dp-max-items is a setting of --method popularity with --target-epsilon or "
            "--dp-noise (differentially private counts); it would change nothing"
        )
    if dp and method in ("random", "central"):
        return (
            f"--method {method} is not differentially private; --target-epsilon and "
            "--dp-noise would change nothing (--method popularity and --method cooccurrence "
            "have private variants)"
        )
    if dp and method in ("popularity", "cooccurrence"):
        for name in FEDERATED_DP_SETTINGS:
            if name in given:
                return f"{option_flag(name)} is a setting of the federated DP runs; private " + (
                    "popularity bounds what each user adds with --dp-max-items"
                    if method == "popularity"
                    else "co-occurrence bounds what each user adds by its unit-norm row"
                )
    return None


#: the run settings a reference point takes, the others changing nothing: the private
#: rankings' budget (without one, none), and central's model, epochs (--rounds), negatives,
#: evaluations and prior (fedrecgel.baselines.CentralConfig; its step size is --central-lr)
DP_RELEASE = ("target_epsilon", "dp_noise", "dp_delta")
BASELINE_SETTINGS: dict[str, tuple[str, ...]] = {
    "popularity": DP_RELEASE,
    "cooccurrence": DP_RELEASE,
    "random": (),
    "central": ("factor", "layers", "rounds", "n_negatives", "eval_every", "popularity_prior"),
}
#: the settings a federated method overrides, and why (TrainConfig.effective_rho, the MF model)
_NO_SAM = "runs with both SAM radii 0"
OVERRIDDEN: dict[str, dict[str, str]] = {
    "fedncf": {"rho_sh": _NO_SAM, "rho_ns": _NO_SAM},
    "fedmf": {
        "rho_sh": _NO_SAM,
        "rho_ns": _NO_SAM,
        "layers": "has no MLP tower",
        # the decay shrinks the score network's weight matrices; MF shares its item table only
        "server_weight_decay": "has no score network to decay",
    },
    "fedrecgel-no-shared-sam": {"rho_sh": "runs with --rho-sh 0"},
    "fedrecgel-no-private-sam": {"rho_ns": "runs with --rho-ns 0"},
}
#: settings that act only in a DP run (--dp-noise or --target-epsilon set)
DP_ONLY = (
    "dp_clip",
    "dp_clip_quantile",
    "dp_mode",
    "dp_delta",
    "dp_prior_share",
    "dp_item_share",
    "dp_prior_items",
)
#: DP settings that spend a share of the target before the rounds (RunParams._released_under)
DP_SHARES = ("dp_prior_share", "dp_item_share", "dp_prior_items")
#: settings that act only with --secure-aggregation dense or sparse
SECAGG_ONLY = ("secagg_neighbours", "secagg_dropout", "secagg_range", "secagg_scale_bits")


def unused_setting(method: str, run: dict[str, Any], given: list[str]) -> str | None:
    """Why a run setting named on the command line (``given``) would change nothing with
    ``method`` and the other settings (None when each takes effect): README promises that
    every option does. Only what the user typed counts: a preset's values are applied where
    they act (the private preset's clip quantile under DP only)."""
    dp = run.get("dp_noise") is not None or run.get("target_epsilon") is not None
    if method in BASELINE_SETTINGS:
        private = method in ("popularity", "cooccurrence")  # they have a DP variant
        used = BASELINE_SETTINGS[method] if dp or not private else ()
        if (name := next((n for n in given if n not in used), None)) is None:
            return None
        if used:
            takes = f"takes only {', '.join(map(option_flag, used))} of the run settings"
            takes += " (--rounds: its epochs)" * (method == "central")
        else:
            takes = "takes none of the run settings"
            takes += " without --target-epsilon or --dp-noise" * private
        return f"--method {method} {takes}; {option_flag(name)} would change nothing"
    for name, why in OVERRIDDEN.get(method, {}).items():
        if name in given:
            return f"--method {method} {why}; {option_flag(name)} would change nothing"
    for names, off, what in (
        (DP_ONLY, not dp, "of a differentially private run (--dp-noise or --target-epsilon)"),
        (
            DP_SHARES,
            run.get("target_epsilon") is None
            or run.get("dp_mode") != "central"
            or run.get("secure_aggregation") != "off",
            "of a central DP run with --target-epsilon and no secure aggregation (a share of "
            "the target spent before the rounds)",
        ),
        (SECAGG_ONLY, run.get("secure_aggregation") == "off", "of --secure-aggregation"),
        (("trim_fraction",), run.get("server_mean") != "trimmed", "of --server-mean trimmed"),
    ):
        if off and (name := next((n for n in given if n in names), None)) is not None:
            return f"{option_flag(name)} is a setting {what}; it would change nothing"
    return None


#: the settings of one server optimizer or a few, with those that use them; the others ignore
#: them (fedrecgel.strategy.ServerOptimizer.step: sgd keeps no moments, the others no momentum
#: buffer, fedadagrad sums the squared steps without a beta2 decay)
OPTIMIZER_SETTINGS: dict[str, tuple[str, ...]] = {
    "server_momentum": ("sgd",),
    "server_beta1": ("adam", "fedadam", "fedyogi", "fedadagrad"),
    "server_beta2": ("adam", "fedadam", "fedyogi"),
}


def unused_optimizer_setting(optimizer: str, source: str, given: list[str]) -> str | None:
    """Why a server-optimizer setting named on the command line (``given``) would change
    nothing with the run's server ``optimizer`` (the one in effect after the preset; ``source``
    says where it came from), or None. A preset's own settings are never refused here."""
    for name in given:
        used = OPTIMIZER_SETTINGS.get(name)
        if used is not None and optimizer not in used:
            which = " or ".join(filter(None, (", ".join(used[:-1]), used[-1])))
            return (
                f"{option_flag(name)} is a setting of the server optimizer {which}; this run's "
                f"is {optimizer} ({source}); it would change nothing"
            )
    return None


def ignored_by_optimizer(optimizer: str, run: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults of the settings server ``optimizer`` ignores where ``run`` (a preset's
    values, its optimizer changed on the command line) sets them otherwise: a run records
    only what acts."""
    return {
        name: getattr(DEFAULTS, name)
        for name, used in OPTIMIZER_SETTINGS.items()
        if optimizer not in used and run.get(name) != getattr(DEFAULTS, name)
    }


def with_radii_used(base: TrainConfig) -> TrainConfig:
    """``base`` with the SAM radii its method runs with (0 where it switches SAM off), so that
    results.json records the settings the run used, not a radius (the default's, a preset's)
    that the method overrode."""
    rho_sh, rho_ns = base.effective_rho()
    return base.replace(rho_sh=rho_sh, rho_ns=rho_ns)


def _dp_popularity(
    split: Split, base: TrainConfig, seeds: list[int], max_items: int | None
) -> list[RunResult]:
    from fedrecgel.dp_popularity import DEFAULT_MAX_ITEMS, dp_popularity, plan_release

    try:
        release = plan_release(
            split.n_users,
            DEFAULT_MAX_ITEMS if max_items is None else max_items,
            base.target_epsilon,
            base.dp_noise,
            base.dp_delta,
        )
    except ConfigError as err:
        raise config_error(err) from None
    console.print(
        f"differential privacy (popularity counts): at most {release.max_items} items per "
        f"user, noise multiplier {release.noise:.4g} (std {release.noise_std:.4g} on every "
        f"item's count) -> epsilon {release.epsilon:.3f} at delta {release.delta:.3g}"
    )
    return [dp_popularity(split, release, seed) for seed in seeds]


def _cooccurrence(split: Split, base: TrainConfig, seeds: list[int]) -> list[RunResult]:
    """Co-occurrence ranking: exact (one run), or one private release of it per seed."""
    from fedrecgel.cooccurrence import cooccurrence
    from fedrecgel.dp_popularity import plan_release

    runs: list[tuple[float | None, int]] = [(None, 0)]
    release = None
    if base.dp_enabled:
        try:
            # one Gaussian release of sensitivity 1: the plan of counts with one item a user
            release = plan_release(
                split.n_users, 1, base.target_epsilon, base.dp_noise, base.dp_delta
            )
        except ConfigError as err:
            raise config_error(err) from None
        console.print(
            f"differential privacy (item co-occurrence, one release): noise multiplier "
            f"{release.noise:.4g} on every entry -> epsilon {release.epsilon:.3f} at delta "
            f"{release.delta:.3g}"
        )
        runs = [(release.noise, s) for s in seeds]
    out = []
    for noise, seed in runs:
        try:
            res = cooccurrence(split, noise=noise, seed=seed)
        except ValueError as err:
            raise fail(str(err)) from None
        if release is not None:
            res.privacy = {
                **release.to_json(),
                "mechanism": "gaussian item co-occurrence, one release",
            }
            del res.privacy["max_items"]
            res.rounds[0].epsilon = release.epsilon
        else:  # the exact ranking draws nothing: no seed to record, or to print
            del res.config["seed"]
        out.append(res)
    return out


def run_baseline(
    method: str,
    split: Split,
    base: TrainConfig,
    seeds: list[int],
    central_lr: float | None,
    dp_max_items: int | None = None,
) -> list[RunResult]:
    """The reference point ``method`` (popularity, random, central) on ``split``; popularity
    with a DP setting (``base.target_epsilon`` or ``base.dp_noise``): its private variant,
    one run per seed."""
    from fedrecgel.baselines import CentralConfig, central, popularity, random_ranking

    if method == "cooccurrence":
        return _cooccurrence(split, base, seeds)
    if method == "popularity":
        if base.dp_enabled:
            return _dp_popularity(split, base, seeds, dp_max_items)
        return [popularity(split)]
    if method == "random":
        ranked = [random_ranking(split, seed=s) for s in seeds]
        for res, seed in zip(ranked, seeds, strict=True):  # each run's figures are its seed's
            res.config["seed"] = seed
        return ranked
    out = []
    for seed in seeds:
        cfg = CentralConfig(
            base.model(split.n_items),
            epochs=base.rounds,
            n_negatives=base.n_negatives,
            seed=seed,
            eval_every=max(base.eval_every, 1),
            popularity_prior=base.popularity_prior,
        )
        if central_lr is not None:
            cfg = replace(cfg, lr=central_lr)
        try:
            cfg.validate()
        except ValueError as err:
            raise fail(str(err)) from None
        out.append(central(split, cfg, on_epoch=lambda r: console.print(round_line(r))))
    return out


def refuse_model_size(method: str, base: TrainConfig, n_items: int) -> None:
    """Refuse a model of more than MAX_MODEL_PARAMS shared parameters (popularity and random
    build none)."""
    n_shared = base.model(n_items).n_shared()
    if method not in ("popularity", "random", "cooccurrence") and n_shared > MAX_MODEL_PARAMS:
        raise fail(
            f"--factor {base.factor} with --layers {base.layers} on {n_items} items would "
            f"build {n_shared:,} shared parameters; at most {MAX_MODEL_PARAMS:,} are built"
        )


def full_ranking_refusal(method: str, federated: bool, backend: str, validation: bool) -> str:
    """Why ``--full-ranking`` cannot go with these options ('' when it can)."""
    if not federated:
        return f"--method {method} serves no federated model"
    if backend != "inprocess":
        return f"--backend {backend} keeps the users' rows on its actors"
    if not validation:
        return "--no-validation leaves nothing to choose the served round on"
    return ""
