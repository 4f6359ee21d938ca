"""Checks every generated Kubernetes object must pass: the official OpenAPI schemas plus the API server's rules
that a JSON schema cannot express (names, quantities, GPU requests equal to limits, mounts of existing volumes)."""

from __future__ import annotations

import base64
import functools
import json
import re
from typing import Any

import kubernetes_validate
from kubernetes.utils import parse_quantity

from airflow_gpu_provider.config.worker import GpuConfig

# The oldest release whose Job features we rely on (pod-index labels, Indexed completion), the first with DRA's
# resource.k8s.io/v1 (GA), and the newest schemas kubernetes-validate has.
KUBERNETES_VERSIONS = ("1.28", "1.34", "1.37")
DRA_VERSIONS = ("1.34", "1.37")  # a ResourceClaimTemplate, and a pod that names one
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# kubernetes-validate reads and parses a schema file (megabytes of JSON) on every call, most of a call's time: the
# suite validates thousands of objects, so each file is parsed once per process (the validator only reads it)
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


def _check_labels(labels: dict[str, str], where: str) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        assert LABEL_NAME.match(name), f"{where}: label key {key!r}"
        assert not prefix or DNS_SUBDOMAIN.match(prefix), f"{where}: label prefix {key!r}"
        assert isinstance(value, str) and LABEL_VALUE.match(value), f"{where}: label value {key}={value!r}"


def _check_pod_spec(spec: dict[str, Any], where: str) -> None:
    volumes = {v["name"] for v in spec.get("volumes") or []}
    assert len(volumes) == len(spec.get("volumes") or []), f"{where}: duplicate volume names"
    containers = [*(spec.get("initContainers") or []), *spec["containers"]]
    names = [c["name"] for c in containers]
    assert len(set(names)) == len(names), f"{where}: duplicate container names {names}"
    for c in containers:
        assert DNS_LABEL.match(c["name"]), f"{where}: container name {c['name']!r}"
        for mount in c.get("volumeMounts") or []:
            assert mount["name"] in volumes, f"{where}: {c['name']} mounts unknown volume {mount['name']!r}"
        paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
        assert len(set(paths)) == len(paths), f"{where}: {c['name']} mounts one path twice"
        for env in c.get("env") or []:
            assert ENV_NAME.match(env["name"]), f"{where}: env name {env['name']!r}"
        requests = (c.get("resources") or {}).get("requests") or {}
        limits = (c.get("resources") or {}).get("limits") or {}
        for value in {**requests, **limits}.values():
            parse_quantity(value)  # raises on a malformed quantity
        for key, value in requests.items():
            if key in limits:
                assert parse_quantity(value) <= parse_quantity(limits[key]), f"{where}: {key} request > limit"
            if key not in STANDARD_RESOURCES and not key.startswith("hugepages-"):
                assert limits.get(key) == value, f"{where}: extended resource {key} needs request == limit"
    for volume in spec.get("volumes") or []:
        size = (volume.get("emptyDir") or {}).get("sizeLimit")
        if size is not None:
            parse_quantity(size)


RESTRICTED_VOLUMES = {
    "emptyDir",
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
}


