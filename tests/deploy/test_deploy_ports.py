"""Ports, service URLs, probes, start order and shards of the deployment agree with the
settings and the routes of the apps the containers run."""

from __future__ import annotations

import re
from pathlib import Path

from services.recommend_api.app import create_app as create_recommend_app
from services.recommend_api.settings import Settings as RecommendSettings
from tests.deploy.manifests import (
    BALANCER_DIR,
    BALANCER_IMAGE,
    IMAGE,
    MODULE_PREFIX,
    ROOT,
    SECRETS_MOUNT,
    balancer_config,
    balancer_port,
    command_module,
    compose,
    compose_service_port,
    compose_services_running,
    configmap_env,
    containers,
    dockerfile_app_files,
    fake_compose_env,
    get_routes,
    k8s_docs,
    k8s_objects,
    k8s_one,
    url_path_port,
)


def _healthcheck_url(test: list[str]) -> str | None:
    for arg in test:
        if arg.startswith("http://"):
            return arg
    return None


def test_compose_ports_and_healthchecks_match_the_settings_and_routes(tmp_path: Path) -> None:
    routes = {m: get_routes(m, tmp_path) for m in MODULE_PREFIX}
    checked = 0
    for name, svc in compose()["services"].items():
        module = command_module(svc.get("command", []))
        if module is None:
            continue
        port = compose_service_port(name, svc)
        for mapping in svc.get("ports", []):
            assert int(mapping.rsplit(":", 1)[1]) == port, f"{name}: {mapping} vs port {port}"
        url = _healthcheck_url(svc["healthcheck"]["test"])
        assert url is not None, f"{name}: healthcheck names no URL"
        host, url_port, path = url_path_port(url)
        assert (host, url_port) == ("127.0.0.1", port), f"{name}: {url}"
        # recommend-api's /healthz is readiness (503 before the first model): liveness there
        want = "/livez" if module == "services.recommend_api" else "/healthz"
        assert path == want and path in routes[module], f"{name}: {path}"
        checked += 1
    assert checked == 5  # aggregator, two workers, recommend-api, dashboard


