"""The Kubernetes deployment as a cluster would receive it, checked statically (no cluster runs
here): ``kubectl kustomize deploy/k8s`` renders the listed files and nothing else; every object
of the render and of the files applied apart passes kubernetes-validate --strict (the API's own
OpenAPI schemas, unknown keys refused) for the oldest and the newest Kubernetes we name; the
KubeRay RayJob, a custom resource kubernetes-validate has no schema for, matches the schema of
its ray.io/v1 fields in tests/deploy/schemas.py while each pod template inside it passes
kubernetes-validate --strict as a v1 PodTemplate; and what ties the objects together holds
(the autoscaler's target, the disruption budgets' selectors, the replicas' dependencies, the
RayJob's command line, shards, image and storage).

Not checked (it needs a cluster): that the API server admits the objects (admission webhooks,
quotas, the storage class), that KubeRay's operator accepts the RayJob, that the pods start."""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from services.cli import app as fedrec_cli
from tests.deploy.manifests import (
    APPLIED_APART,
    COMPOSE_DEFAULT,
    DOCKERFILE,
    K8S,
    ROOT,
    compose,
    configmap_env,
    dockerfile_app_files,
    k8s_docs,
    k8s_files,
    k8s_objects,
    k8s_one,
    kubectl_kustomize,
    kustomize_resources,
)
from tests.deploy.schemas import K8S_SCHEMAS

# The oldest Kubernetes the manifests are for (autoscaling/v2 and policy/v1 are GA well before)
# and the newest whose schemas kubernetes-validate holds.
KUBERNETES = ["1.29.0", kubernetes_validate.latest_version()]
RAY_IMAGE = "fedrecgel-ray:0.1.0"
RAY_EXTRA = "ray-cluster"


