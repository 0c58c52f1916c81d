"""Static checks of the deployment: docker-compose.yml, deploy/k8s/*.yaml and deploy/Dockerfile.

Docker and a cluster are not available where the tests run, so the manifests are checked
against what the code really is: every ``FEDREC_*`` variable is a field of the settings class of
its prefix (and the whole environment of a service validates into that class), every command
is an importable module or a ``fedrec`` subcommand, every probe path is a GET route of the app
the container runs, ports and service URLs agree, ``depends_on`` waits for health, nothing runs
as root and no secret is committed.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from pydantic_settings import BaseSettings

from services.aggregator.app import create_app as create_aggregator_app
from services.aggregator.settings import Settings as AggregatorSettings
from services.cli import app as fedrec_cli
from services.client_sim.server import create_app as create_worker_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.recommend_api.app import create_app as create_recommend_app
from services.recommend_api.settings import Settings as RecommendSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
IMAGE = "fedrecgel:0.1.0"

SETTINGS: dict[str, type[BaseSettings]] = {
    str(cls.model_config["env_prefix"]): cls
    for cls in (AggregatorSettings, WorkerSettings, RecommendSettings)
}
# the service module each settings prefix configures
MODULE_PREFIX = {
    "services.aggregator": "FEDREC_AGG_",
    "services.client_sim": "FEDREC_WORKER_",
    "services.recommend_api": "FEDREC_REC_",
}
CLI_MODULE = {"aggregator": "services.aggregator", "worker": "services.client_sim"}
CLI_MODULE["recommend"] = "services.recommend_api"
PLACEHOLDERS = {"REPLACE_ME", "changethis"}
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|SECRET|API_KEY|PRIVATE_KEY)", re.IGNORECASE)
COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")
HOST_PORT = r"(\d+|\$\{\w+:-\d+\})"  # a port, or a variable with a port as its default
COMPOSE_DEFAULT = re.compile(r"^\$\{\w+:-([^}]*)\}$")
SECRETS_MOUNT = "/run/fedrec-secrets/"
K8S_VAR = re.compile(r"\$\((\w+)\)")

# ---------------------------------------------------------------- loading


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def _k8s_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in _k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def _k8s_objects(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in _k8s_docs() if d.get("kind") == kind]


def _k8s_one(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [d for d in _k8s_objects(kind) if d["metadata"]["name"] == name]
    return obj


# ---------------------------------------------------------------- schemas

DURATION = {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"}
STRINGS = {"type": "array", "items": {"type": "string"}, "minItems": 1}
ENV_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

COMPOSE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["services"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]*$"},
        "services": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": r"^[a-z0-9][a-z0-9-]*$"},  # valid host names
            "additionalProperties": {"$ref": "#/$defs/service"},
        },
        "volumes": {
            "type": "object",
            "additionalProperties": {"type": ["object", "null"]},
        },
    },
    "patternProperties": {"^x-": {}},
    "additionalProperties": False,
    "$defs": {
        "service": {
            "type": "object",
            "anyOf": [{"required": ["image"]}, {"required": ["build"]}],
            "properties": {
                "image": {"type": "string"},
                "build": {
                    "type": "object",
                    "required": ["context"],
                    "properties": {"context": {"type": "string"}, "dockerfile": {"type": "string"}},
                    "additionalProperties": False,
                },
                "command": STRINGS,
                "entrypoint": STRINGS,
                "environment": ENV_MAP,  # strings only: no YAML 1.1 bool/number surprises
                "ports": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "pattern": rf"^(\d+\.\d+\.\d+\.\d+:)?{HOST_PORT}:\d+$",
                    },
                },
                "volumes": {"type": "array", "items": {"type": "string", "pattern": r"^.+:/.*$"}},
                "depends_on": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["condition"],
                        "properties": {
                            "condition": {
                                "enum": [
                                    "service_started",
                                    "service_healthy",
                                    "service_completed_successfully",
                                ]
                            }
                        },
                        "additionalProperties": False,
                    },
                },
                "healthcheck": {
                    "type": "object",
                    "oneOf": [
                        {"required": ["test"], "not": {"required": ["disable"]}},
                        {"required": ["disable"], "not": {"required": ["test"]}},
                    ],
                    "properties": {
                        "test": {
                            "type": "array",
                            "prefixItems": [{"enum": ["CMD", "CMD-SHELL"]}],
                            "minItems": 2,
                            "items": {"type": "string"},
                        },
                        "interval": DURATION,
                        "timeout": DURATION,
                        "start_period": DURATION,
                        "retries": {"type": "integer", "minimum": 1},
                        "disable": {"const": True},
                    },
                    "additionalProperties": False,
                },
                "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
                "profiles": STRINGS,
                "user": {"type": "string"},
                "deploy": {"type": "object"},
            },
            "additionalProperties": False,
        }
    },
}

METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"const": "fedrec"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
NAMESPACED_METADATA = {**METADATA, "required": ["name", "namespace"]}
QUANTITIES = {
    "type": "object",
    "required": ["cpu", "memory"],
    "properties": {"cpu": {"type": "string"}, "memory": {"type": "string"}},
}
PROBE = {
    "type": "object",
    "oneOf": [{"required": ["httpGet"]}, {"required": ["exec"]}, {"required": ["tcpSocket"]}],
    "properties": {
        "httpGet": {
            "type": "object",
            "required": ["path", "port"],
            "properties": {"path": {"type": "string", "pattern": "^/"}},
        },
        "exec": {"type": "object", "required": ["command"], "properties": {"command": STRINGS}},
    },
}
ENV_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "oneOf": [{"required": ["value"]}, {"required": ["valueFrom"]}],
        "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
    },
}
BASE_CONTAINER: dict[str, Any] = {
    "type": "object",
    "required": ["name", "image", "resources"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string", "pattern": r"^[^:\s]+:[^:\s]+$"},  # always a pinned tag
        "command": STRINGS,
        "args": {"type": "array", "items": {"type": "string"}},
        "env": ENV_LIST,
        "resources": {
            "type": "object",
            "required": ["requests", "limits"],
            "properties": {"requests": QUANTITIES, "limits": QUANTITIES},
        },
    },
}
SERVING_CONTAINER = {
    **BASE_CONTAINER,
    "required": ["name", "image", "ports", "readinessProbe", "livenessProbe", "resources"],
    "properties": {
        **BASE_CONTAINER["properties"],
        "ports": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["containerPort"],
                "properties": {"containerPort": {"type": "integer"}, "name": {"type": "string"}},
            },
        },
        "readinessProbe": PROBE,
        "livenessProbe": PROBE,
    },
}


def _pod_template(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["metadata", "spec"],
        "properties": {
            "metadata": {"type": "object", "required": ["labels"]},
            "spec": {
                "type": "object",
                "required": ["containers", "securityContext"],
                "properties": {
                    "containers": {"type": "array", "minItems": 1, "items": container},
                    "securityContext": {
                        "type": "object",
                        "required": ["runAsNonRoot"],
                        "properties": {
                            "runAsNonRoot": {"const": True},
                            "runAsUser": {"type": "integer", "minimum": 1},
                        },
                    },
                },
            },
        },
    }


def _workload(extra_required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "apps/v1"},
            "metadata": NAMESPACED_METADATA,
            "spec": {
                "type": "object",
                "required": ["replicas", "selector", "template", *extra_required],
                "properties": {
                    "replicas": {"type": "integer", "minimum": 1},
                    "selector": {"type": "object", "required": ["matchLabels"]},
                    "template": _pod_template(SERVING_CONTAINER),
                },
            },
        },
    }


K8S_SCHEMAS: dict[str, dict[str, Any]] = {
    "Namespace": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {"apiVersion": {"const": "v1"}, "metadata": METADATA},
    },
    "ConfigMap": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "data"],
        "properties": {
            "apiVersion": {"const": "v1"},
            "metadata": NAMESPACED_METADATA,
            "data": ENV_MAP,
        },
    },
    "Secret": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "type", "stringData"],
        "properties": {
            "apiVersion": {"const": "v1"},
            "metadata": NAMESPACED_METADATA,
            "type": {"const": "Opaque"},
            "stringData": ENV_MAP,
        },
        "not": {"required": ["data"]},  # placeholders stay readable, not base64
    },
    "Service": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "v1"},
            "metadata": NAMESPACED_METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "ports"],
                "properties": {
                    "ports": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "port", "targetPort"],
                            "properties": {"port": {"type": "integer"}},
                        },
                    }
                },
            },
        },
    },
    "Deployment": _workload([]),
    "StatefulSet": _workload(["serviceName"]),
    "Job": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "batch/v1"},
            "metadata": NAMESPACED_METADATA,
            "spec": {
                "type": "object",
                "required": ["template"],
                "properties": {"template": _pod_template(BASE_CONTAINER)},
            },
        },
    },
    "Kustomization": {
        "type": "object",
        "required": ["apiVersion", "kind", "resources"],
        "properties": {
            "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
            "resources": STRINGS,
        },
    },
}

# ---------------------------------------------------------------- helpers


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every Deployment, StatefulSet and Job."""
    for _, doc in _k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, pod in _pod_specs():
        for c in pod["containers"]:
            yield name, c


