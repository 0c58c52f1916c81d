"""What the deployment tests read: the compose file, the Kubernetes manifests and the
Dockerfile, loaded as data, and what the code they name really is (settings classes, entry
points, routes)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic_settings import BaseSettings

from services.aggregator.app import create_app as create_aggregator_app
from services.aggregator.settings import Settings as AggregatorSettings
from services.cli import app as fedrec_cli
from services.client_sim.server import create_app as create_worker_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.dashboard.app import create_app as create_dashboard_app
from services.dashboard.settings import DashboardSettings
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
    for cls in (AggregatorSettings, WorkerSettings, RecommendSettings, DashboardSettings)
}
# the service module each settings prefix configures
MODULE_PREFIX = {
    "services.aggregator": "FEDREC_AGG_",
    "services.client_sim": "FEDREC_WORKER_",
    "services.recommend_api": "FEDREC_REC_",
    "services.dashboard": "FEDREC_DASH_",
}
CLI_MODULE = {"aggregator": "services.aggregator", "worker": "services.client_sim"}
CLI_MODULE["recommend"] = "services.recommend_api"
CLI_MODULE["dashboard"] = "services.dashboard"
PLACEHOLDERS = {"REPLACE_ME", "changethis"}
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|SECRET|API_KEY|PRIVATE_KEY)", re.IGNORECASE)
COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")
HOST_PORT = r"(\d+|\$\{\w+:-\d+\})"  # a port, or a variable with a port as its default
COMPOSE_DEFAULT = re.compile(r"^\$\{\w+:-([^}]*)\}$")
SECRETS_MOUNT = "/run/fedrec-secrets/"
K8S_VAR = re.compile(r"\$\((\w+)\)")


def compose() -> dict[str, Any]:
    """docker-compose.yml as data."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def k8s_files() -> list[Path]:
    """The Kubernetes manifest files."""
    return sorted(K8S.glob("*.yaml"))


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) of every document of every manifest."""
    docs = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def k8s_objects(kind: str) -> list[dict[str, Any]]:
    """Every object of one kind."""
    return [d for _, d in k8s_docs() if d.get("kind") == kind]


def k8s_one(kind: str, name: str) -> dict[str, Any]:
    """The one object of a kind and name."""
    (obj,) = [d for d in k8s_objects(kind) if d["metadata"]["name"] == name]
    return obj


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every Deployment, StatefulSet and Job."""
    for _, doc in k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers() -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, container) of every container of every workload."""
    for name, pod in pod_specs():
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
        return command[1].removeprefix("/app/") in dockerfile_app_files()
    return False


def dockerfile_app_files() -> set[str]:
    """File names the Dockerfile copies from deploy/ into /app/ (and that exist)."""
    out = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY") and line.rstrip().endswith("/app/"):
            for src in line.split()[1:-1]:
                if src.startswith("deploy/"):
                    assert (ROOT / src).is_file(), src
                    out.add(Path(src).name)
    return out


def fake_compose_env(value: str) -> str:
    """A compose value with ``${VAR:-default}`` replaced by its default and any other
    ``${VAR...}`` by a realistic non-placeholder (what compose gives without a .env)."""

    def sub(m: re.Match[str]) -> str:
        default = COMPOSE_DEFAULT.match(m.group(0))
        if default is not None and default.group(1):
            return default.group(1)
        return f"test-{m.group(1).lower().replace('_', '-')}"

    return COMPOSE_VAR.sub(sub, value)


BALANCER_DIR = DEPLOY / "balancer"
BALANCER_IMAGE = "fedrecgel-balancer:0.1.0"


def balancer_config() -> dict[str, list[str]]:
    """deploy/balancer/haproxy.cfg as sections: ``"<keyword> <name>"`` -> its lines."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in (BALANCER_DIR / "haproxy.cfg").read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line[0].isspace():
            current = sections.setdefault(line.strip(), [])
        else:
            current.append(line.strip())
    return sections


def balancer_port() -> int:
    """The port the balancer listens on (its frontend's ``bind :PORT``)."""
    (bind,) = [
        line
        for name, lines in balancer_config().items()
        if name.startswith("frontend")
        for line in lines
        if line.startswith("bind ")
    ]
    return int(bind.rsplit(":", 1)[1])


def compose_service_port(name: str, svc: dict[str, Any]) -> int | None:
    """The port the service's app listens on inside its container (the balancer's too)."""
    if svc.get("image") == BALANCER_IMAGE:
        return balancer_port()
    module = command_module(svc.get("command", []))
    if module is None:
        return None
    env = svc.get("environment", {})
    prefix = MODULE_PREFIX[module]
    cls = SETTINGS[prefix]
    key = "http_port" if prefix == "FEDREC_WORKER_" else "port"
    raw = env.get(f"{prefix}{key.upper()}")
    return int(raw) if raw is not None else cls.model_fields[key].default


def get_routes(module: str, tmp_path: Path) -> set[str]:
    """GET routes of the app a service module serves (built, not started)."""
    if module == "services.aggregator":
        app = create_aggregator_app(AggregatorSettings(environment="development"))
    elif module == "services.recommend_api":
        app = create_recommend_app(RecommendSettings(aggregator_url=None, workers=1))
    elif module == "services.dashboard":
        app = create_dashboard_app(DashboardSettings())
    else:
        app = create_worker_app(WorkerSettings(), WorkerStore(tmp_path / "routes.db"))
    # the OpenAPI document lists every route (included routers too) with its methods
    return {path for path, ops in app.openapi()["paths"].items() if "get" in ops}


def url_path_port(url: str) -> tuple[str, int | None, str]:
    """(host, port, path) of a URL."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port, parts.path


def configmap_env(pod_container: dict[str, Any]) -> dict[str, str]:
    """Env of a container: its ConfigMaps (envFrom) then literal env values."""
    env: dict[str, str] = {}
    for ref in pod_container.get("envFrom", []):
        env.update(k8s_one("ConfigMap", ref["configMapRef"]["name"])["data"])
    for item in pod_container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            secret = k8s_one("Secret", ref["name"])["stringData"][ref["key"]]
            env[item["name"]] = secret
    return env


def compose_services_running(module: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, service) of the compose services that run a service module."""
    return [
        (n, s)
        for n, s in compose()["services"].items()
        if command_module(s.get("command", [])) == module
    ]


# Applied on their own, not through kustomization.yaml: the run-starting Job, and the RayJob
# (a KubeRay custom resource: `kubectl apply -k` must work on a cluster without KubeRay).
APPLIED_APART = {"start-run-job.yaml", "ray-job.yaml"}


def kustomize_resources() -> list[dict[str, Any]]:
    """What ``kubectl kustomize deploy/k8s`` renders, by the semantics this kustomization.yaml
    uses (a list of resource files, no transformer): the documents of each listed file."""
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kust) == {"apiVersion", "kind", "resources"}, "a transformer: render with kubectl"
    return [
        doc
        for name in kust["resources"]
        for doc in yaml.safe_load_all((K8S / name).read_text())
        if doc is not None
    ]


def kubectl_kustomize() -> list[dict[str, Any]] | None:
    """``kubectl kustomize deploy/k8s``'s documents (None without kubectl on PATH)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def deploy_script(name: str) -> ModuleType:
    """``deploy/<name>.py`` (a script the image runs, not an importable module), loaded."""
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
