"""The image builds the project on CPU torch and runs unprivileged; no container runs as root;
no secret is committed and the build context keeps secrets and local state out."""

from __future__ import annotations

import re

import yaml

from tests.deploy.manifests import (
    COMPOSE_VAR,
    DEPLOY,
    DOCKERFILE,
    IMAGE,
    K8S_VAR,
    PLACEHOLDERS,
    ROOT,
    SECRET_NAME,
    SECRETS_MOUNT,
    compose,
    containers,
    dockerfile_app_files,
    k8s_objects,
    pod_specs,
)


def _dockerfile_final_stage() -> list[str]:
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    return lines[last_from:]


def test_dockerfile_builds_the_project_on_cpu_torch_and_runs_unprivileged() -> None:
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
    assert "/app/healthcheck.sh" in health and "healthcheck.sh" in dockerfile_app_files()
    assert "HEALTHCHECK_URL=http://127.0.0.1:8700/healthz" in joined
    assert not re.search(r"\bcurl\b|\bwget\b", "\n".join(final))


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
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


def test_no_container_runs_as_root() -> None:
    for name, svc in compose()["services"].items():
        assert svc.get("user", "") not in ("root", "0"), name
    for name, pod in pod_specs():
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


def test_no_secret_literal_is_committed() -> None:  # noqa: C901  # one pass over every place a secret could sit
    data = compose()
    checked = 0
    for name, svc in data["services"].items():
        for var, value in svc.get("environment", {}).items():
            if var.endswith(("_FILE", "_DIR")):
                # a secret read from (or a folder of) the generated volume, never a value
                assert f"{value.rstrip('/')}/".startswith(SECRETS_MOUNT), f"{name}.{var}"
                checked += 1
            elif SECRET_NAME.search(var) or "@" in value:
                assert _is_secret_free(value), f"{name}.{var}"
                checked += 1
    for secret in k8s_objects("Secret"):
        for var, value in secret["stringData"].items():
            assert value in PLACEHOLDERS, f"{secret['metadata']['name']}.{var}"
            checked += 1
    for workload, c in containers():
        for e in c.get("env", []):
            if SECRET_NAME.search(e["name"]) or "@" in e.get("value", ""):
                assert "valueFrom" in e or _is_secret_free(e["value"]), f"{workload}.{e['name']}"
                checked += 1
    for cm in k8s_objects("ConfigMap"):
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


def test_secret_check_can_fail() -> None:
    assert _is_secret_free("${FEDREC_AGG_OPERATOR_TOKEN:?set it}")
    assert _is_secret_free("postgresql+psycopg://fedrec:$(POSTGRES_PASSWORD)@postgres:5432/x")
    assert _is_secret_free("postgresql+psycopg://fedrec@postgres:5432/fedrec")
    assert _is_secret_free("${POSTGRES_PASSWORD:-}")
    assert not _is_secret_free("hunter2")
    assert not _is_secret_free("postgresql+psycopg://fedrec:hunter2@postgres:5432/${DB}")
    assert not _is_secret_free("postgresql://fedrec:hunter2@postgres:5432/fedrec")
