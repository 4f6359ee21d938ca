"""The security of a GPU pod: the contexts the provider writes, and what breaks the restricted profile.

The restricted Pod Security Standards profile is the default for every container of a GPU pod: a non-root user, the
runtime's seccomp profile, no capability, no privilege escalation. ``pod_security='baseline'`` is the opt-out.
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


def restricted_problem(context: Mapping[str, Any]) -> str | None:
    """What in a container security context breaks the restricted Pod Security Standards profile, or ``None``."""
    if context.get("privileged"):
        return "privileged=True"
    if context.get("allowPrivilegeEscalation", False) is not False:
        return f"allowPrivilegeEscalation={context['allowPrivilegeEscalation']!r}"
    if context.get("runAsNonRoot", True) is not True:
        return f"runAsNonRoot={context['runAsNonRoot']!r}"
    if context.get("runAsUser") == 0:
        return "runAsUser=0 (root)"
    capabilities = context.get("capabilities")
    if capabilities is not None:
        drop, add = (capabilities or {}).get("drop") or [], (capabilities or {}).get("add") or []
        if "ALL" not in drop or not set(add) <= {"NET_BIND_SERVICE"}:
            return f"capabilities={capabilities!r} (drop must hold 'ALL'; only 'NET_BIND_SERVICE' may be added)"
    seccomp = context.get("seccompProfile")
    if seccomp is not None and (seccomp or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        return f"seccompProfile={seccomp!r}"
    if context.get("procMount", "Default") != "Default":
        return f"procMount={context['procMount']!r}"
    return None
