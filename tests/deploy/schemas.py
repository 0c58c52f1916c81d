"""JSON schemas of the subset of docker-compose and of the Kubernetes kinds the deployment
uses: what each file must hold, so that a typo is an error rather than a silently ignored key."""

from __future__ import annotations

from typing import Any

from tests.deploy.manifests import HOST_PORT

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
INTEGER = {"type": "integer"}


def _objects(*required: str, **properties: Any) -> dict[str, Any]:
    """A non-empty list of objects with ``required`` keys, ``properties`` their schemas."""
    return {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "required": list(required), "properties": properties},
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
        "ports": _objects("containerPort", containerPort=INTEGER, name={"type": "string"}),
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


def _kind(
    api_version: str,
    *required: str,
    metadata: dict[str, Any] = NAMESPACED_METADATA,
    **properties: Any,
) -> dict[str, Any]:
    """An object of ``api_version`` with apiVersion, kind, metadata and ``required`` keys;
    ``properties`` are the schemas of its other top-level keys."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", *required],
        "properties": {"apiVersion": {"const": api_version}, "metadata": metadata, **properties},
    }


def _workload(extra_required: list[str]) -> dict[str, Any]:
    """A Deployment (its replicas may be left to a HorizontalPodAutoscaler: the cluster tests
    require them exactly where none scales it) or a StatefulSet (with ``extra_required``)."""
    spec = {
        "type": "object",
        "required": ["selector", "template", *extra_required],
        "properties": {
            "replicas": {"type": "integer", "minimum": 1},
            "selector": {"type": "object", "required": ["matchLabels"]},
            "template": _pod_template(SERVING_CONTAINER),
        },
    }
    return _kind("apps/v1", "spec", spec=spec)


SERVICE_SPEC = {
    "type": "object",
    "required": ["selector", "ports"],
    "properties": {"ports": _objects("name", "port", "targetPort", port=INTEGER)},
}
JOB_SPEC = {
    "type": "object",
    "required": ["template"],
    "properties": {"template": _pod_template(BASE_CONTAINER)},
}

HPA_SPEC = {
    "type": "object",
    "required": ["scaleTargetRef", "minReplicas", "maxReplicas", "metrics"],
    "properties": {
        "scaleTargetRef": {
            "type": "object",
            "required": ["apiVersion", "kind", "name"],
            "properties": {"apiVersion": {"const": "apps/v1"}, "kind": {"const": "Deployment"}},
        },
        "minReplicas": {"type": "integer", "minimum": 2},  # one pod is no availability
    },
}
PDB_SPEC = {
    "type": "object",
    "required": ["selector"],
    "oneOf": [{"required": ["minAvailable"]}, {"required": ["maxUnavailable"]}],
    "properties": {"selector": {"type": "object", "required": ["matchLabels"]}},
}

# KubeRay's RayJob (ray.io/v1) is a custom resource: kubernetes-validate has no schema for it
# (it holds the Kubernetes API's own kinds only). This is the part of its schema the deployment
# uses, written from KubeRay's Go types (ray-operator/apis/ray/v1: rayjob_types.go,
# raycluster_types.go): the fields they mark required, the enums, and no other key at the
# RayJob's levels, so a typo is an error. The embedded pod templates are core kinds: the
# cluster tests validate each of them strictly with kubernetes-validate as a v1 PodTemplate.
_RAY_POD = {"type": "object", "required": ["spec"], "properties": {"metadata": {}, "spec": {}}}
_RAY_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}
RAYJOB_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["entrypoint", "rayClusterSpec"],
    "properties": {
        "entrypoint": {"type": "string", "minLength": 1},
        "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
        "backoffLimit": {"type": "integer", "minimum": 0},
        "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        "shutdownAfterJobFinishes": {"type": "boolean"},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "submitterPodTemplate": _RAY_POD,
        "rayClusterSpec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                "headGroupSpec": {
                    "type": "object",
                    "required": ["rayStartParams", "template"],
                    "properties": {"rayStartParams": _RAY_START_PARAMS, "template": _RAY_POD},
                    "additionalProperties": False,
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": [
                            "groupName",
                            "minReplicas",
                            "maxReplicas",
                            "rayStartParams",
                            "template",
                        ],
                        "properties": {
                            "groupName": {"type": "string"},
                            "replicas": {"type": "integer", "minimum": 0},
                            "minReplicas": {"type": "integer", "minimum": 0},
                            "maxReplicas": {"type": "integer", "minimum": 1},
                            "rayStartParams": _RAY_START_PARAMS,
                            "template": _RAY_POD,
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

K8S_SCHEMAS: dict[str, dict[str, Any]] = {
    "Namespace": _kind("v1", metadata=METADATA),
    "ConfigMap": _kind("v1", "data", data=ENV_MAP),
    "Secret": {
        **_kind("v1", "type", "stringData", type={"const": "Opaque"}, stringData=ENV_MAP),
        "not": {"required": ["data"]},  # placeholders stay readable, not base64
    },
    "Service": _kind("v1", "spec", spec=SERVICE_SPEC),
    "Deployment": _workload([]),
    "StatefulSet": _workload(["replicas", "serviceName"]),
    "Job": _kind("batch/v1", "spec", spec=JOB_SPEC),
    "HorizontalPodAutoscaler": _kind("autoscaling/v2", "spec", spec=HPA_SPEC),
    "PodDisruptionBudget": _kind("policy/v1", "spec", spec=PDB_SPEC),
    "PersistentVolumeClaim": _kind("v1", "spec"),
    "RayJob": _kind("ray.io/v1", "spec", spec=RAYJOB_SPEC),
    "Kustomization": {
        "type": "object",
        "required": ["apiVersion", "kind", "resources"],
        "properties": {
            "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
            "resources": STRINGS,
        },
    },
}
