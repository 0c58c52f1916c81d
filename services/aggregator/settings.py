"""Aggregator settings, read from the environment with the prefix ``FEDREC_AGG_``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict
from sqlalchemy.engine import make_url

from fedrecgel.config import MAX_MODEL_PARAMS
from fedrecgel.robust import DEFAULT_FACTOR
from services.ports import AGGREGATOR_PORT
from services.secret_files import secret_from_file, weak_secret
from services.service_settings import Environment, ServiceSettings
from services.url_settings import DatabaseUrl, LogLevel, RedisUrl, Threads

PLACEHOLDER_TOKEN = "changethis"
#: the most clients one registration may name (and one evaluation report may cover)
DEFAULT_MAX_REGISTER_PER_REQUEST = 10_000
#: the largest declared population (client ids are 0 .. population - 1)
MAX_POPULATION = 100_000_000


class Settings(ServiceSettings):
    """Everything the aggregator needs to start; nothing connects when this is built."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_AGG_")

    # Production unless chosen otherwise: every secret is then checked for strength.
    environment: Environment = "production"
    database_url: DatabaseUrl = "sqlite:///./aggregator.db"
    redis_url: RedisUrl = None
    operator_token: str = PLACEHOLDER_TOKEN
    # Optional read-only credential for services that only download models (recommend_api).
    reader_token: str | None = None
    # The same secrets read from files (services/secret_files.py), and the database password
    # put into ``database_url`` from a file (the URL then names no password).
    operator_token_file: Path | None = None
    reader_token_file: Path | None = None
    database_password_file: Path | None = None
    # Shard enrolment (services/enrolment.py): workers register their clients with tokens
    # derived from this secret; registration is refused while it is unset.
    enrolment_secret: str | None = None
    enrolment_secret_file: Path | None = None
    # The population: client ids are 0 .. population - 1; or the number of users of a
    # dataset's split (read once at start, from ``population_data_dir`` when given).
    population: int | None = Field(default=None, ge=1, le=MAX_POPULATION)
    # With ``population``: the size of its workers' catalogue, which a run must then name
    # (known from a dataset's split with ``population_dataset``; unchecked when unset), and
    # with both, ``population_dataset`` names that catalogue only (not read; `fedrec up`).
    population_items: int | None = Field(default=None, ge=1)
    population_dataset: str | None = Field(default=None, min_length=1, max_length=200)
    population_data_dir: Path | None = None
    # The most client ids one request may carry (registration, evaluation report).
    max_register_per_request: int = Field(
        default=DEFAULT_MAX_REGISTER_PER_REQUEST, ge=1, le=1_000_000
    )
    # The largest model a run may build (shared parameters): refused with 422 before anything
    # is allocated.
    max_model_params: int = Field(default=MAX_MODEL_PARAMS, ge=1)
    # Largest upload body (bytes); every other request body is limited to max_json_bytes.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_json_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    host: str = "127.0.0.1"
    port: int = Field(default=AGGREGATOR_PORT, ge=0, le=65535)
    deadline_poll_s: float = Field(default=1.0, gt=0, le=3600, allow_inf_nan=False)
    model_cache_versions: int = Field(default=8, ge=1)
    # Retention of model versions: the newest ``keep_latest_versions`` and every version that
    # is a multiple of ``keep_every_versions`` (0: none besides the newest) keep their params;
    # the others are pruned when a round closes (reading one answers 410). Only the newest
    # version keeps its server-optimizer state: it is all a resumed run needs.
    keep_latest_versions: int = Field(default=5, ge=1)
    keep_every_versions: int = Field(default=10, ge=0)
    # Retention of runs: the newest ``keep_runs`` runs keep their versions as above; every
    # version of an older run is pruned too (its history and metrics stay), so that storage
    # stays bounded across runs (every ``docker compose up`` of the demo starts one).
    keep_runs: int = Field(default=10, ge=1)
    # Least seconds between two compactions (space freed by pruning handed back to the
    # file system: SQLite incremental vacuum + WAL truncation, PostgreSQL VACUUM), run by the
    # background task after a round closed, never on a request.
    compact_interval_s: float = Field(default=30.0, ge=0, le=86400, allow_inf_nan=False)
    # the closing lock's lifetime: renewed every third of it while a close runs, so a replica
    # that dies inside a close holds the round up for at most this long
    redis_lock_timeout_s: float = Field(default=10.0, gt=0, le=86400, allow_inf_nan=False)
    redis_lock_wait_s: float = Field(default=10.0, ge=0, le=3600, allow_inf_nan=False)
    log_level: LogLevel = "info"
    # Intra-op threads of torch in the server process (set by ``python -m services.aggregator``).
    # Aggregation is small, memory-bound work: one thread is fastest and never fights the
    # request threads for cores.
    torch_threads: Threads | None = 1
    # Robust aggregation (fedrecgel/robust.py): when a round closes, each client's upload is
    # scaled down to this many times the round's median upload norm, and its sample count and
    # loss capped at this many times theirs (0: off). Honest cohorts stay well inside the
    # default; a small factor (e.g. 3) bounds the attackers' direction too but also scales down
    # honest outliers, and the model then differs from the simulator's (docs/API.md).
    upload_screen_factor: float = Field(default=DEFAULT_FACTOR, ge=0.0, le=1e6, allow_inf_nan=False)

    @model_validator(mode="after")
    def _read_secret_files(self) -> Settings:
        """Secrets given as ``*_FILE`` paths are read before they are checked."""
        if (token := secret_from_file(self, "operator_token")) is not None:
            self.operator_token = token
        if (token := secret_from_file(self, "reader_token")) is not None:
            self.reader_token = token
        if (secret := secret_from_file(self, "enrolment_secret")) is not None:
            self.enrolment_secret = secret
        if (password := secret_from_file(self, "database_password")) is not None:
            url = make_url(self.database_url).set(password=password)
            self.database_url = url.render_as_string(hide_password=False)
        return self

    @model_validator(mode="after")
    def _refuse_weak_secrets(self) -> Settings:
        """Secrets must be real: in production no placeholder, short or low-entropy value is
        accepted for any of them, nor an operator token left unset; in the test environment
        the placeholder operator token is refused; development (chosen explicitly) accepts
        anything non-empty. Every refused secret is named, one line each."""
        env = self.environment
        problems = [
            refused_secret(self.operator_token, "FEDREC_AGG_OPERATOR_TOKEN", env),
            refused_secret(self.reader_token, "FEDREC_AGG_READER_TOKEN", env),
            refused_secret(self.enrolment_secret, "FEDREC_AGG_ENROLMENT_SECRET", env),
        ]
        unset = "operator_token" not in self.model_fields_set and not self.operator_token_file
        if env == "production" and unset:  # the placeholder default: say it was not set
            problems[0] = (
                "FEDREC_AGG_OPERATOR_TOKEN is not set; set it (or FEDREC_AGG_OPERATOR_TOKEN_FILE) "
                "to a real secret (e.g. `openssl rand -hex 32`)"
            )
        elif env == "test" and self.operator_token == PLACEHOLDER_TOKEN:
            problems[0] = (
                "FEDREC_AGG_OPERATOR_TOKEN must be set to a real secret outside development"
            )
        if refused := [p for p in problems if p is not None]:
            raise ValueError("\n".join(refused))
        return self

    @model_validator(mode="after")
    def _one_population(self) -> Settings:
        if (
            self.population is not None
            and self.population_dataset is not None
            and self.population_items is None
        ):
            raise ValueError(
                "set FEDREC_AGG_POPULATION or FEDREC_AGG_POPULATION_DATASET, not both (or both "
                "with FEDREC_AGG_POPULATION_ITEMS: the dataset then only names the catalogue)"
            )
        if self.population_items is not None and self.population is None:
            raise ValueError(
                "FEDREC_AGG_POPULATION_ITEMS goes with FEDREC_AGG_POPULATION (a dataset's "
                "population, FEDREC_AGG_POPULATION_DATASET, has its own catalogue)"
            )
        return self


