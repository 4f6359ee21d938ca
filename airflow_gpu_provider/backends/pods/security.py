"""The security of a GPU pod: the contexts the provider writes, and the pieces the check at DAG parse judges.

The restricted Pod Security Standards profile is the default for every container of a GPU pod: a non-root user, the
runtime's seccomp profile, no capability, no privilege escalation. ``pod_security='baseline'`` (or ``'privileged'``) is
the opt-out, where ``[gpu_policy] min_pod_security`` allows it. Whether a pod meets its level is decided in one place,
``policy/pods.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BASELINE: dict[str, Any] = {"privileged": False, "allowPrivilegeEscalation": False}
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def security_context(overrides: Mapping[str, Any] | None, *, restricted: bool, user: int) -> dict[str, Any]:
    """Every container's security context; ``container_security_context`` keys replace the defaults.

    Restricted (the Pod Security Standards profile, the default): a non-root user, the runtime's seccomp profile,
    no capability, no privilege escalation. Baseline (the opt-out): not privileged, no privilege escalation.
    """
    defaults = dict(BASELINE)
    if restricted:
        defaults |= {
            "runAsNonRoot": True,
            "runAsUser": user,
            "runAsGroup": user,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": RUNTIME_DEFAULT_SECCOMP,
        }
    return {**defaults, **(overrides or {})}


def pod_security_context(*, restricted: bool, user: int) -> dict[str, Any]:
    """The pod's security context (restricted profile): every container's user and group, the volumes' group."""
    if not restricted:
        return {}
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": user,
        "fsGroup": user,
        "seccompProfile": RUNTIME_DEFAULT_SECCOMP,
    }


def skeleton(options: Any, *, annotations: bool = True) -> dict[str, Any]:
    """What the provider itself sets of a GPU pod that pod security judges, from the pod options.

    The pod's and the main container's security contexts (the init container and the XCom sidecar get the main
    container's), and the options' annotations. For the check at DAG parse (``policy/pods.py``, rule P1).
    """
    restricted = options.pod_security == "restricted"
    context = security_context(options.container_security_context, restricted=restricted, user=options.run_as_user)
    return {
        "metadata": {"annotations": dict(options.annotations or {})} if annotations else {},
        "spec": {
            "securityContext": pod_security_context(restricted=restricted, user=options.run_as_user),
            "containers": [{"name": "base", "securityContext": context}],
        },
    }


def overlay(template: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod template with the provider's :func:`skeleton` merged in, as the check at DAG parse judges it.

    Everything of the template stays: its containers after the first, init and ephemeral containers, volumes, host
    namespaces, annotations. The provider's security contexts fill in what the template's pod and first container
    leave unset; where both set a key, the template's value is judged. (KubernetesPodOperator and the executor let
    the provider's contexts replace the template's as a whole: judging the template's values too refuses an
    explicit bad value that the merge would happen to hide.)
    """
    merged = dict(template)
    spec = merged["spec"] = dict(template.get("spec") or {})
    provider_spec = pod.get("spec") or {}
    spec["securityContext"] = _under(provider_spec.get("securityContext"), spec.get("securityContext"))
    containers = list(spec.get("containers") or [{"name": "base"}])
    if isinstance(containers[0], Mapping):
        main = (provider_spec.get("containers") or [{}])[0]
        first = dict(containers[0])
        first["securityContext"] = _under(main.get("securityContext"), first.get("securityContext"))
        containers[0] = first
    spec["containers"] = containers
    metadata = merged["metadata"] = dict(template.get("metadata") or {})
    metadata["annotations"] = _under((pod.get("metadata") or {}).get("annotations"), metadata.get("annotations"))
    return merged


def _under(base: Any, top: Any) -> Any:
    """``top``'s keys over ``base``'s (the provider's); a ``top`` that is not a mapping stays, to be judged."""
    if top is not None and not isinstance(top, Mapping):
        return top
    return {**(base or {}), **(top or {})}