def command_module(command: list[str]) -> str | None:
    """The service module a command runs (``python -m X`` or ``fedrec <sub>``), else None."""
    if command[:2] == ["python", "-m"] and len(command) >= 3:
        return command[2]
    if command[:1] == ["fedrec"] and len(command) >= 2:
        return CLI_MODULE.get(command[1])
    return None


def command_is_real(command: list[str]) -> bool:
    """Whether a container command names something the image really has."""
    if command[:2] == ["python", "-m"]:
        try:
            return importlib.util.find_spec(f"{command[2]}.__main__") is not None
        except ModuleNotFoundError:
            return False
    if command[:1] == ["fedrec"]:
        names = {
            c.name or c.callback.__name__ for c in fedrec_cli.registered_commands if c.callback
        }
        return len(command) > 1 and command[1] in names
    if command[:1] == ["python"] and len(command) > 1 and command[1].startswith("/app/"):
        return command[1].removeprefix("/app/") in _dockerfile_app_files()
    return False


def _dockerfile_app_files() -> set[str]:
    """File names the Dockerfile copies from deploy/ into /app/ (and that exist)."""
    out = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY") and line.rstrip().endswith("/app/"):
            for src in line.split()[1:-1]:
                if src.startswith("deploy/"):
                    assert (ROOT / src).is_file(), src
                    out.add(Path(src).name)
    return out