def refused_secret(value: str | None, variable: str, environment: str) -> str | None:
    """Why the aggregator refuses ``value`` as its secret ``variable`` in ``environment`` (an
    empty one anywhere; in production a weak one: :func:`~services.secret_files.weak_secret`),
    or None when it is accepted or unset (None). The one rule for its secrets: the aggregator's
    start and ``fedrec enrolment-token`` apply it alike."""
    if value is None:
        return None
    if not value:
        return f"{variable} must not be empty"
    why = weak_secret(value, variable) if environment == "production" else None
    if why is None:
        return None
    return (
        f"{why} (FEDREC_AGG_ENVIRONMENT=production; set FEDREC_AGG_ENVIRONMENT=development to "
        "run with weak secrets)"
    )


@dataclass(frozen=True)
class Population:
    """The declared population: client ids ``0 .. n_users - 1``; when it was read from a
    dataset, that dataset's name and catalogue size, which a run must then name too (its
    workers hold that dataset and refuse any other); a number of clients may come with the
    catalogue size alone (``population_items``)."""

    n_users: int
    dataset: str | None = None
    n_items: int | None = None


def resolve_population(settings: Settings) -> Population | None:
    """The declared population: ``population`` (with the catalogue's size and name when
    given: a launcher that read the split already), or the users and items of
    ``population_dataset``'s split (loaded once, at start), or None (registration refused)."""
    if settings.population is not None:
        return Population(
            settings.population, settings.population_dataset, settings.population_items
        )
    if settings.population_dataset is None:
        return None
    from fedrecgel.data import load_split

    split = load_split(settings.population_dataset, settings.population_data_dir)
    return Population(int(split.n_users), settings.population_dataset, int(split.n_items))
