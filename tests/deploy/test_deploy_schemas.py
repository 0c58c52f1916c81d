"""docker-compose.yml and every Kubernetes manifest parse and match the schema of what they
are; the schemas are not vacuous; every piece of the deployment is there."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.deploy.manifests import APPLIED_APART, compose, k8s_docs, k8s_files, k8s_objects
from tests.deploy.schemas import COMPOSE_SCHEMA, K8S_SCHEMAS


def test_compose_matches_the_schema_subset() -> None:
    jsonschema.validate(compose(), COMPOSE_SCHEMA)


def test_compose_schema_rejects_what_it_should() -> None:
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
    k8s_docs(),
    ids=[f"{f}:{d.get('kind')}/{d.get('metadata', {}).get('name', '')}" for f, d in k8s_docs()],
)
def test_k8s_manifest_matches_the_schema_of_its_kind(file: str, doc: dict[str, Any]) -> None:
    assert doc.get("kind") in K8S_SCHEMAS, f"{file}: no schema for kind {doc.get('kind')}"
    jsonschema.validate(doc, K8S_SCHEMAS[doc["kind"]])


def test_k8s_has_every_piece_of_the_deployment() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_docs() if "metadata" in d}
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
        ("Deployment", "dashboard"),
        ("Service", "dashboard"),
        ("Job", "start-run"),
        ("HorizontalPodAutoscaler", "recommend-api"),
        ("PodDisruptionBudget", "recommend-api"),
        ("PodDisruptionBudget", "aggregator"),
        ("RayJob", "fedrec-train"),
        ("PersistentVolumeClaim", "ray-shared"),
    ]:
        assert needed in kinds


def test_kustomization_lists_every_manifest_but_those_applied_apart() -> None:
    (kust,) = k8s_objects("Kustomization")
    listed = set(kust["resources"])
    files = {p.name for p in k8s_files()} - {"kustomization.yaml"}
    assert listed == files - APPLIED_APART == files - {"start-run-job.yaml", "ray-job.yaml"}