def _fake_compose_env(value: str) -> str:
    """A compose value with ``${VAR:-default}`` replaced by its default and any other
    ``${VAR...}`` by a realistic non-placeholder (what compose gives without a .env)."""

    def sub(m: re.Match[str]) -> str:
        default = COMPOSE_DEFAULT.match(m.group(0))
        if default is not None and default.group(1):
            return default.group(1)
        return f"test-{m.group(1).lower().replace('_', '-')}"

    return COMPOSE_VAR.sub(sub, value)


def _compose_service_port(name: str, svc: dict[str, Any]) -> int | None:
    """The port the service's app listens on inside its container."""
    module = command_module(svc.get("command", []))
    if module is None:
        return None
    env = svc.get("environment", {})
    prefix = MODULE_PREFIX[module]
    cls = SETTINGS[prefix]
    key = "http_port" if prefix == "FEDREC_WORKER_" else "port"
    raw = env.get(f"{prefix}{key.upper()}")
    return int(raw) if raw is not None else cls.model_fields[key].default


def _routes(module: str, tmp_path: Path) -> set[str]:
    """GET routes of the app a service module serves (built, not started)."""
    if module == "services.aggregator":
        app = create_aggregator_app(AggregatorSettings(environment="development"))
    elif module == "services.recommend_api":
        app = create_recommend_app(RecommendSettings(aggregator_url=None, workers=1))
    else:
        app = create_worker_app(WorkerSettings(), WorkerStore(tmp_path / "routes.db"))
    # the OpenAPI document lists every route (included routers too) with its methods
    return {path for path, ops in app.openapi()["paths"].items() if "get" in ops}


def _url_path_port(url: str) -> tuple[str, int | None, str]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port, parts.path


