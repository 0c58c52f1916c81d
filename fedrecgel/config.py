"""The run configuration: every setting of a federated run, its default and its bounds, once.

:class:`RunParams` is what an operator chooses; :class:`RunConfig` adds the catalogue size and
is the body of ``POST /v1/runs`` (the HTTP contract re-exports it, so the aggregator refuses an
out-of-bound config with 422). The simulator's :class:`~fedrecgel.simulate.TrainConfig` is
RunParams with the simulator's own settings added, :class:`~fedrecgel.sam.SAMConfig` takes its
defaults from :data:`DEFAULTS`, and the command line builds its options from the fields
(:func:`fedrecgel.cli.run_options`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedrecgel.fixedpoint import FixedPoint

ModelKind = Literal["ncf", "mf"]
Weighting = Literal["mean", "samples"]
OptimizerName = Literal["adam", "sgd", "fedadam", "fedyogi", "fedadagrad"]
SecAggMode = Literal["off", "dense", "sparse"]
DPMode = Literal["central", "distributed"]
Sampling = Literal["fixed", "poisson"]
UploadGrouping = Literal["client", "worker"]
ServerMean = Literal["mean", "trimmed", "median"]
LrDecay = Literal["constant", "cosine"]
ServerUpdate = Literal["dense", "lazy"]

#: the largest seed (numpy's seed sequences and torch take any 32-bit value)
MAX_SEED = 2**32 - 1
#: the largest model built by default, in shared parameters (200 MB of float32): factor and
#: layers are bounded one by one, but together (1024, 8) they would make a 34e9-parameter tower
MAX_MODEL_PARAMS = 50_000_000
#: the largest catalogue a run takes (items 0 .. MAX_ITEMS - 1)
MAX_ITEMS = 10_000_000


class RunParams(BaseModel):
    """Everything an operator chooses for a federated run (defaults: the reference code's real
    behaviour; bounds: what this project can run)."""

    # NaN and infinities are refused as such ("a finite number"), not by a bound they fail
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: ModelKind = Field(default="ncf", description="Model: NCF (paper) or MF.")
    factor: int = Field(default=32, ge=1, le=1024, description="Embedding size.")
    layers: int = Field(default=3, ge=1, le=8, description="MLP tower layers.")
    rounds: int = Field(default=100, ge=1, le=100_000, description="Federated rounds.")
    eval_every: int = Field(
        default=1,
        ge=0,
        le=100_000,
        description="Evaluate the model every this many rounds and after the last (0: never).",
    )
    fraction: float = Field(
        default=0.1, gt=0.0, le=1.0, description="Clients per round, as a fraction of users."
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seed of the run.")
    optimizer: OptimizerName = Field(default="adam", description="Server optimizer.")
    server_lr: float = Field(default=0.001, gt=0.0, le=10.0, description="Server step size.")
    server_beta1: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="beta1 of server adam, fedadam, fedyogi or fedadagrad (none: the "
        "optimizer's usual 0.9).",
    )
    server_beta2: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="beta2 of server adam, fedadam or fedyogi (none: the optimizer's usual, "
        "0.999 for adam, 0.99 for the others).",
    )
    server_momentum: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Momentum of server sgd (0: none)."
    )
    server_warmup: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Rounds over which the server step size ramps up linearly to server_lr.",
    )
    server_decay: LrDecay = Field(
        default="constant",
        description="Server step size after the warm-up: constant, or cosine decay to 0 at the "
        "last round.",
    )
    server_weight_decay: float = Field(
        default=0.0,
        ge=0.0,
        le=1000.0,
        description="Decoupled weight decay of the score network at each server step (its "
        "weight matrices, not its biases nor the item tables, shrink by the step size times "
        "this before the step; 0: the paper).",
    )
    server_update: ServerUpdate = Field(
        default="dense",
        description="Server Adam over the item tables: dense (every row each round, the "
        "paper) or lazy (only the rows the round touched, their moments decayed for the "
        "rounds they missed when next touched: an untouched row no longer drifts on its old "
        "momentum; adam only).",
    )
    weighting: Weighting = Field(
        default="mean", description="Mean of updates (faithful) or weighted by samples."
    )
    clip: float | None = Field(
        default=None, gt=0.0, le=1e6, description="Clip each update to this L2 norm."
    )
    rho_sh: float = Field(
        default=0.02, ge=0.0, le=10.0, description="SAM radius of the shared part."
    )
    rho_ns: float = Field(
        default=0.02, ge=0.0, le=10.0, description="SAM radius of the private part."
    )
    client_lr: float = Field(default=0.1, gt=0.0, le=10.0, description="Client step size.")
    n_negatives: int = Field(
        default=4, ge=1, le=1000, description="Sampled negatives per positive."
    )
    negative_pool: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ITEMS,
        description="Negatives from a public pool: each round draws this many distinct items "
        "(keyed by the seed and the round) and every client draws its negatives from them "
        "(none: from the whole catalogue). Needed by secure_aggregation=sparse.",
    )
    chunk_size: int = Field(
        default=128, ge=1, le=1 << 20, description="Samples per client mini-batch."
    )
    client_weight_decay: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Decoupled weight decay of a client's private parameters at each private "
        "step (AdamW: they shrink by client_lr * this before the step; 0: the paper).",
    )
    local_steps: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Extra Adam steps a client takes on its private parameters each round, "
        "with the round's samples at the round's model, before its SAM step (0: the paper).",
    )
    rank_fit_steps: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="A user whose private parameters took fewer than this many steps in "
        "training (it took part in few rounds, or none) fits a copy of them to the model it "
        "ranks with, with this many Adam steps on its own training items and fresh "
        "negatives, before each evaluation and recommendation; nothing is stored or uploaded "
        "(0: never, the paper).",
    )
    rank_fit_lr: float = Field(
        default=0.05, gt=0.0, le=10.0, description="Step size of those Adam steps."
    )
    deadline_s: float = Field(
        default=60.0, gt=0.0, le=7 * 86400.0, description="Round deadline (seconds)."
    )
    quorum: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Fraction of the cohort needed to close a round at its deadline.",
    )
    dataset: str = Field(
        default="filmtrust",
        min_length=1,
        max_length=200,
        description="Dataset of the run (a label the workers check).",
    )

    secure_aggregation: SecAggMode = Field(
        default="off",
        description="Secure aggregation of uploads: off (plain sparse uploads, the server sees "
        "each one), dense (masked dense vectors: the server learns only the cohort's sum) or "
        "sparse (needs negative_pool: a first masked round sums the clients' positive items, a "
        "second masks only the rows of those items and the pool, in 32-bit words; the server "
        "learns the sum and how many clients have each item, which over many rounds of cohorts "
        "it drew names who holds a rare item: see cohort_groups). Simulator and HTTP; the ray "
        "backend refuses secure aggregation.",
    )
    secagg_neighbours: int = Field(
        default=8,
        ge=0,
        le=1000,
        description="SecAgg+ graph: each client masks with this many peers on either side of a "
        "public random ring; 0 = every pair (SecAgg).",
    )
    secagg_dropout: float = Field(
        default=0.3,
        ge=0.0,
        lt=0.5,
        description="Fraction of a client's neighbours that may drop out after masking "
        "(the secret-sharing threshold is the rest).",
    )
    secagg_range: float = Field(
        default=16.0,
        gt=0.0,
        le=1e6,
        description="Fixed-point range: each uploaded value is clipped to [-range, range].",
    )
    secagg_scale_bits: int = Field(
        default=32, ge=8, le=48, description="Fixed-point step: 2^-bits (values mod 2^64)."
    )

    @model_validator(mode="after")
    def _pool_fits(self) -> RunParams:
        pool = self.negative_pool
        if pool is not None and pool < self.n_negatives:
            raise ValueError(
                f"negative_pool {pool} is smaller than n_negatives {self.n_negatives}: a client "
                "draws that many distinct negatives from it"
            )
        if self.secure_aggregation == "sparse" and pool is None:
            raise ValueError(
                "secure_aggregation=sparse needs negative_pool: with negatives from the whole "
                "catalogue a cohort touches nearly every item row"
            )
        return self

    @model_validator(mode="after")
    def _secagg_fits(self) -> RunParams:
        if self.secure_aggregation != "off":
            if self.weighting != "mean":
                raise ValueError("secure aggregation needs weighting=mean")
            if self.secagg_fixed_point().max_cohort() < 2:
                raise ValueError("secagg_range * 2^secagg_scale_bits leaves no room for a sum")
        return self

    def secagg_fixed_point(self) -> FixedPoint:
        """The fixed-point encoding of secure-aggregated uploads."""
        return FixedPoint(self.secagg_range, self.secagg_scale_bits)

    sampling: Sampling = Field(
        default="fixed",
        description="Cohort draw: fixed-size (m = fraction * n, without replacement) or "
        "Poisson (each client with probability fraction).",
    )
    cohort_groups: int | None = Field(
        default=None,
        ge=2,
        le=10_000_000,
        description="Cohorts of whole groups (a keyed hash of the client id), drawn as "
        "sampling draws clients: across secure rounds the sums point to groups, not clients. "
        "None: clients one by one. Not with DP.",
    )
    dp_clip: float = Field(
        default=1.0,
        gt=0.0,
        le=1e6,
        description="DP: each client clips its whole upload to this L2 norm (the dp_* "
        "settings only act in a DP run: dp_noise or target_epsilon set).",
    )
    dp_clip_quantile: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="DP: adapt the clip norm every round towards this quantile of the cohort's "
        "upload norms, estimated under the same budget (Andrew et al. 2021; dp_clip is then "
        "the first round's norm). Central DP only.",
    )
    dp_noise: float | None = Field(
        default=None,
        ge=0.0,
        le=1000.0,
        description="DP noise multiplier z (noise std z*dp_clip on the round's sum); "
        "set it or target_epsilon to make the run differentially private.",
    )
    dp_mode: DPMode = Field(
        default="central",
        description="DP noise added by the server to the sum (central) or by each client, "
        "its share z*C/sqrt(cohort) (distributed).",
    )
    dp_delta: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="DP delta (default 1 / number of clients)."
    )
    target_epsilon: float | None = Field(
        default=None,
        gt=0.0,
        le=1000.0,
        description="DP budget: with dp_noise, stop before a round would exceed it; without, "
        "calibrate the noise so that all rounds stay within it.",
    )

    upload_grouping: UploadGrouping = Field(
        default="client",
        description="Uploads: one per client (client), or one per worker and round carrying the "
        "weighted sum of its cohort members' gradients (worker: fewer, smaller uploads; the "
        "server sees only each worker's partial sum; not with clip, DP or secure aggregation).",
    )

    server_mean: ServerMean = Field(
        default="mean",
        description="The server's aggregate of the clients' uploads: their mean, or a "
        "coordinate-wise robust one, trimmed (the trim_fraction largest and smallest values of "
        "each coordinate dropped) or median; robust ones need upload_grouping=client, "
        "weighting=mean, no DP and no secure aggregation.",
    )
    trim_fraction: float = Field(
        default=0.1,
        ge=0.0,
        lt=0.5,
        description="server_mean=trimmed: the share of a round's uploads dropped at each end "
        "of every coordinate (rounded down to whole uploads).",
    )

    popularity_prior: bool = Field(
        default=True,
        description="Rank by the model's logit + w*log(1 + item count), w chosen on the "
        "validation items at each evaluation among 0 (the model alone) to 8; needs validation "
        "items. The counts are summed over the clients (over HTTP each worker reports its "
        "users' sum once a run); under sparse secure aggregation, estimated from the counts its "
        "rounds unmask once they cover the clients twice; off under dense secure aggregation, "
        "and in a DP run unless dp_prior_share releases them under the run's budget.",
    )
    dp_prior_share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="DP: rank with the popularity prior, its counts released once with Gaussian "
        "noise spending this share of target_epsilon (each user counts at most dp_prior_items "
        "items); the rounds' noise is calibrated to what is left of the target. 0: no prior in "
        "a DP run. Acts with target_epsilon and central DP only.",
    )
    dp_item_share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="DP: start the item tables from one Gaussian release of the users' item "
        "co-occurrence spending this share of target_epsilon (its top eigenvectors), and keep "
        "them fixed: the rounds train and release the score network only, and each user's "
        "private vectors learn these items. 0: item tables trained as usual. Acts with "
        "target_epsilon and central DP only; in the simulator (fedrec train) only.",
    )
    dp_prior_items: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="DP prior: how many of its distinct training items each user counts at most "
        "(drawn from its own keyed stream when it has more).",
    )

    @model_validator(mode="after")
    def _robust_mean_fits(self) -> RunParams:
        if self.server_mean == "mean":
            return self
        for on, what in (
            (self.weighting != "mean", "weighting=samples (it is unweighted)"),
            (self.dp_enabled, "differential privacy (its noise is calibrated to the mean)"),
            (self.secure_aggregation != "off", "secure aggregation (the server sees only a sum)"),
        ):
            if on:
                raise ValueError(f"server_mean={self.server_mean} cannot be combined with {what}")
        return self

    @model_validator(mode="after")
    def _grouping_fits(self) -> RunParams:
        if self.upload_grouping == "worker":
            for on, what in (
                (
                    self.server_mean != "mean",
                    f"server_mean={self.server_mean} (a partial sum cannot be trimmed: the "
                    "server needs each client's upload)",
                ),
                (self.clip is not None, "clip (the server clips each client's update)"),
                (self.dp_enabled, "differential privacy (each client's update is clipped)"),
                (self.secure_aggregation != "off", "secure aggregation (it masks each client)"),
            ):
                if on:
                    raise ValueError(
                        f"upload_grouping=worker sends per-worker partial sums, which cannot be "
                        f"combined with {what}: use upload_grouping=client"
                    )
        return self

    @model_validator(mode="after")
    def _lazy_needs_adam(self) -> RunParams:
        if self.server_update == "lazy" and self.optimizer != "adam":
            raise ValueError(
                f"server_update=lazy is only defined for optimizer=adam, not "
                f"{self.optimizer}: use server_update=dense"
            )
        return self

    @model_validator(mode="after")
    def _dp_consistent(self) -> RunParams:
        if self.dp_enabled and self.weighting != "mean":
            raise ValueError("a DP run needs weighting 'mean' (a sample weight is not bounded)")
        if self.dp_clip_quantile is not None and self.dp_mode != "central":
            raise ValueError(
                "dp_clip_quantile needs dp_mode central: the server adds the noise of the "
                "clients' clip-norm count as it adds the noise of their sum"
            )
        if self.dp_prior_share + self.dp_item_share >= 1.0:
            raise ValueError(
                f"dp_prior_share {self.dp_prior_share:g} + dp_item_share {self.dp_item_share:g} "
                "leave nothing of target_epsilon for the rounds: their sum must be below 1 (lower one "
                "of them)"
            )
        if self.cohort_groups is not None and self.dp_enabled:
            raise ValueError(
                "cohort_groups cannot be combined with differential privacy: the accountant "
                "assumes each client is drawn on its own"
            )
        return self

    @property
    def prior_enabled(self) -> bool:
        """Whether the popularity prior is ranked: asked for, not under dense secure
        aggregation (sparse: :attr:`prior_from_rounds`), and no DP unless the counts are
        released under the run's budget (:attr:`dp_prior_release`)."""
        if not self.popularity_prior or self.secure_aggregation == "dense":
            return False
        return not self.dp_enabled or self.dp_prior_release

    @property
    def prior_from_rounds(self) -> bool:
        """Whether the prior's counts come from the rounds' unmasked item counts (sparse secure
        aggregation, :class:`fedrecgel.prior.RoundCounts`), not from the clients' reports."""
        return self.prior_enabled and self.secure_aggregation == "sparse"

    def _released_under(self, share: float) -> bool:
        """Whether a release before the rounds takes ``share`` of the budget: a target epsilon
        (so a DP run), a share > 0, central DP (the server adds the noise), no secure
        aggregation."""
        return (
            self.target_epsilon is not None
            and share > 0
            and self.dp_mode == "central"
            and self.secure_aggregation == "off"
        )

    @property
    def dp_prior_release(self) -> bool:
        """Whether this DP run releases the prior's item counts with noise (the prior asked
        for, :meth:`_released_under` its share)."""
        return self.popularity_prior and self._released_under(self.dp_prior_share)

    @property
    def dp_item_release(self) -> bool:
        """Whether this DP run starts its item tables from a release of the item co-occurrence
        (and keeps them fixed): :meth:`_released_under` its share."""
        return self._released_under(self.dp_item_share)

    @property
    def dp_enabled(self) -> bool:
        """Whether the run is differentially private: dp_noise or target_epsilon set."""
        return self.dp_noise is not None or self.target_epsilon is not None

    def evaluates(self, round_id: int, last: int) -> bool:
        """Whether the model after round ``round_id`` is evaluated, ``last`` the run's last."""
        return self.eval_every > 0 and (round_id % self.eval_every == 0 or round_id == last)

    def quorum_count(self, cohort_size: int) -> int:
        """Updates needed to close at the deadline: ceil(quorum * cohort), at least 1."""
        return max(1, math.ceil(self.quorum * cohort_size - 1e-9))


#: the default of every field of :class:`RunParams`
DEFAULTS = RunParams()

#: run settings only the simulator runs: the aggregator refuses them (adaptive clipping needs
#: each worker's report of whether its upload was within C, which the upload format lacks)
SIMULATOR_ONLY = ("dp_clip_quantile",)

#: settings that presets, tuning studies and run results stored under an older name, by their
#: name now
STORED_NAMES = {"server_optimizer": "optimizer"}


def current_names(settings: dict[str, Any]) -> dict[str, Any]:
    """Stored ``settings`` (a preset's, a study trial's, a run's config) by today's names."""
    return {STORED_NAMES.get(k, k): v for k, v in settings.items()}


class ConfigError(ValueError):
    """A setting out of its bounds (or unknown): ``field`` and the reason."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


M = TypeVar("M", bound=RunParams)


def check(values: dict[str, Any], model: type[M]) -> M:
    """``model(**values)``; :class:`ConfigError` naming the first bad field otherwise."""
    try:
        return model(**values)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(field, first["msg"]) from None