def assert_restricted(spec: dict[str, Any], where: str) -> None:
    """The Pod Security Standards "restricted" profile, for every container (init and sidecars included)."""
    pod = spec.get("securityContext") or {}
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        own = c.get("securityContext") or {}
        effective = {**pod, **own}
        name = f"{where}: container {c['name']}"
        assert effective.get("runAsNonRoot") is True, f"{name} may run as root"
        assert effective.get("runAsUser", 1) != 0, f"{name} runs as uid 0"
        seccomp = (own.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        assert seccomp in ("RuntimeDefault", "Localhost"), f"{name}: seccomp {seccomp}"
        capabilities = own.get("capabilities") or {}
        assert "ALL" in (capabilities.get("drop") or []), f"{name} keeps capabilities"
        assert set(capabilities.get("add") or []) <= {"NET_BIND_SERVICE"}, f"{name} adds capabilities"
        assert own.get("allowPrivilegeEscalation") is False, f"{name} may escalate"
        assert not own.get("privileged"), f"{name} is privileged"
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        assert kinds <= RESTRICTED_VOLUMES, f"{where}: volume {volume['name']} of type {kinds}"


def validate(
    obj: dict[str, Any], *, restricted: bool = True, versions: tuple[str, ...] = KUBERNETES_VERSIONS
) -> dict[str, Any]:
    """Validate one API object (Pod, Job, Service, ResourceClaimTemplate) and return it; pods meet the restricted
    profile by default."""
    spec = obj.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or spec  # a Job's pods, or a pod's
    if obj["kind"] == "ResourceClaimTemplate" or pod_spec.get("resourceClaims"):
        versions = tuple(v for v in versions if v in DRA_VERSIONS) or DRA_VERSIONS
    for version in versions:
        kubernetes_validate.validate(obj, version, strict=True)
    metadata = obj["metadata"]
    assert DNS_SUBDOMAIN.match(metadata["name"]), metadata["name"]
    if obj["kind"] == "Service":
        assert DNS_LABEL.match(metadata["name"]), metadata["name"]
    _check_labels(metadata.get("labels") or {}, f"{obj['kind']} labels")
    if obj["kind"] == "Pod":
        _check_pod_spec(obj["spec"], "Pod")
        if restricted:
            assert_restricted(obj["spec"], "Pod")
    if obj["kind"] == "Job":
        template = obj["spec"]["template"]
        _check_labels(template["metadata"].get("labels") or {}, "Job pod labels")
        _check_pod_spec(template["spec"], "Job pod template")
        if restricted:
            assert_restricted(template["spec"], "Job pod template")
    return obj


def with_secret(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(secret, the other objects)`` of a render: the task's Secret comes first, and what the pods read of it is
    a reference (the envelope is in no pod spec)."""
    secret, *rest = objects
    assert secret["kind"] == "Secret" and secret.get("immutable") is True, secret["kind"]
    assert set(secret["data"]) == {"envelope"}, secret["data"].keys()
    owner = next(o for o in rest if o["kind"] in ("Pod", "Service"))["metadata"]  # a Job's Service: the Job's name
    assert secret["metadata"]["name"] == f"{owner['name']}-envelope"
    assert secret["metadata"].get("namespace") == owner.get("namespace")
    for obj in rest:
        spec = (obj.get("spec") or {}).get("template", {}).get("spec") or obj.get("spec") or {}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            for variable in container.get("env") or []:
                assert "value" not in variable or variable["name"] != "AIRFLOW_GPU_ENVELOPE", variable
        if obj["kind"] in ("Pod", "Job"):
            reference = env(main_container({"spec": spec}))["AIRFLOW_GPU_ENVELOPE"]
            assert reference == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "envelope"}}
    return secret, rest


def secret_value(secret: dict[str, Any]) -> str:
    """``AIRFLOW_GPU_ENVELOPE`` as the kubelet sets it from the task's Secret (base64 JSON)."""
    return base64.b64decode(secret["data"]["envelope"]).decode()


def envelope_of(secret_or_plan: Any) -> dict[str, Any]:
    """The task's envelope, from its Secret (an API dict) or from a plan (``KubernetesPlan.envelope``)."""
    value = secret_value(secret_or_plan) if isinstance(secret_or_plan, dict) else secret_or_plan.envelope
    return json.loads(base64.b64decode(value))


def main_container(pod: dict[str, Any]) -> dict[str, Any]:
    """The task's container (KubernetesPodOperator names it 'base')."""
    return next(c for c in pod["spec"]["containers"] if c["name"] == "base")


def env(container: dict[str, Any]) -> dict[str, Any]:
    """A container's environment as a dict (values, or valueFrom dicts)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def plan_and_render(
    resources: Any = None,
    image: Any = None,
    options: dict[str, Any] | None = None,
    *,
    policy: str = "fail",
    envelope: dict[str, Any] | None = None,
    **request_fields: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """Plan a request on the Kubernetes backend and render it with KubernetesPodOperator (no cluster).

    The objects are validated and returned without the task's Secret, which :func:`with_secret` checks (the envelope
    it holds: :func:`envelope_of` the plan).

    :param request_fields: more fields of the request (``avoid_nodes=...``)
    """
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    request = TaskRequest(
        resources or ResourceSettings(),
        image or ImageSettings(),
        envelope or Envelope.run(["python3", "-c", "print('hi')"]),
        policy,  # type: ignore[arg-type]
        {"dag_id": "d", "task_id": "train", "run_id": "manual", "try_number": "1", "map_index": "-1"},
        **request_fields,
    )
    options = {"namespace": "ml", **(options or {})}
    backend = BACKENDS["kubernetes"].create(options)
    restricted = options.get("pod_security", "restricted") == "restricted"
    objects = [validate(obj, restricted=restricted) for obj in backend.render(request, GpuConfig.read(), None)]
    return backend.plan(request, GpuConfig.read()), with_secret(objects)[1]