def _healthcheck_url(test: list[str]) -> str | None:
    for arg in test:
        if arg.startswith("http://"):
            return arg
    return None


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
    pod = next(p for _, p in _pod_specs() if container in p["containers"])
    enrol_secret = "a-real-secret-fedrec_agg_enrolment_secret"
    for vol in pod.get("volumes", []):
        if "secret" not in vol or vol["name"] not in mounts:
            continue
        data = _k8s_one("Secret", vol["secret"]["secretName"])["stringData"]
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


def _configmap_env(pod_container: dict[str, Any]) -> dict[str, str]:
    """Env of a container: its ConfigMaps (envFrom) then literal env values."""
    env: dict[str, str] = {}
    for ref in pod_container.get("envFrom", []):
        env.update(_k8s_one("ConfigMap", ref["configMapRef"]["name"])["data"])
    for item in pod_container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            secret = _k8s_one("Secret", ref["name"])["stringData"][ref["key"]]
            env[item["name"]] = secret
    return env


# ---------------------------------------------------------------- files parse and match schemas


def test_compose_matches_the_schema_subset():
    jsonschema.validate(_compose(), COMPOSE_SCHEMA)


def test_compose_schema_rejects_what_it_should():
    """The schema is not vacuous: typos and list-style depends_on are refused."""
    bad_cases = [
        {"services": {"a": {"image": "x", "helthcheck": {}}}},
        {"services": {"a": {"image": "x", "depends_on": ["b"]}}},
        {"services": {"a": {"image": "x", "environment": {"FEDREC_AGG_PORT": 8700}}}},
        {"services": {"a": {"command": ["python"]}}},
    ]
    for bad in bad_cases:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, COMPOSE_SCHEMA)


@pytest.mark.parametrize(
    ("file", "doc"),
    _k8s_docs(),
    ids=[f"{f}:{d.get('kind')}/{d.get('metadata', {}).get('name', '')}" for f, d in _k8s_docs()],
)
def test_k8s_manifest_matches_the_schema_of_its_kind(file, doc):
    assert doc.get("kind") in K8S_SCHEMAS, f"{file}: no schema for kind {doc.get('kind')}"
    jsonschema.validate(doc, K8S_SCHEMAS[doc["kind"]])


def test_k8s_has_every_piece_of_the_deployment():
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in _k8s_docs() if "metadata" in d}
    for needed in [
        ("Namespace", "fedrec"),
        ("Secret", "fedrec-secrets"),
        ("StatefulSet", "postgres"),
        ("Service", "postgres"),
        ("Deployment", "redis"),
        ("Service", "redis"),
        ("Deployment", "aggregator"),
        ("Service", "aggregator"),
        ("StatefulSet", "worker"),
        ("Service", "worker"),
        ("Deployment", "recommend-api"),
        ("Service", "recommend-api"),
        ("Job", "start-run"),
    ]:
        assert needed in kinds


def test_kustomization_lists_every_manifest_but_the_job():
    (kust,) = _k8s_objects("Kustomization")
    listed = set(kust["resources"])
    files = {p.name for p in _k8s_files()} - {"kustomization.yaml"}
    assert listed == files - {"start-run-job.yaml"}


# ---------------------------------------------------------------- settings and commands


def _compose_fedrec_vars() -> list[tuple[str, str]]:
    return [
        (name, var)
        for name, svc in _compose()["services"].items()
        for var in svc.get("environment", {})
        if var.startswith("FEDREC_")
    ]


def _k8s_fedrec_vars() -> list[tuple[str, str]]:
    out = [
        (cm["metadata"]["name"], var)
        for cm in _k8s_objects("ConfigMap")
        for var in cm["data"]
        if var.startswith("FEDREC_")
    ]
    out += [
        (sec["metadata"]["name"], var)
        for sec in _k8s_objects("Secret")
        for var in sec["stringData"]
        if var.startswith("FEDREC_")
    ]
    out += [
        (workload, e["name"])
        for workload, c in _containers()
        for e in c.get("env", [])
        if e["name"].startswith("FEDREC_")
    ]
    return out


