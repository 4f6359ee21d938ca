"""policy/pods.py's rules, one control at a time, against the Pod Security Standards.

Each case starts from a pod that meets the restricted level and changes one field; the check must name that field
at the levels that forbid it and nothing at the others. The rules are those of the Pod Security admission controller
(k8s.io/pod-security-admission/policy), read for this check.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_gpu_provider.policy.pods import PodSecurityError, require, violations

RESTRICTED_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
GOOD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "annotations": {"container.apparmor.security.beta.kubernetes.io/base": "runtime/default"}},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "init", "securityContext": dict(RESTRICTED_CONTEXT)}],
        "containers": [
            {"name": "base", "securityContext": {**RESTRICTED_CONTEXT, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}},
            {"name": "side", "ports": [{"containerPort": 80}], "securityContext": dict(RESTRICTED_CONTEXT)},
        ],
        "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "persistentVolumeClaim": {"claimName": "c"}}],
    },
}  # fmt: skip


def changed(path: str, value: Any) -> dict[str, Any]:
    """GOOD with one field set (``spec.containers.1.securityContext.privileged``; ``None`` removes it)."""
    pod = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node: Any = pod
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return pod


# (field to change, value, the path the check names, the weakest level that forbids it)
CASES = [
    ("spec.hostNetwork", True, "spec.hostNetwork", "baseline"),
    ("spec.hostPID", True, "spec.hostPID", "baseline"),
    ("spec.hostIPC", "yes", "spec.hostIPC", "baseline"),  # the client would read it as True
    ("spec.hostUsers", "no", "spec.hostUsers", "baseline"),
    ("spec.securityContext.windowsOptions", {"hostProcess": True}, "spec.securityContext.windowsOptions.hostProcess", "baseline"),
    ("spec.containers.1.securityContext.privileged", True, "spec.containers[1].securityContext.privileged", "baseline"),
    ("spec.initContainers.0.securityContext.privileged", True, "spec.initContainers[0].securityContext.privileged", "baseline"),
    ("spec.containers.1.securityContext.capabilities", {"add": ["SYS_ADMIN"], "drop": ["ALL"]}, "spec.containers[1].securityContext.capabilities.add[0]", "baseline"),
    ("spec.containers.1.securityContext.capabilities", {"add": ["CHOWN"], "drop": ["ALL"]}, "spec.containers[1].securityContext.capabilities.add[0]", "restricted"),
    ("spec.containers.1.securityContext.capabilities", {"drop": ["NET_RAW"]}, "spec.containers[1].securityContext.capabilities.drop", "restricted"),
    ("spec.volumes", [{"name": "h", "hostPath": {"path": "/"}}], "spec.volumes[0].hostPath", "baseline"),
    ("spec.volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}], "spec.volumes[0].nfs", "restricted"),
    ("spec.volumes", [{"name": "g", "gitRepo": {"repository": "r"}}], "spec.volumes[0].gitRepo", "restricted"),
    ("spec.containers.1.ports", [{"containerPort": 80, "hostPort": 80}], "spec.containers[1].ports[0].hostPort", "baseline"),
    ("spec.containers.1.securityContext.appArmorProfile", {"type": "Unconfined"}, "spec.containers[1].securityContext.appArmorProfile.type", "baseline"),
    ("spec.securityContext.appArmorProfile", {"type": "Unconfined"}, "spec.securityContext.appArmorProfile.type", "baseline"),
    ("metadata.annotations", {"container.apparmor.security.beta.kubernetes.io/side": "unconfined"}, "metadata.annotations['container.apparmor.security.beta.kubernetes.io/side']", "baseline"),
    ("metadata.annotations", {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}, "metadata.annotations['seccomp.security.alpha.kubernetes.io/pod']", "baseline"),
    ("spec.securityContext.seLinuxOptions", {"type": "spc_t"}, "spec.securityContext.seLinuxOptions.type", "baseline"),
    ("spec.containers.0.securityContext.seLinuxOptions", {"user": "system_u"}, "spec.containers[0].securityContext.seLinuxOptions.user", "baseline"),
    ("spec.containers.0.securityContext.procMount", "Unmasked", "spec.containers[0].securityContext.procMount", "baseline"),
    ("spec.securityContext.sysctls", [{"name": "kernel.core_pattern", "value": "x"}], "spec.securityContext.sysctls[0].name", "baseline"),
    ("spec.containers.1.securityContext.seccompProfile", {"type": "Unconfined"}, "spec.containers[1].securityContext.seccompProfile.type", "baseline"),
    ("spec.securityContext.seccompProfile", None, "spec.containers[1].securityContext.seccompProfile.type", "restricted"),
    ("spec.securityContext.runAsNonRoot", None, "spec.initContainers[0].securityContext.runAsNonRoot", "restricted"),
    ("spec.containers.1.securityContext.runAsNonRoot", False, "spec.containers[1].securityContext.runAsNonRoot", "restricted"),
    ("spec.containers.1.securityContext.runAsUser", 0, "spec.containers[1].securityContext.runAsUser", "restricted"),
    ("spec.containers.1.securityContext.runAsUser", "1000", "spec.containers[1].securityContext.runAsUser", "restricted"),
    ("spec.securityContext.runAsUser", 0, "spec.securityContext.runAsUser", "restricted"),
    ("spec.containers.1.securityContext.allowPrivilegeEscalation", None, "spec.containers[1].securityContext.allowPrivilegeEscalation", "restricted"),
    ("spec.containers.1.readinessProbe", {"httpGet": {"port": 80, "host": "10.0.0.1"}}, "spec.containers[1].readinessProbe.httpGet.host", "baseline"),
    ("spec.containers.1.lifecycle", {"preStop": {"tcpSocket": {"port": 80, "host": "node"}}}, "spec.containers[1].lifecycle.preStop.tcpSocket.host", "baseline"),
    ("spec.ephemeralContainers", [{"name": "debug", "securityContext": {"privileged": True}}], "spec.ephemeralContainers[0].securityContext.privileged", "baseline"),
    ("spec.containers", {"name": "base"}, "spec.containers", "baseline"),  # not a list: not judged blind
]  # fmt: skip


def test_the_good_pod_meets_every_level():
    assert violations(GOOD, "restricted") == violations(GOOD, "baseline") == violations(GOOD, "privileged") == []


@pytest.mark.parametrize(("field", "value", "path", "weakest"), CASES, ids=[f"{c[0]}={c[1]!r}"[:60] for c in CASES])
def test_each_control_names_its_field_at_the_levels_that_forbid_it(field, value, path, weakest):
    pod = changed(field, value)
    assert path in [v.path for v in violations(pod, "restricted")]
    baseline = [v.path for v in violations(pod, "baseline")]
    assert (path in baseline) == (weakest == "baseline"), baseline
    assert violations(pod, "privileged") == []


def test_a_job_is_judged_by_its_pod_template():
    pod = changed("spec.hostPID", True)
    job = {"kind": "Job", "spec": {"template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}
    assert [v.path for v in violations(job, "baseline")] == ["spec.template.spec.hostPID"]
    with pytest.raises(
        PodSecurityError, match=r"Refusing to submit Job j: .*spec\.template\.spec\.hostPID=True"
    ) as err:
        require(job, "restricted", "Job j")
    assert err.value.level == "restricted" and len(err.value.violations) == 1


def test_user_namespaces_and_windows_relax_nothing():
    """Stricter than PSA 1.35+: ``hostUsers: false`` does not allow root, and a Windows pod is exempt from nothing."""
    pod = changed("spec.containers.1.securityContext.runAsUser", 0)
    pod["spec"]["hostUsers"] = False
    pod["spec"]["os"] = {"name": "windows"}
    assert "spec.containers[1].securityContext.runAsUser" in [v.path for v in violations(pod, "restricted")]


def test_container_level_settings_cover_an_unset_pod_level():
    pod = changed("spec.securityContext", None)
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        container["securityContext"] |= {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "Localhost", "localhostProfile": "p"},
        }
    assert violations(pod, "restricted") == []


def test_an_unknown_level_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown Pod Security Standards level 'strict'"):
        violations(GOOD, "strict")