def _name(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _rendered() -> list[dict[str, Any]]:
    return kustomize_resources()


def _apart() -> list[dict[str, Any]]:
    """The core-API objects of the files applied apart (the RayJob is a custom resource)."""
    return [
        d
        for name in sorted(APPLIED_APART)
        for d in yaml.safe_load_all((K8S / name).read_text())
        if d is not None and d["kind"] != "RayJob"
    ]


def _rayjob() -> dict[str, Any]:
    return k8s_one("RayJob", "fedrec-train")


def _ray_pod_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every pod template inside the RayJob, by where it is."""
    cluster = job["spec"]["rayClusterSpec"]
    out = {
        "submitter": job["spec"]["submitterPodTemplate"],
        "head": cluster["headGroupSpec"]["template"],
    }
    for group in cluster["workerGroupSpecs"]:
        out[f"worker group {group['groupName']}"] = group["template"]
    return out


def _validate_strict(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


# ---------------------------------------------------------------- rendering


def test_kustomize_renders_every_listed_file_and_nothing_else() -> None:
    """kustomization.yaml lists every manifest but those applied apart, and kubectl's render
    (where kubectl is on PATH) is exactly their objects: the render the other tests read."""
    (kust,) = k8s_objects("Kustomization")
    files = {p.name for p in k8s_files()} - {"kustomization.yaml"}
    assert files >= APPLIED_APART
    assert set(kust["resources"]) == files - APPLIED_APART
    ours = _rendered()
    assert len({_name(d) for d in ours}) == len(ours) >= 20
    kubectl = kubectl_kustomize()
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: the render is read from the listed files only")
    key = sorted
    assert key(map(_name, kubectl)) == key(map(_name, ours))
    by_name = {_name(d): d for d in ours}
    for obj in kubectl:
        assert obj == by_name[_name(obj)], _name(obj)


# ---------------------------------------------------------------- kubernetes-validate --strict


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_core_object_passes_kubernetes_validate_strict(version: str) -> None:
    objects = _rendered() + _apart()
    kinds = {d["kind"] for d in objects}
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "PersistentVolumeClaim"} <= kinds
    for obj in objects:
        try:
            _validate_strict(obj, version)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{_name(obj)} (Kubernetes {version}): {err.message} at {err.path}")


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_pod_template_of_the_rayjob_passes_kubernetes_validate_strict(version: str) -> None:
    for where, template in _ray_pod_templates(_rayjob()).items():
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "fedrec-train", "namespace": "fedrec"},
            "template": template,
        }
        try:
            _validate_strict(wrapped, version)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"RayJob {where}'s pod (Kubernetes {version}): {err.message}")


def test_strict_validation_refuses_what_it_should() -> None:
    """Not vacuous: a misspelt key, a wrong type, a missing required field and a CRD fail."""
    hpa = copy.deepcopy(k8s_one("HorizontalPodAutoscaler", "recommend-api"))
    hpa["spec"]["maxReplica"] = 8
    pdb = copy.deepcopy(k8s_one("PodDisruptionBudget", "aggregator"))
    pdb["spec"]["selector"]["matchLabels"] = "aggregator"
    dep = copy.deepcopy(k8s_one("Deployment", "aggregator"))
    del dep["spec"]["template"]["spec"]["containers"][0]["name"]
    for bad in (hpa, pdb, dep):
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate_strict(bad, KUBERNETES[-1])
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        _validate_strict(_rayjob(), KUBERNETES[-1])  # hence the RayJob's own schema


def test_the_rayjob_schema_refuses_what_it_should() -> None:
    job = _rayjob()
    jsonschema.validate(job, K8S_SCHEMAS["RayJob"])
    bad_cases = []
    for path, value in [
        (("spec", "entrypoint"), None),  # required
        (("spec", "submissionMode"), "K8sJob"),
        (("spec", "shutdownAfterJobFinish"), True),  # a typo
        (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-cpus"), 0),
        (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas"), None),
        (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "replica"), 4),
    ]:
        bad = copy.deepcopy(job)
        node: Any = bad
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        bad_cases.append(bad)
    for bad in bad_cases:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, K8S_SCHEMAS["RayJob"])


# ---------------------------------------------------------------- what ties them together


def _pod_labels(kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = k8s_one(kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_recommendation_api_is_autoscaled_and_kept_available() -> None:
    hpa = k8s_one("HorizontalPodAutoscaler", "recommend-api")
    target = hpa["spec"]["scaleTargetRef"]
    dep = k8s_one(target["kind"], target["name"])
    # a replicas field would be applied over the autoscaler's count at every `kubectl apply`
    assert "replicas" not in dep["spec"]
    scaled = {(h["spec"]["scaleTargetRef"]["kind"], h["spec"]["scaleTargetRef"]["name"])
              for h in k8s_objects("HorizontalPodAutoscaler")}  # fmt: skip
    for d in k8s_objects("Deployment"):
        assert ("replicas" in d["spec"]) != (("Deployment", d["metadata"]["name"]) in scaled)
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # utilization is measured against the request: every container must have one
    for c in dep["spec"]["template"]["spec"]["containers"]:
        assert c["resources"]["requests"]["cpu"]
    pdb = k8s_one("PodDisruptionBudget", "recommend-api")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= _pod_labels(target["kind"], target["name"]).items()
    )
    # a drain can go on: the budget leaves at least one of the fewest pods free to move
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_the_aggregator_runs_three_replicas_over_postgres_and_redis() -> None:
    dep = k8s_one("Deployment", "aggregator")
    replicas = dep["spec"]["replicas"]
    default = COMPOSE_DEFAULT.match(
        compose()["services"]["aggregator-replica"]["deploy"]["replicas"]
    )
    assert default is not None and replicas == int(default.group(1)) == 3  # as under compose
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = configmap_env(c)
    # replicas share one database (not a file of their own) and need Redis: the closing lock,
    # version events, credential changes
    assert env["FEDREC_AGG_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["FEDREC_AGG_REDIS_URL"].startswith("redis://redis:")
    assert "sessionAffinity" not in k8s_one("Service", "aggregator")["spec"]
    pdb = k8s_one("PodDisruptionBudget", "aggregator")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= _pod_labels("Deployment", "aggregator").items()
    )
    assert 1 <= pdb["spec"]["maxUnavailable"] < replicas
    spread = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"].items()
        <= _pod_labels("Deployment", "aggregator").items()
    )


def _entrypoint() -> tuple[list[str], dict[str, Any]]:
    """The RayJob's command line and the options ``fedrec train`` parses from it."""
    argv = shlex.split(_rayjob()["spec"]["entrypoint"])
    assert argv[:2] == ["fedrec", "train"], argv
    train = typer.main.get_command(fedrec_cli).commands["train"]  # type: ignore[attr-defined]
    ctx = train.make_context("train", argv[2:])  # parses (and refuses unknown options)
    return argv, ctx.params


def test_the_rayjob_runs_fedrec_train_on_the_ray_cluster_it_creates() -> None:
    argv, params = _entrypoint()
    assert params["backend"] == "ray" and params["address"] == "auto"
    cluster = _rayjob()["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    # one actor (a CPU) per shard, all on the workers; the head runs the driver only
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert workers["rayStartParams"]["num-cpus"] == "1"
    assert params["shards"] == workers["replicas"] == workers["minReplicas"]
    assert workers["maxReplicas"] == workers["replicas"]
    (wc,) = workers["template"]["spec"]["containers"]
    assert wc["resources"]["requests"]["cpu"] == wc["resources"]["limits"]["cpu"] == "1"
    # the results and the actors' checkpoints on the one ReadWriteMany claim every pod mounts
    pvc = k8s_one("PersistentVolumeClaim", "ray-shared")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for where, template in _ray_pod_templates(_rayjob()).items():
        spec = template["spec"]
        ctx = spec["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001, where
        for c in spec["containers"]:
            assert c["image"] == RAY_IMAGE, where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
        if where == "submitter":
            assert "command" not in spec["containers"][0]  # KubeRay's `ray job submit`
            continue
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in spec["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
        (c,) = spec["containers"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert claims[mounts["/shared"]] == "ray-shared", where
        assert "/dev/shm" in mounts, where  # the object store; the default is 64 MiB
        assert ctx["fsGroup"] == 10001, where  # the claim writable by the image's user
        # the image has no wget for KubeRay's default probes: ours, in the image's bash probe
        for probe in ("readinessProbe", "livenessProbe"):
            command = c[probe]["exec"]["command"]
            assert command[:2] == ["bash", "/app/healthcheck.sh"], where
            assert re.match(r"^http://127\.0\.0\.1:\d+/api/(gcs|local_raylet)_healthz$", command[2])
    assert "healthcheck.sh" in dockerfile_app_files()
    for option in ("out", "checkpoint_dir"):
        assert str(params[option]).startswith("/shared/"), option
    assert "--overwrite" not in argv


def test_the_rayjob_command_line_check_can_fail() -> None:
    train = typer.main.get_command(fedrec_cli).commands["train"]  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="No such option: --shard"):
        train.make_context("train", ["--backend", "ray", "--shard", "4"])


def test_the_ray_image_is_the_project_image_with_the_ray_cluster_extra(tmp_path: Path) -> None:
    """The Dockerfile's EXTRAS build argument adds optional-dependency groups to the image's
    requirements; the RayJob's image is built with EXTRAS=ray-cluster, Ray with its dashboard
    (KubeRay submits through its job API), and without it the image is unchanged."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("ray[default]") for r in extras["optional-dependencies"][RAY_EXTRA])
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG EXTRAS=$", text, re.MULTILINE)
    (script,) = re.findall(r'^RUN python -c "(.*)" > /tmp/requirements.txt', text, re.MULTILINE)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())

    def requirements(value: str) -> list[str]:
        env = {**os.environ, "EXTRAS": value}
        out = subprocess.run(
            [sys.executable, "-c", script],  # the shell keeps \n inside double quotes
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.splitlines()

    plain = requirements("")
    assert plain == extras["dependencies"]
    assert requirements(RAY_EXTRA) == plain + extras["optional-dependencies"][RAY_EXTRA]
    readme = (ROOT / "deploy" / "k8s" / "ray-job.yaml").read_text()
    assert f"--build-arg EXTRAS={RAY_EXTRA} -t {RAY_IMAGE} ." in readme


def test_every_manifest_document_is_checked() -> None:
    """Each document of each file is either in the render or applied apart, and each kind has
    its schema subset (test_deploy_schemas) besides kubernetes-validate."""
    seen = {_name(d) for d in _rendered()} | {_name(d) for d in _apart()} | {_name(_rayjob())}
    for file, doc in k8s_docs():
        if doc["kind"] != "Kustomization":
            assert _name(doc) in seen, file
            assert doc["kind"] in K8S_SCHEMAS, file


def _server_settings(args: list[str]) -> dict[str, str]:
    """``-c name=value`` pairs of a postgres command line."""
    pairs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-c"]
    return dict(p.split("=", 1) for p in pairs)


def test_k8s_postgres_ends_a_killed_replicas_connection_as_compose_does() -> None:
    """The settings that keep a killed aggregator's half-open connection from holding the open
    round's row lock (docker-compose.yml explains them) are the same in both deployments."""
    keep = (
        "idle_in_transaction_session_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
    )
    compose_pg = _server_settings([str(a) for a in compose()["services"]["postgres"]["command"]])
    (pod,) = k8s_one("StatefulSet", "postgres")["spec"]["template"]["spec"]["containers"]
    k8s_pg = _server_settings(pod["args"])
    assert all(name in compose_pg for name in keep), compose_pg
    assert {n: k8s_pg.get(n) for n in keep} == {n: compose_pg[n] for n in keep}