@pytest.mark.parametrize(("where", "var"), _compose_fedrec_vars() + _k8s_fedrec_vars())
def test_every_fedrec_variable_is_a_settings_field(where, var):
    prefix = next((p for p in SETTINGS if var.startswith(p)), None)
    assert prefix is not None, f"{where}: {var} has no known settings prefix"
    field = var.removeprefix(prefix).lower()
    assert field in SETTINGS[prefix].model_fields, f"{where}: {var} is not a field of {prefix}*"


def test_fedrec_variables_are_found_at_all():
    """Guard for the parametrized check above: it really sees the variables."""
    assert len(_compose_fedrec_vars()) > 20 and len(_k8s_fedrec_vars()) > 15


def test_every_command_is_a_real_entry_point():
    commands = [svc["command"] for svc in _compose()["services"].values() if "command" in svc]
    commands = [c for c in commands if c[0] not in ("redis-server", "postgres")]
    commands += [c["command"] for _, c in _containers() if c["image"] == IMAGE]
    assert len(commands) >= 8
    for command in commands:
        assert command_is_real(command), command


def test_command_check_can_fail():
    assert command_is_real(["fedrec", "worker"]) and command_is_real(["fedrec", "aggregator"])
    assert not command_is_real(["fedrec", "no-such-command"])
    assert not command_is_real(["python", "-m", "services.no_such_service"])
    assert not command_is_real(["python", "/app/missing.py"])


def _compose_services_running(module: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (n, s)
        for n, s in _compose()["services"].items()
        if command_module(s.get("command", [])) == module
    ]


