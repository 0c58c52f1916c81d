"""The worker's settings: flags and ``FEDREC_WORKER_*`` environment values, checked."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from fedrecgel.config import DEFAULTS
from services.enrolment import EnrolmentTokenError, parse_enrolment_token
from services.error_handlers import DEFAULT_MAX_JSON_BYTES
from services.host_check import is_loopback
from services.ports import AGGREGATOR_URL, RECOMMEND_URL
from services.secret_files import secret_from_file, weak_secret
from services.service_settings import ServiceSettings
from services.url_settings import HttpUrl, RedisUrl, Threads

_ORDINAL = re.compile(r"-(\d+)$")


class WorkerError(RuntimeError):
    """The worker cannot take part (wrong dataset, store of another shard, ...)."""


def hostname_ordinal(hostname: str) -> int:
    """The trailing ordinal of a host name (``fedrec-worker-2`` -> 2; a FQDN's first label).

    A StatefulSet's pod ``<name>-<ordinal>`` gets that host name, so each replica owns a
    stable shard across restarts and rescheduling.
    """
    label = hostname.split(".", 1)[0]
    match = _ORDINAL.search(label)
    if match is None:
        raise ValueError(f"host name {hostname!r} does not end in -<ordinal>")
    return int(match.group(1))


class WorkerSettings(ServiceSettings):
    """Worker configuration; every field can be set from the env as ``FEDREC_WORKER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_WORKER_")

    aggregator: HttpUrl = AGGREGATOR_URL
    shard: int = 0
    shards: int = 1
    # The shard enrolment token the users are registered with (services/enrolment.py; issued by
    # `fedrec enrolment-token`): it names its shard, which must be this worker's. Needed until
    # the store holds the client token the registration answered. ``{shard}`` in the file path
    # is replaced by the shard (one file per shard in a mounted secret).
    enrolment_token: SecretStr | None = None
    enrolment_token_file: Path | None = None
    dataset: str = DEFAULTS.dataset
    data_dir: Path | None = None
    # hold out a validation item per user (as fedrec train and fedrec up do): the aggregator
    # chooses the popularity prior's weight on its sums
    validation: bool = True
    store: str = "worker-{shard}.db"  # a shard's own file: another shard's store is refused
    redis_url: RedisUrl = None
    max_rounds: int | None = None
    exit_when_finished: bool = True
    poll_min_s: float = Field(default=0.2, gt=0, le=3600, allow_inf_nan=False)
    poll_max_s: float = Field(default=5.0, gt=0, le=3600, allow_inf_nan=False)
    timeout_s: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    # A failed request (no answer, 429, 5xx) is tried again (services/retry.py): after
    # backoff_s doubling up to max_backoff_s, or the Retry-After the aggregator sent, each wait
    # lengthened by up to half at random; at most ``retries`` times, and none that would start
    # later than retry_deadline_s after the first try.
    retries: int = Field(default=10, ge=0, le=100)
    backoff_s: float = Field(default=0.2, ge=0, le=3600, allow_inf_nan=False)
    max_backoff_s: float = Field(default=5.0, ge=0, le=3600, allow_inf_nan=False)
    retry_deadline_s: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    log_level: str = "INFO"
    # Intra-op threads of torch in the worker process (None: torch's default, one per core).
    # Workers sharing a machine should split its cores: oversubscribed threads spin-wait.
    torch_threads: Threads | None = None
    # Compute the cohort members' uploads in groups (several times faster) instead of one
    # client at a time. A client's float rounding then depends on its group: the run is the
    # simulator's bit for bit only while every worker computes all its members together (a
    # worker that recomputes a subset after a crash may send a different update, refused as
    # conflicting: those clients miss the round). Off: the same bytes whatever the group.
    grouped_uploads: bool = False
    # Take ``shard`` from the trailing ordinal of the host name (``worker-3`` -> 3), as a
    # Kubernetes StatefulSet names its pods; overrides ``shard``.
    shard_from_hostname: bool = False
    # The device API (services.client_sim.server): off unless a port is given. On loopback it
    # is open; bound to any other address it requires ``device_token`` (``Authorization:
    # Bearer``) on every request but /healthz.
    http_port: int | None = Field(default=None, ge=0, le=65535)
    http_host: str = "127.0.0.1"
    device_token: SecretStr | None = None
    device_token_file: Path | None = None
    # The largest request body the device API accepts (its routes take none: 413 above).
    http_max_body_bytes: int = Field(default=DEFAULT_MAX_JSON_BYTES, ge=1024)
    recommend_url: HttpUrl = RECOMMEND_URL
    # How recommend_api names items: the dataset's own ids (it runs with FEDREC_REC_DATASET)
    # or catalogue indices as strings (it runs without labels).
    recommend_item_ids: Literal["dataset", "index"] = "dataset"

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.shard_from_hostname:
            self.shard = hostname_ordinal(socket.gethostname())
        # ``{shard}`` in the store path: one file per shard on a shared volume
        self.store = self.store.replace("{shard}", str(self.shard))
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ValueError(
                f"need 0 <= shard < shards, got shard={self.shard}, shards={self.shards}"
            )
        if self.poll_min_s <= 0 or self.poll_max_s < self.poll_min_s:
            raise ValueError("need 0 < poll_min_s <= poll_max_s")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(
                f"log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got "
                f"{self.log_level!r}"
            )
        self._check_enrolment_token()
        self._check_device_token()
        return self

    def _check_enrolment_token(self) -> None:
        if self.enrolment_token_file is not None:
            self.enrolment_token_file = Path(
                str(self.enrolment_token_file).replace("{shard}", str(self.shard))
            )
        if (token := secret_from_file(self, "enrolment_token")) is not None:
            self.enrolment_token = SecretStr(token)
        if self.enrolment_token is None:
            return
        try:
            named = parse_enrolment_token(self.enrolment_token.get_secret_value())
        except EnrolmentTokenError as err:
            raise ValueError(f"FEDREC_WORKER_ENROLMENT_TOKEN: {err}") from None
        if (named.shard, named.shards) != (self.shard, self.shards):
            raise ValueError(
                f"FEDREC_WORKER_ENROLMENT_TOKEN enrols shard {named.shard} of {named.shards}, "
                f"but this worker is shard {self.shard} of {self.shards}: give it the token of "
                f"its own shard (`fedrec enrolment-token --shard {self.shard} --shards "
                f"{self.shards}`)"
            )

    def _check_device_token(self) -> None:
        if (token := secret_from_file(self, "device_token")) is not None:
            self.device_token = SecretStr(token)
        if self.device_token is not None:
            why = weak_secret(self.device_token.get_secret_value(), "FEDREC_WORKER_DEVICE_TOKEN")
            if why is not None:
                raise ValueError(why)
        elif self.http_port is not None and not is_loopback(self.http_host):
            raise ValueError(
                f"the device API listens on {self.http_host}, beyond this machine: set "
                "FEDREC_WORKER_DEVICE_TOKEN or FEDREC_WORKER_DEVICE_TOKEN_FILE (callers send "
                "it as 'Authorization: Bearer <token>'), or bind it to 127.0.0.1"
            )
