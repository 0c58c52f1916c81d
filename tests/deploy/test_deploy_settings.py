"""Every ``FEDREC_*`` variable of the deployment is a field of the settings class of its
prefix, the whole environment of each service validates into that class (secret files in
place), and every container command is a real entry point."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from services.aggregator.settings import Settings as AggregatorSettings
from tests.deploy.manifests import (
    IMAGE,
    K8S_VAR,
    MODULE_PREFIX,
    PLACEHOLDERS,
    SECRETS_MOUNT,
    SETTINGS,
    command_is_real,
    command_module,
    compose,
    compose_services_running,
    configmap_env,
    containers,
    deploy_script,
    fake_compose_env,
    k8s_objects,
    k8s_one,
    pod_specs,
)


def _compose_fedrec_vars() -> list[tuple[str, str]]:
    return [
        (name, var)
        for name, svc in compose()["services"].items()
        for var in svc.get("environment", {})
        if var.startswith("FEDREC_")
    ]


def _k8s_fedrec_vars() -> list[tuple[str, str]]:
    out = [
        (cm["metadata"]["name"], var)
        for cm in k8s_objects("ConfigMap")
        for var in cm["data"]
        if var.startswith("FEDREC_")
    ]
    out += [
        (sec["metadata"]["name"], var)
        for sec in k8s_objects("Secret")
        for var in sec["stringData"]
        if var.startswith("FEDREC_")
    ]
    out += [
        (workload, e["name"])
        for workload, c in containers()
        for e in c.get("env", [])
        if e["name"].startswith("FEDREC_")
    ]
    return out


@pytest.mark.parametrize(("where", "var"), _compose_fedrec_vars() + _k8s_fedrec_vars())
def test_every_fedrec_variable_is_a_settings_field(where: str, var: str) -> None:
    prefix = next((p for p in SETTINGS if var.startswith(p)), None)
    assert prefix is not None, f"{where}: {var} has no known settings prefix"
    field = var.removeprefix(prefix).lower()
    assert field in SETTINGS[prefix].model_fields, f"{where}: {var} is not a field of {prefix}*"


def test_fedrec_variables_are_found_at_all() -> None:
    """Guard for the parametrized check above: it really sees the variables."""
    assert len(_compose_fedrec_vars()) > 20 and len(_k8s_fedrec_vars()) > 15


def test_every_command_is_a_real_entry_point() -> None:
    commands = [svc["command"] for svc in compose()["services"].values() if "command" in svc]
    commands = [c for c in commands if c[0] not in ("redis-server", "postgres")]
    commands += [c["command"] for _, c in containers() if c["image"] == IMAGE]
    assert len(commands) >= 8
    for command in commands:
        assert command_is_real(command), command


def test_command_check_can_fail() -> None:
    assert command_is_real(["fedrec", "worker"]) and command_is_real(["fedrec", "aggregator"])
    assert not command_is_real(["fedrec", "no-such-command"])
    assert not command_is_real(["python", "-m", "services.no_such_service"])
    assert not command_is_real(["python", "/app/missing.py"])


def _expand_k8s(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of an env value from the vars defined before it."""
    return K8S_VAR.sub(lambda m: env[m.group(1)], value)


def _k8s_secret_files_in(
    tmp_path: Path, container: dict[str, Any], env: dict[str, str]
) -> dict[str, str]:
    """``env`` with paths into a Secret mounted in ``container`` moved to ``tmp_path``, where the
    Secret's keys are files: enrolment tokens derived as the Secret's comment says, from the
    aggregator's enrolment secret (with its placeholder replaced as the caller did)."""
    from services.enrolment import enrolment_token

    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    pod = next(p for _, p in pod_specs() if container in p["containers"])
    enrol_secret = "a-real-secret-fedrec_agg_enrolment_secret"
    for vol in pod.get("volumes", []):
        if "secret" not in vol or vol["name"] not in mounts:
            continue
        data = k8s_one("Secret", vol["secret"]["secretName"])["stringData"]
        folder = tmp_path / vol["name"]
        folder.mkdir(exist_ok=True)
        for key in data:
            shard, shards = int(key.rsplit("_", 1)[1]), len(data)
            (folder / key).write_text(enrolment_token(enrol_secret, shard, shards) + "\n")
        mount = mounts[vol["name"]].rstrip("/") + "/"
        env = {
            k: str(folder / v.removeprefix(mount)) if v.startswith(mount) else v
            for k, v in env.items()
        }
    return env


def _init_secrets() -> Any:
    return deploy_script("init_secrets")