def _init_secrets() -> Any:
    spec = importlib.util.spec_from_file_location("init_secrets", DEPLOY / "init_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _secret_files_in(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the compose secrets volume in ``tmp_path``, filled by the secrets service's
    own code (deploy/init_secrets.py) for the compose file's shard count."""
    shards = int(_compose()["services"]["secrets"]["environment"]["WORKER_SHARDS"])
    if not (tmp_path / "operator_token").exists():
        _init_secrets().ensure_secrets(tmp_path, {}, shards)
    return {
        k: str(tmp_path / v.removeprefix(SECRETS_MOUNT)) if v.startswith(SECRETS_MOUNT) else v
        for k, v in env.items()
    }


@pytest.mark.parametrize("module", sorted(MODULE_PREFIX))
def test_compose_environment_validates_into_the_settings(module, monkeypatch, tmp_path):
    """Each service's whole environment (secret files in place) builds its settings class."""
    services = _compose_services_running(module)
    assert services
    for name, svc in services:
        env = {k: _fake_compose_env(v) for k, v in svc.get("environment", {}).items()}
        env = _secret_files_in(tmp_path, env)
        prefix = MODULE_PREFIX[module]
        assert all(not k.startswith("FEDREC_") or k.startswith(prefix) for k in env), name
        for k in list(os.environ):
            if k.startswith("FEDREC_"):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        SETTINGS[prefix]()  # raises on a bad value (type, range, placeholder secret, shard)


@pytest.mark.parametrize("module", sorted(MODULE_PREFIX))
def test_k8s_environment_validates_into_the_settings(module, monkeypatch, tmp_path):
    """The same for k8s containers (ConfigMap + Secret with a real value in place)."""
    containers = [
        (w, c) for w, c in _containers() if command_module(c.get("command", [])) == module
    ]
    assert containers
    monkeypatch.setattr("socket.gethostname", lambda: "worker-1")  # a StatefulSet pod name
    for workload, c in containers:
        env = _configmap_env(c)
        env = {
            k: (f"a-real-secret-{k.lower()}" if v in PLACEHOLDERS else v) for k, v in env.items()
        }
        env = {k: _expand_k8s(v, env) for k, v in env.items()}
        env = _k8s_secret_files_in(tmp_path, c, env)
        prefix = MODULE_PREFIX[module]
        assert all(not k.startswith("FEDREC_") or k.startswith(prefix) for k in env), workload
        for k in list(os.environ):
            if k.startswith("FEDREC_"):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        SETTINGS[prefix]()


def test_the_committed_operator_token_placeholder_is_refused_in_production():
    """A Secret applied without replacing the token cannot start the aggregator."""
    token = _k8s_one("Secret", "fedrec-secrets")["stringData"]["FEDREC_AGG_OPERATOR_TOKEN"]
    env = _k8s_one("ConfigMap", "aggregator-config")["data"]
    assert env["FEDREC_AGG_ENVIRONMENT"] == "production"
    with pytest.raises(ValueError, match="OPERATOR_TOKEN"):
        AggregatorSettings(environment="production", operator_token=token)


# ---------------------------------------------------------------- ports, URLs, probes


def test_compose_ports_and_healthchecks_match_the_settings_and_routes(tmp_path):
    routes = {m: _routes(m, tmp_path) for m in MODULE_PREFIX}
    checked = 0
    for name, svc in _compose()["services"].items():
        module = command_module(svc.get("command", []))
        if module is None:
            continue
        port = _compose_service_port(name, svc)
        for mapping in svc.get("ports", []):
            assert int(mapping.rsplit(":", 1)[1]) == port, f"{name}: {mapping} vs port {port}"
        url = _healthcheck_url(svc["healthcheck"]["test"])
        assert url is not None, f"{name}: healthcheck names no URL"
        host, url_port, path = _url_path_port(url)
        assert (host, url_port) == ("127.0.0.1", port), f"{name}: {url}"
        # recommend-api's /healthz is readiness (503 before the first model): liveness there
        want = "/livez" if module == "services.recommend_api" else "/healthz"
        assert path == want and path in routes[module], f"{name}: {path}"
        checked += 1
    assert checked == 4  # aggregator, two workers, recommend-api


def test_compose_healthchecks_use_the_image_probe():
    for name, svc in _compose()["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        if test and svc.get("image") == IMAGE:
            assert test[:3] == ["CMD", "bash", "/app/healthcheck.sh"], name
            assert "healthcheck.sh" in _dockerfile_app_files()


def test_recommend_api_is_live_but_not_ready_before_the_first_model():
    """The compose healthcheck route answers 200 while no run has published a model, so the
    container is healthy; the readiness route (k8s) still says 503 no_model."""
    from fastapi.testclient import TestClient

    with TestClient(create_recommend_app(RecommendSettings(aggregator_url=None, workers=1))) as c:
        live, ready = c.get("/livez"), c.get("/healthz")
    assert live.status_code == 200 and live.json()["model_version"] is None
    assert ready.status_code == 503 and ready.json()["status"] == "no_model"


def test_compose_service_urls_point_at_real_services_and_ports():
    services = _compose()["services"]
    ports = {n: _compose_service_port(n, s) for n, s in services.items()}
    ports.update({"postgres": 5432, "redis": 6379})
    urls = [
        (name, var, v)
        for name, svc in services.items()
        for var, value in svc.get("environment", {}).items()
        for v in _fake_compose_env(value).split(",")
        if re.match(r"^(http|redis|postgresql\+psycopg)://", v)
    ]
    assert len(urls) > 10
    for name, var, url in urls:
        host, port, _ = _url_path_port(url)
        assert host in services, f"{name}.{var}: {host} is not a compose service"
        assert port == ports[host], f"{name}.{var}: port {port}, {host} listens on {ports[host]}"


def test_k8s_ports_probes_and_service_urls_agree(tmp_path):
    routes = {m: _routes(m, tmp_path) for m in MODULE_PREFIX}
    services = {s["metadata"]["name"]: s for s in _k8s_objects("Service")}
    listening: dict[str, int] = {}
    for workload, c in _containers():
        module = command_module(c.get("command", []))
        if module is None:
            continue
        env = _configmap_env(c)
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
            for _, d in _k8s_docs()
            if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload
        ]
        assert selector.items() <= pod_labels.items(), workload
        assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(port, "http")]
        listening[workload] = port
    listening.update({"postgres": 5432, "redis": 6379})
    values = [v for _, c in _containers() for v in _configmap_env(c).values()]
    urls = [u for v in values for u in v.split(",") if re.match(r"^(http|redis|postgresql)", u)]
    assert len(urls) > 8
    for url in urls:
        host, url_port, _ = _url_path_port(url)
        name = host.split(".")[-1]  # worker-0.worker -> the headless Service "worker"
        assert name in services, url
        assert url_port == listening[name], url