def test_the_balancer_sends_to_the_aggregator_replicas_and_checks_their_health(
    tmp_path: Path,
) -> None:
    """``aggregator`` is haproxy (deploy/balancer) in front of ``aggregator-replica``: its
    servers are that service's replicas on the port they listen on, health-checked on a real
    route of the aggregator; the host and the other services reach it on its bind port, and
    the aggregator's port is published by it alone."""
    services = compose()["services"]
    balancer, replica = services["aggregator"], services["aggregator-replica"]
    assert balancer["image"] == BALANCER_IMAGE
    build = balancer["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).parent == BALANCER_DIR
    assert command_module(replica["command"]) == "services.aggregator"
    assert "ports" not in replica and replica["deploy"]["replicas"].endswith(":-3}")
    port = balancer_port()
    assert [int(m.rsplit(":", 1)[1]) for m in balancer["ports"]] == [port]
    assert url_path_port(_healthcheck_url(balancer["healthcheck"]["test"]) or "")[1] == port
    (backend,) = [lines for name, lines in balancer_config().items() if name.startswith("backend")]
    (template,) = [line for line in backend if line.startswith("server-template")]
    target = template.split()[-1]
    assert target == f"aggregator-replica:{compose_service_port('aggregator-replica', replica)}"
    assert "option httpchk GET /healthz" in backend and "/healthz" in get_routes(
        "services.aggregator", tmp_path
    )
    assert any("check" in line.split() for line in backend if line.startswith("default-server"))
    dockerfile = (BALANCER_DIR / "Dockerfile").read_text()
    assert "COPY healthcheck.sh /healthcheck.sh" in dockerfile
    assert balancer["healthcheck"]["test"][:3] == ["CMD", "bash", "/healthcheck.sh"]


def test_compose_healthchecks_use_the_image_probe() -> None:
    for name, svc in compose()["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        if test and svc.get("image") == IMAGE:
            assert test[:3] == ["CMD", "bash", "/app/healthcheck.sh"], name
            assert "healthcheck.sh" in dockerfile_app_files()


def test_recommend_api_is_live_but_not_ready_before_the_first_model() -> None:
    """The compose healthcheck route answers 200 while no run has published a model, so the
    container is healthy; the readiness route (k8s) still says 503 no_model."""
    from fastapi.testclient import TestClient

    with TestClient(create_recommend_app(RecommendSettings(aggregator_url=None, workers=1))) as c:
        live, ready = c.get("/livez"), c.get("/healthz")
    assert live.status_code == 200 and live.json()["model_version"] is None
    assert ready.status_code == 503 and ready.json()["status"] == "no_model"


def test_compose_service_urls_point_at_real_services_and_ports() -> None:
    services = compose()["services"]
    ports = {n: compose_service_port(n, s) for n, s in services.items()}
    ports.update({"postgres": 5432, "redis": 6379})
    urls = [
        (name, var, v)
        for name, svc in services.items()
        for var, value in svc.get("environment", {}).items()
        for v in fake_compose_env(value).split(",")
        if re.match(r"^(http|redis|postgresql\+psycopg)://", v)
    ]
    assert len(urls) > 10
    for name, var, url in urls:
        host, port, _ = url_path_port(url)
        assert host in services, f"{name}.{var}: {host} is not a compose service"
        assert port == ports[host], f"{name}.{var}: port {port}, {host} listens on {ports[host]}"


def test_k8s_ports_probes_and_service_urls_agree(tmp_path: Path) -> None:
    routes = {m: get_routes(m, tmp_path) for m in MODULE_PREFIX}
    services = {s["metadata"]["name"]: s for s in k8s_objects("Service")}
    listening: dict[str, int] = {}
    for workload, c in containers():
        module = command_module(c.get("command", []))
        if module is None:
            continue
        env = configmap_env(c)
        prefix = MODULE_PREFIX[module]
        key = "HTTP_PORT" if prefix == "FEDREC_WORKER_" else "PORT"
        port = int(env[f"{prefix}{key}"])
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert named == {"http": port}, workload
        for probe in ("readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            assert get["port"] in ("http", port)
            assert get["path"] in routes[module], f"{workload}.{probe}: {get['path']}"
        assert c["readinessProbe"]["httpGet"]["path"] == "/healthz", workload
        svc = services[workload]
        selector = svc["spec"]["selector"]
        (pod_labels,) = [
            d["spec"]["template"]["metadata"]["labels"]
            for _, d in k8s_docs()
            if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload
        ]
        assert selector.items() <= pod_labels.items(), workload
        assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(port, "http")]
        listening[workload] = port
    listening.update({"postgres": 5432, "redis": 6379})
    values = [v for _, c in containers() for v in configmap_env(c).values()]
    urls = [u for v in values for u in v.split(",") if re.match(r"^(http|redis|postgresql)", u)]
    assert len(urls) > 8
    for url in urls:
        host, url_port, _ = url_path_port(url)
        name = host.split(".")[-1]  # worker-0.worker -> the headless Service "worker"
        assert name in services, url
        assert url_port == listening[name], url


# (dependent, dependency) pairs that need not wait for health: the dependent waits by itself
# (a worker retries its registration until the aggregator answers; the demo waits until
# recommend-api serves the final model), so they start side by side.
PATIENT = {("worker-0", "aggregator"), ("worker-1", "aggregator"), ("demo", "recommend-api")}
# the dashboard shows which service does not answer yet; the balancer health-checks the
# replicas itself and balances over those that answer
PATIENT |= {("dashboard", "aggregator"), ("aggregator", "aggregator-replica")}


def test_depends_on_waits_for_health_where_there_is_a_healthcheck() -> None:
    services = compose()["services"]
    edges = 0
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if "test" in services[dep].get("healthcheck", {}) and (name, dep) not in PATIENT:
                assert cond["condition"] == "service_healthy", f"{name} -> {dep}"
            edges += 1
    assert edges >= 8
    for name in ("aggregator", "aggregator-replica", "worker-0", "worker-1", "recommend-api"):
        assert "healthcheck" in services[name], name
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["redis"]
    assert set(services["aggregator-replica"]["depends_on"]) == {"secrets", "postgres", "redis"}
    assert set(services["aggregator"]["depends_on"]) == {"aggregator-replica"}
    assert {"aggregator", "redis"} <= set(services["recommend-api"]["depends_on"])
    # every service that reads a generated secret starts after the secrets exist
    for name, svc in services.items():
        if any(v.startswith(SECRETS_MOUNT) for v in svc.get("environment", {}).values()):
            deps = svc["depends_on"]
            assert "secrets" in deps or "aggregator" in deps, name
        if any(v.startswith("secrets:") for v in svc.get("volumes", [])) and name != "secrets":
            assert all(v.endswith(":ro") for v in svc["volumes"] if v.startswith("secrets:"))
    assert services["secrets"]["restart"] == "no"
    assert services["demo"]["restart"] == "no" and "profiles" not in services["demo"]


# ---------------------------------------------------------------- shards


def test_compose_workers_cover_every_shard_with_their_own_store() -> None:
    services = compose()["services"]
    workers = dict(compose_services_running("services.client_sim"))
    shards = {int(w["environment"]["FEDREC_WORKER_SHARDS"]) for w in workers.values()}
    assert len(shards) == 1
    (n,) = shards
    indices = sorted(int(w["environment"]["FEDREC_WORKER_SHARD"]) for w in workers.values())
    assert indices == list(range(n))
    volumes = [v for w in workers.values() for v in w["volumes"] if not v.startswith("secrets:")]
    assert len(set(volumes)) == len(volumes) == n  # one store volume per shard
    demo = services["demo"]["environment"]
    wait_for = demo["WAIT_FOR"].split(",")
    assert sorted(url_path_port(u)[0] for u in wait_for) == sorted(workers)
    # the demo asks user u's recommendations from worker u % shards: in shard order
    urls = demo["WORKER_URLS"].split(",")
    owner = {int(w["environment"]["FEDREC_WORKER_SHARD"]): name for name, w in workers.items()}
    assert [url_path_port(u)[0] for u in urls] == [owner[i] for i in range(n)]


def test_k8s_worker_ordinals_are_the_shards() -> None:
    sts = k8s_one("StatefulSet", "worker")
    env = k8s_one("ConfigMap", "worker-config")["data"]
    replicas = sts["spec"]["replicas"]
    assert int(env["FEDREC_WORKER_SHARDS"]) == replicas
    assert env["FEDREC_WORKER_SHARD_FROM_HOSTNAME"] == "true"
    assert "FEDREC_WORKER_SHARD" not in env
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    job = k8s_one("Job", "start-run")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    wait_for = next(e["value"] for e in c["env"] if e["name"] == "WAIT_FOR").split(",")
    hosts = sorted(url_path_port(u)[0] for u in wait_for)
    assert hosts == [f"worker-{i}.{sts['spec']['serviceName']}" for i in range(replicas)]
