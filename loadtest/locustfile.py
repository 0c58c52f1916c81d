"""Locust load test of the recommendation API and the aggregator's client endpoints.

    locust -f loadtest/locustfile.py --headless -u 50 -r 10 -t 30s --host http://127.0.0.1:8702

``RecommendUser`` posts top-10 requests (host: the recommendation API). ``AggregatorClient``
registers a client id, then polls the current round, downloads the model (with its ETag, so an
unchanged model is a 304) and, when its client is in the round's cohort, uploads one update
encoded with ``fedrecgel.wire.encode_updates`` (sparse item rows, dense tower gradients).
Its host is ``FEDREC_LOAD_AGGREGATOR`` (default: ``--host``); it registers with the shard
enrolment token ``FEDREC_LOAD_ENROLMENT_TOKEN`` (``services.enrolment.enrolment_token(secret,
0, 1)`` enrols every id), its ids counting up from ``FEDREC_LOAD_FIRST_CLIENT`` (default 0). Pick classes by name, e.g.
``locust -f loadtest/locustfile.py RecommendUser``. Model shape for the request vectors:
``FEDREC_LOAD_N_ITEMS`` (default 2059, FilmTrust), ``FEDREC_LOAD_FACTOR`` (32),
``FEDREC_LOAD_LAYERS`` (3), ``FEDREC_LOAD_ROWS`` (sparse rows per update, default 140 x 5).
An ``AggregatorClient`` uploads only with the shape of the model it downloaded, so its updates
always match the served model whatever these are set to.

Against a live aggregator (``tests/test_loadtest.py`` runs this headless and checks that the
uploads were stored with no failure)::

    locust -f loadtest/locustfile.py AggregatorClient --headless -u 50 -r 10 -t 30s \
        --host http://127.0.0.1:8700
"""

from __future__ import annotations

import itertools
import os
import random
import threading

import torch
from locust import HttpUser, between, task

from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_model, encode_updates

CFG = ModelConfig(
    n_items=int(os.environ.get("FEDREC_LOAD_N_ITEMS", "2059")),
    factor=int(os.environ.get("FEDREC_LOAD_FACTOR", "32")),
    layers=int(os.environ.get("FEDREC_LOAD_LAYERS", "3")),
)
ROWS = int(os.environ.get("FEDREC_LOAD_ROWS", str(140 * 5)))
_ids = itertools.count(int(os.environ.get("FEDREC_LOAD_FIRST_CLIENT", "0")))
_ids_lock = threading.Lock()


def _next_client_id() -> int:
    with _ids_lock:
        return next(_ids)


def random_user(cfg: ModelConfig) -> dict[str, list[float]]:
    """A random user vector of the model's private shape."""
    return {n: (torch.randn(d) * 0.1).tolist() for n, d in cfg.private_dims().items()}


def random_update(cfg: ModelConfig, client_id: int, n_rows: int) -> Update:
    """A realistic update: gradients for the items one client touched (sparse) + the tower."""
    shapes = cfg.shared_shapes()
    rows = {}
    n_rows = min(n_rows, cfg.n_items)
    idx = torch.randperm(cfg.n_items)[:n_rows].sort().values
    for t in cfg.item_tables():
        rows[t] = (idx, torch.randn(n_rows, shapes[t][1]) * 1e-3)
    dense = {n: torch.randn(shapes[n]) * 1e-3 for n in cfg.dense_names()}
    return Update(client_id, max(1, n_rows // 5), rows, dense, loss=0.69)


class RecommendUser(HttpUser):
    """A device asking the recommendation API for its top 10."""

    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        """Fix this device's user vector."""
        self.user = random_user(CFG)

    @task
    def recommend(self) -> None:
        """POST /v1/recommendations with a random exclusion."""
        body = {"user": self.user, "k": 10, "exclude": [str(random.randrange(CFG.n_items))]}
        with self.client.post(
            "/v1/recommendations", json=body, name="recommendations", catch_response=True
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")


class AggregatorClient(HttpUser):
    """A federated client: register, follow rounds, download the model, upload updates."""

    wait_time = between(0.05, 0.2)
    host = os.environ.get("FEDREC_LOAD_AGGREGATOR") or None

    def on_start(self) -> None:
        """Register one client id and keep its token."""
        self.client_id = _next_client_id()
        self.token: str | None = None
        self.etag: str | None = None
        self.cfg: ModelConfig | None = None
        self.uploaded: set[int] = set()
        enrolment = os.environ.get("FEDREC_LOAD_ENROLMENT_TOKEN", "")
        with self.client.post(
            "/v1/clients",
            json={"client_ids": [self.client_id]},
            headers={"Authorization": f"Bearer {enrolment}"},
            name="register",
            catch_response=True,
        ) as r:
            if r.status_code == 201:
                self.token = r.json()["token"]
            else:
                r.failure(f"{r.status_code}: {r.text[:200]}")

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @task(5)
    def poll_round(self) -> None:
        """GET /v1/rounds/current; upload when this client is in the open round's cohort."""
        if self.token is None:
            return
        r = self.client.get("/v1/rounds/current", headers=self._auth(), name="round")
        if r.status_code != 200:
            return
        rnd = r.json()
        round_id = rnd.get("round_id")
        if (
            rnd.get("state") == "open"
            and self.client_id in (rnd.get("cohort") or [])
            and round_id not in self.uploaded
        ):
            self.upload(int(round_id))

    @task(2)
    def download_model(self) -> None:
        """GET /v1/models/latest with If-None-Match (304 when unchanged)."""
        if self.token is None:
            return
        self._download()

    def _download(self) -> None:
        headers = self._auth()
        if self.etag:
            headers["If-None-Match"] = self.etag
        with self.client.get(
            "/v1/models/latest", headers=headers, name="model", catch_response=True
        ) as r:
            if r.status_code == 200:
                self.etag = r.headers.get("ETag")
                self.cfg = decode_model(r.content)[0]
                r.success()
            elif r.status_code in (304, 404):
                # 304: unchanged; 404: no run has published a model yet
                r.success()
            else:
                r.failure(f"{r.status_code}")

    def upload(self, round_id: int) -> None:
        """POST one sparse update for this client, shaped like the model it downloaded."""
        if self.cfg is None:
            self._download()
            if self.cfg is None:
                return
        body = encode_updates(round_id, [random_update(self.cfg, self.client_id, ROWS)])
        headers = {**self._auth(), "Content-Type": "application/octet-stream"}
        # locust's HttpSession is a requests session: the body goes in ``data``
        with self.client.post(
            f"/v1/rounds/{round_id}/updates",
            data=body,
            headers=headers,
            name="upload",
            catch_response=True,
        ) as r:
            # 409: the round closed meanwhile, which is not a load failure
            if r.status_code in (200, 409):
                self.uploaded.add(round_id)
                r.success()
            else:
                r.failure(f"{r.status_code}: {r.text[:200]}")