# (dependent, dependency) pairs that need not wait for health: the dependent waits by itself
# (a worker retries its registration until the aggregator answers; the demo waits until
# recommend-api serves the final model), so they start side by side.
PATIENT = {("worker-0", "aggregator"), ("worker-1", "aggregator"), ("demo", "recommend-api")}


def test_depends_on_waits_for_health_where_there_is_a_healthcheck():
    services = _compose()["services"]
    edges = 0
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if "test" in services[dep].get("healthcheck", {}) and (name, dep) not in PATIENT:
                assert cond["condition"] == "service_healthy", f"{name} -> {dep}"
            edges += 1
    assert edges >= 8
    for name in ("aggregator", "worker-0", "worker-1", "recommend-api", "postgres", "redis"):
        assert "healthcheck" in services[name], name
    assert set(services["aggregator"]["depends_on"]) == {"secrets", "postgres", "redis"}
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


def test_compose_workers_cover_every_shard_with_their_own_store():
    services = _compose()["services"]
    workers = dict(_compose_services_running("services.client_sim"))
    shards = {int(w["environment"]["FEDREC_WORKER_SHARDS"]) for w in workers.values()}
    assert len(shards) == 1
    (n,) = shards
    indices = sorted(int(w["environment"]["FEDREC_WORKER_SHARD"]) for w in workers.values())
    assert indices == list(range(n))
    volumes = [v for w in workers.values() for v in w["volumes"] if not v.startswith("secrets:")]
    assert len(set(volumes)) == len(volumes) == n  # one store volume per shard
    demo = services["demo"]["environment"]
    wait_for = demo["WAIT_FOR"].split(",")
    assert sorted(_url_path_port(u)[0] for u in wait_for) == sorted(workers)
    # the demo asks user u's recommendations from worker u % shards: in shard order
    urls = demo["WORKER_URLS"].split(",")
    owner = {int(w["environment"]["FEDREC_WORKER_SHARD"]): name for name, w in workers.items()}
    assert [_url_path_port(u)[0] for u in urls] == [owner[i] for i in range(n)]


def test_k8s_worker_ordinals_are_the_shards():
    sts = _k8s_one("StatefulSet", "worker")
    env = _k8s_one("ConfigMap", "worker-config")["data"]
    replicas = sts["spec"]["replicas"]
    assert int(env["FEDREC_WORKER_SHARDS"]) == replicas
    assert env["FEDREC_WORKER_SHARD_FROM_HOSTNAME"] == "true"
    assert "FEDREC_WORKER_SHARD" not in env
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    job = _k8s_one("Job", "start-run")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    wait_for = next(e["value"] for e in c["env"] if e["name"] == "WAIT_FOR").split(",")
    hosts = sorted(_url_path_port(u)[0] for u in wait_for)
    assert hosts == [f"worker-{i}.{sts['spec']['serviceName']}" for i in range(replicas)]


# ---------------------------------------------------------------- root and secrets


def _dockerfile_final_stage() -> list[str]:
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    return lines[last_from:]


