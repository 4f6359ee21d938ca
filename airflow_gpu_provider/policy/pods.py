"""The pod a Kubernetes task may get: the final check every Pod, Job and ``pod_override`` passes (:func:`final`).

Rule P1 of docs/security.md: every pod the provider submits (a Pod, the pod template of an Indexed Job) or hands an
executor (a ``pod_override``) meets the task's Pod Security Standards level, in every container, init container and
ephemeral container, its host namespaces, volumes, sysctls, pod and container security contexts and annotations
(:mod:`.pod_standards`). The level is ``restricted`` unless the task asks for ``pod_security='baseline'`` or
``'privileged'``, which ``[gpu_policy] min_pod_security`` must allow (rule P2). :func:`violations` is that check, used
at DAG parse on what a task gives (templates, security contexts, ``pod_override``) and on the final object.

Rule P3: what a pod names that RBAC does not bound (its namespace, service account, runtime class, priority class,
Kueue queue and Kueue priority class) is one ``[gpu_policy] allowed_objects`` lists, or the deployment's own
(the connection's namespace and Kueue queue) (:func:`unlisted`). Rule P4: every container that asks for no
NVIDIA device of its own (no ``nvidia.com/*`` resource, no DRA claim) gets ``NVIDIA_VISIBLE_DEVICES=void``, over
whatever it or its image says (:func:`isolated`): under the NVIDIA runtime's defaults a sidecar or init container
of a CUDA image would otherwise see every GPU of the node, outside the scheduler, quotas and Kueue.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.policy import LEVELS, PolicyError
from airflow_gpu_provider.policy.pod_standards import CONTAINER_LISTS, Violation, standards
from airflow_gpu_provider.settings.accelerators import NO_GPUS

#: Kueue's labels (kubernetes-sigs/kueue: the LocalQueue and the WorkloadPriorityClass of a pod or Job)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
OPTION = "allowed_objects"
#: Where a pod (or a pod template) names each kind of ``[gpu_policy] allowed_objects``: ``metadata.<field>``,
#: ``metadata.labels.<key>`` or ``spec.<field>`` (``serviceAccount`` is the deprecated alias the API server honours).
REFERENCES: dict[str, tuple[str, ...]] = {
    "namespace": ("metadata", "namespace"),
    "service_account": ("spec", "serviceAccountName", "serviceAccount"),
    "runtime_class": ("spec", "runtimeClassName"),
    "priority_class": ("spec", "priorityClassName"),
    "kueue_queue": ("labels", QUEUE_LABEL),
    "kueue_priority_class": ("labels", PRIORITY_LABEL),
}
ANY = "*"


class PodSecurityError(GpuTaskError):
    """The pod (or Job) the worker would submit breaks its level or the allow-lists: nothing is submitted."""

    def __init__(self, what: str, level: str, found: list[Violation], names: list[Violation] | None = None) -> None:
        self.level, self.violations, self.unlisted = level, found, list(names or [])
        parts = []
        if found:
            listed = "; ".join(map(str, found[:8])) + (f"; and {len(found) - 8} more" if len(found) > 8 else "")
            parts.append(
                f"it breaks the {level} Pod Security Standards level ({listed}). Remove these fields from the pod "
                "template (pod_template_file, pod_template_dict) or the task's options; "
                "backend_options['pod_security'] may ask for a weaker level where [gpu_policy] min_pod_security "
                "allows it"
            )
        if self.unlisted:
            parts.append(f"it names {'; '.join(map(str, self.unlisted))}. Ask the deployment's admin to list them")
        super().__init__(f"Refusing to submit {what}: {'. And '.join(parts)}.")


def level_refused(level: str, minimum: str) -> str | None:
    """Why a task may not ask for pod-security ``level`` when the weakest allowed is ``minimum``; ``None`` if it may."""
    if level not in LEVELS:
        return f"{level!r} is none of {', '.join(LEVELS)}"
    if LEVELS.index(level) > LEVELS.index(minimum):
        return f"the weakest level [gpu_policy] min_pod_security allows is {minimum!r}"
    return None


def refused(
    owner: str, field: str, found: list[Violation], level: str, *, choice: str = "backend_options['pod_security']"
) -> PolicyError:
    """The error at DAG parse for what a task gives (``field``) that breaks its level (rule P1).

    :param choice: where the task chooses its level
    """
    reasons = "; ".join(f"{v.path}: {v.reason}" for v in found[:4]) + ("; ..." if len(found) > 4 else "")
    return PolicyError(
        owner,
        field,
        {v.path: v.value for v in found[:4]},
        f"{reasons}; the {level} Pod Security Standards level forbids it",
        option="min_pod_security",
        allow=f"a pod within the {level} level, or {choice} set to a weaker level (baseline, privileged) where "
        "[gpu_policy] min_pod_security allows it",
    )


def violations(obj: Mapping[str, Any], level: str) -> list[Violation]:
    """Every field of a Pod, a pod template (``{metadata, spec}``) or a Job that ``level`` forbids; ``[]`` when none.

    ``privileged`` forbids nothing. A Job is judged by its pod template (paths start ``spec.template.``).
    """
    return standards(obj, level)


def require(obj: Mapping[str, Any], level: str, what: str) -> None:
    """Refuse ``obj`` (:class:`PodSecurityError`) unless it meets ``level`` (rule P1 alone)."""
    found = violations(obj, level)
    if found:
        raise PodSecurityError(what, level, found)


def final(obj: Mapping[str, Any], level: str, what: str, allowed: Mapping[str, frozenset[str]]) -> dict[str, Any]:
    """The worker's last step before a Pod or Job is submitted (or a ``pod_override`` handed to an executor).

    Returns ``obj`` with every container's device isolation set (rule P4), once it meets ``level`` (rule P1) and
    names only what ``allowed`` lists (rule P3); else raises :class:`PodSecurityError` and nothing is submitted.

    :param allowed: ``Policy.objects`` with the deployment's own names added (the namespace the connection gives)
    """
    pod = isolated(obj)
    found, names = violations(pod, level), unlisted(pod, allowed)
    if found or names:
        raise PodSecurityError(what, level, found, names)
    return pod


def unlisted(obj: Mapping[str, Any], allowed: Mapping[str, frozenset[str]]) -> list[Violation]:
    """What a Pod, pod template or Job names that ``allowed`` does not list (rule P3); ``[]`` when nothing.

    Unset (or empty) names are the cluster's defaults and pass; ``*`` in a kind's list allows any name.
    """
    found = []
    for key, path, value in _references(obj):
        names = allowed.get(key, frozenset())
        if value in (None, "") or (isinstance(value, str) and (value in names or ANY in names)):
            continue
        listed = ", ".join(f"{key}={name}" for name in sorted(names)) or f"no {key}"
        found.append(Violation(path, value, f"[gpu] {OPTION} lists {listed}"))
    return found


def refused_names(owner: str, field: str, found: list[Violation]) -> PolicyError:
    """The error at DAG parse for names a task gives (``field``) that the allow-list does not hold (rule P3)."""
    return PolicyError(
        owner,
        field,
        {v.path: v.value for v in found[:4]},
        "; ".join(f"{v.path}={v.value!r}: {v.reason}" for v in found[:4]) + ", and RBAC alone does not bound it",
        option=OPTION,
        allow="a KIND=NAME entry for it (the deployment's admin adds one), or the field left unset (the "
        "deployment's own namespace, service account, queue)",
    )


def _references(obj: Mapping[str, Any]) -> list[tuple[str, str, object]]:
    """``(kind, path, value)`` of every name a Pod, pod template or Job (and its pod template) gives."""
    pods: list[tuple[str, Mapping[str, Any]]] = [("", obj)]
    if obj.get("kind") == "Job":
        template = _mapping(_mapping(obj.get("spec")).get("template"))
        pods.append(("spec.template.", template))
    found: list[tuple[str, str, object]] = []
    for prefix, pod in pods:
        metadata, spec = _mapping(pod.get("metadata")), _mapping(pod.get("spec"))
        labels = _mapping(metadata.get("labels"))
        for key, (where, *fields) in REFERENCES.items():
            for name in fields:
                if where == "labels":
                    found.append((key, f"{prefix}metadata.labels[{name!r}]", labels.get(name)))
                else:
                    value = (metadata if where == "metadata" else spec).get(name)
                    found.append((key, f"{prefix}{where}.{name}", value))
    return found


def isolated(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a Pod, pod template or Job whose containers without an NVIDIA device get ``NO_GPUS`` (rule P4).

    Every container, init container and ephemeral container: its own entries of the variable (a value or a
    ``valueFrom``) are replaced. A container keeps its own when it asks for an ``nvidia.com/*`` resource (the device
    plugin sets the variable) or holds a DRA claim (the claim's driver says what it sees).
    """
    copied = copy.deepcopy(dict(obj))
    pod: Mapping[str, Any] = copied
    if copied.get("kind") == "Job":
        pod = _mapping(_mapping(copied.get("spec")).get("template"))
    spec = _mapping(pod.get("spec"))
    for field in CONTAINER_LISTS:
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else []:
            if isinstance(container, dict) and not has_nvidia_device(container):
                container["env"] = _without_gpus(container.get("env"))
    return copied


def _without_gpus(env: object) -> list[Any]:
    """``env`` with :data:`NO_GPUS` set: in the place of its first entry of the name, the others dropped."""
    wanted = [{"name": name, "value": value} for name, value in NO_GPUS.items()]
    result: list[Any] = []
    for entry in env if isinstance(env, list) else []:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if name not in NO_GPUS:
            result.append(entry)
        elif not any(item.get("name") == name for item in result if isinstance(item, Mapping)):
            result.append({"name": name, "value": NO_GPUS[name]})
    return [*result, *(item for item in wanted if item not in result)]


def has_nvidia_device(container: Mapping[str, Any]) -> bool:
    """Whether a container asks for an NVIDIA device of its own: an ``nvidia.com/*`` resource, or a DRA claim."""
    resources = _mapping(container.get("resources"))
    names = [*_mapping(resources.get("limits")), *_mapping(resources.get("requests"))]
    return bool(resources.get("claims")) or any(str(name).startswith("nvidia.com/") for name in names)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