def _secret_files_in(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the compose secrets volume in ``tmp_path``, filled by the secrets service's
    own code (deploy/init_secrets.py) for the compose file's shard count."""
    shards = int(compose()["services"]["secrets"]["environment"]["WORKER_SHARDS"])
    if not (tmp_path / "operator_token").exists():
        _init_secrets().ensure_secrets(tmp_path, {}, shards)
    return {
        k: str(tmp_path / v.removeprefix(SECRETS_MOUNT)) if v.startswith(SECRETS_MOUNT) else v
        for k, v in env.items()
    }


def _settings_from(
    env: dict[str, str], module: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Build ``module``'s settings class from exactly ``env`` (no other ``FEDREC_*`` variable):
    raises on a bad value (type, range, placeholder secret, shard)."""
    prefix = MODULE_PREFIX[module]
    assert all(not k.startswith("FEDREC_") or k.startswith(prefix) for k in env), where
    for k in list(os.environ):
        if k.startswith("FEDREC_"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    SETTINGS[prefix]()


@pytest.mark.parametrize("module", sorted(MODULE_PREFIX))
def test_compose_environment_validates_into_the_settings(
    module: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each service's whole environment (secret files in place) builds its settings class."""
    services = compose_services_running(module)
    assert services
    for name, svc in services:
        env = {k: fake_compose_env(v) for k, v in svc.get("environment", {}).items()}
        env = _secret_files_in(tmp_path, env)
        _settings_from(env, module, name, monkeypatch)


@pytest.mark.parametrize("module", sorted(MODULE_PREFIX))
def test_k8s_environment_validates_into_the_settings(
    module: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same for k8s containers (ConfigMap + Secret with a real value in place)."""
    found = [(w, c) for w, c in containers() if command_module(c.get("command", [])) == module]
    assert found
    monkeypatch.setattr("socket.gethostname", lambda: "worker-1")  # a StatefulSet pod name
    for workload, c in found:
        env = configmap_env(c)
        env = {
            k: (f"a-real-secret-{k.lower()}" if v in PLACEHOLDERS else v) for k, v in env.items()
        }
        env = {k: _expand_k8s(v, env) for k, v in env.items()}
        env = _k8s_secret_files_in(tmp_path, c, env)
        _settings_from(env, module, workload, monkeypatch)


def test_the_committed_operator_token_placeholder_is_refused_in_production() -> None:
    """A Secret applied without replacing the token cannot start the aggregator."""
    token = k8s_one("Secret", "fedrec-secrets")["stringData"]["FEDREC_AGG_OPERATOR_TOKEN"]
    env = k8s_one("ConfigMap", "aggregator-config")["data"]
    assert env["FEDREC_AGG_ENVIRONMENT"] == "production"
    with pytest.raises(ValueError, match="OPERATOR_TOKEN"):
        AggregatorSettings(environment="production", operator_token=token)


@pytest.mark.parametrize(
    ("module", "values", "field"),
    [
        ("services.aggregator.settings", {"compact_interval_s": float("inf")}, "compact"),
        ("services.aggregator.settings", {"deadline_poll_s": float("inf")}, "deadline_poll"),
        ("services.aggregator.settings", {"redis_lock_timeout_s": float("inf")}, "redis_lock"),
        ("services.recommend_api.settings", {"fetch_timeout_s": float("inf")}, "fetch_timeout"),
        ("services.recommend_api.settings", {"aggregator_url": "notaurl"}, "aggregator_url"),
        ("services.dashboard.settings", {"aggregator_url": "aggregator:8700"}, "aggregator_url"),
        ("services.dashboard.settings", {"recommend_url": "ftp://x"}, "recommend_url"),
        ("services.dashboard.settings", {"worker_urls": "http://w0:1,w1:2"}, "worker_urls"),
        ("services.dashboard.settings", {"timeout_s": float("inf")}, "timeout_s"),
    ],
)
def test_unusable_intervals_and_urls_are_settings_errors(
    module: str, values: dict[str, Any], field: str
) -> None:
    """Each was accepted: an infinite interval ended in an OverflowError in a background
    thread or a loop that never woke (rounds never closed at their deadline), and a URL
    without its scheme in a service that started and then failed every call."""
    import importlib

    from pydantic import BaseModel, ValidationError

    mod = importlib.import_module(module)
    cls = next(
        c
        for name, c in vars(mod).items()
        if isinstance(c, type)
        and issubclass(c, BaseModel)
        and name.endswith("Settings")
        and c.__module__ == module
    )
    base: dict[str, Any] = {"environment": "development"}
    if module == "services.aggregator.settings":
        base["operator_token"] = "op-token-0123456789abcdef"
    with pytest.raises(ValidationError, match=field):
        cls(**base, **values)