def test_dockerfile_builds_the_project_on_cpu_torch_and_runs_unprivileged():
    text = DOCKERFILE.read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert re.search(r"pip install --index-url \S+ torch==2\.13\.0", text)
    assert re.search(r"^RUN pip install --no-deps \. ", text, re.MULTILINE)
    assert "pip install -r /tmp/requirements.txt" in text  # the dependencies, then the project
    final = _dockerfile_final_stage()
    users = [ln.split()[1] for ln in final if ln.startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    joined = " ".join(final).replace("\\ ", "")  # continuation lines into one instruction
    (health,) = re.findall(r"HEALTHCHECK .*?CMD (\[[^\]]*\])", joined)
    assert yaml.safe_load(health)[0] == "bash", health  # slim has no curl
    assert "/app/healthcheck.sh" in health and "healthcheck.sh" in _dockerfile_app_files()
    assert "HEALTHCHECK_URL=http://127.0.0.1:8700/healthz" in joined
    assert not re.search(r"\bcurl\b|\bwget\b", "\n".join(final))


def test_dockerignore_keeps_secrets_and_local_state_out():
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # allow-list: .env, .venv, .git, stores never reach the context
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = set()
    for ln in DOCKERFILE.read_text().splitlines():
        if ln.startswith("COPY") and "--from" not in ln:
            copied |= {s.rstrip("/") for s in ln.split()[1:-1] if not s.startswith("--")}
    assert copied and copied <= allowed


def test_no_container_runs_as_root():
    for name, svc in _compose()["services"].items():
        assert svc.get("user", "") not in ("root", "0"), name
    for name, pod in _pod_specs():
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx.get("runAsUser", 1) != 0, name
        for c in pod["containers"]:
            assert c.get("securityContext", {}).get("allowPrivilegeEscalation") is False, name
            if c["image"] == IMAGE:
                assert ctx["runAsUser"] == 10001  # the Dockerfile's user


def _is_secret_free(value: str) -> bool:
    """A value that carries no committed secret: a placeholder, a reference, or a URL whose
    user has no password in it."""
    stripped = COMPOSE_VAR.sub("", K8S_VAR.sub("", value))
    if value in PLACEHOLDERS:
        return True
    if re.search(r"://[^/@]*:[^/@]+@", stripped):
        return False  # a literal password in a URL
    if re.match(r"^[a-z+]+://[^/@:]+@", value):
        return True  # a user without a password
    return stripped != value


def test_no_secret_literal_is_committed():
    compose = _compose()
    checked = 0
    for name, svc in compose["services"].items():
        for var, value in svc.get("environment", {}).items():
            if var.endswith(("_FILE", "_DIR")):
                # a secret read from (or a folder of) the generated volume, never a value
                assert f"{value.rstrip('/')}/".startswith(SECRETS_MOUNT), f"{name}.{var}"
                checked += 1
            elif SECRET_NAME.search(var) or "@" in value:
                assert _is_secret_free(value), f"{name}.{var}"
                checked += 1
    for secret in _k8s_objects("Secret"):
        for var, value in secret["stringData"].items():
            assert value in PLACEHOLDERS, f"{secret['metadata']['name']}.{var}"
            checked += 1
    for workload, c in _containers():
        for e in c.get("env", []):
            if SECRET_NAME.search(e["name"]) or "@" in e.get("value", ""):
                assert "valueFrom" in e or _is_secret_free(e["value"]), f"{workload}.{e['name']}"
                checked += 1
    for cm in _k8s_objects("ConfigMap"):
        for var, value in cm["data"].items():
            if var.endswith("_FILE"):
                assert value.startswith("/run/"), var  # a mounted Secret's file
                continue
            assert not SECRET_NAME.search(var), f"secret {var} belongs in the Secret"
            assert "@" not in value, f"{var}: credentials in a ConfigMap"
    # the example sets nothing: copying it must not put a placeholder in force
    example = (DEPLOY / "compose.env.example").read_text()
    for line in example.splitlines():
        if line and not line.startswith("#"):
            assert line.split("=", 1)[1] == "", line
            checked += 1
    for var in ("POSTGRES_PASSWORD", "FEDREC_AGG_OPERATOR_TOKEN", "FEDREC_AGG_READER_TOKEN"):
        assert f"\n# {var}=" in example or f"\n{var}=\n" in example, var
    assert checked >= 8
    assert not re.search(r"(TOKEN|PASSWORD)\s*=\s*\S", DOCKERFILE.read_text())


def test_secret_check_can_fail():
    assert _is_secret_free("${FEDREC_AGG_OPERATOR_TOKEN:?set it}")
    assert _is_secret_free("postgresql+psycopg://fedrec:$(POSTGRES_PASSWORD)@postgres:5432/x")
    assert _is_secret_free("postgresql+psycopg://fedrec@postgres:5432/fedrec")
    assert _is_secret_free("${POSTGRES_PASSWORD:-}")
    assert not _is_secret_free("hunter2")
    assert not _is_secret_free("postgresql+psycopg://fedrec:hunter2@postgres:5432/${DB}")
    assert not _is_secret_free("postgresql://fedrec:hunter2@postgres:5432/fedrec")
