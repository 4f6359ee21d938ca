"""The Pod Security Standards, as the Pod Security admission controller judges a pod: :func:`standards`.

The rules are those of kubernetes.io/docs/concepts/security/pod-security-standards, as the Pod Security admission
controller implements them (k8s.io/pod-security-admission/policy, up to Kubernetes 1.37), with two differences that
make the check stricter: ``hostUsers: false`` relaxes nothing (PSA 1.35+ then allows root and any ``procMount``),
and ``os.name: windows`` exempts nothing. Values are read as the API server reads them, and a value of another type
is itself a violation: ``privileged: "true"`` or ``runAsUser: "0"``, which the kubernetes client would coerce to
``True`` and ``0``, are refused, not skipped. Used through :mod:`.pods` (rule P1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from airflow_gpu_provider.policy import LEVELS

#: Capabilities a baseline container may add (Docker's default set; PSA ``capabilities_baseline``).
DEFAULT_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP"}
    | {"SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)
#: Sysctls namespaced to the pod and isolated from other pods (PSA ``sysctls``, 1.37's list).
SAFE_SYSCTLS = frozenset(
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"}
    | {"net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time"}
    | {"net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
    | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: The only volume sources of a restricted pod (PSA ``restrictedVolumes``): none reaches the node.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim", "projected"}
    | {"secret"}
)
PROFILE_TYPES = ("RuntimeDefault", "Localhost")  # seccomp and AppArmor alike
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


class Violation(NamedTuple):
    """One field of a pod that its level forbids.

    :param path: where, e.g. ``spec.initContainers[0].securityContext.privileged``
    :param value: the value found there (``None``: unset, where the level requires a value)
    :param reason: why the level forbids it, naming the control of the Pod Security Standards
    """

    path: str
    value: object
    reason: str

    def __str__(self) -> str:
        return f"{self.path}={self.value!r}: {self.reason}"


def standards(obj: Mapping[str, Any], level: str) -> list[Violation]:
    """Every field of a Pod, a pod template (``{metadata, spec}``) or a Job that ``level`` forbids; ``[]`` when none.

    ``privileged`` forbids nothing. A Job is judged by its pod template (paths start ``spec.template.``).
    """
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security Standards level {level!r}: one of {', '.join(LEVELS)}")
    if level == "privileged":
        return []
    check = _Check(restricted=level == "restricted")
    if obj.get("kind") == "Job":
        obj = check.mapping(check.mapping(obj.get("spec"), "spec").get("template"), "spec.template")
        check.prefix = "spec.template."
    check.pod(obj)
    return check.found


class _Check:
    """One walk over a pod, collecting violations."""

    def __init__(self, *, restricted: bool) -> None:
        self.restricted, self.prefix = restricted, ""
        self.found: list[Violation] = []

    def bad(self, path: str, value: object, reason: str) -> None:
        self.found.append(Violation(self.prefix + path, value, reason))

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if isinstance(value, Mapping):
            return value
        self.bad(path, value, "not an object of the Kubernetes API")
        return {}

    def items(self, value: object, path: str) -> list[tuple[str, Mapping[str, Any]]]:
        if value is None:
            return []
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            self.bad(path, value, "not a list")
            return []
        return [(f"{path}[{i}]", self.mapping(item, f"{path}[{i}]")) for i, item in enumerate(value)]

    def off(self, value: object, path: str, reason: str) -> None:
        """Allowed: unset or ``false`` (a non-boolean is a violation too: the client would make ``"no"`` true)."""
        if value is not None and value is not False:
            self.bad(path, value, f"must be false or unset: {reason}")

    # ------------------------------------------------------------------------------------------ the pod
    def pod(self, pod: Mapping[str, Any]) -> None:
        metadata, spec = self.mapping(pod.get("metadata"), "metadata"), self.mapping(pod.get("spec"), "spec")
        for name in HOST_NAMESPACES:  # Host Namespaces (baseline)
            self.off(spec.get(name), f"spec.{name}", "the pod would share the node's namespace (Host Namespaces)")
        if spec.get("hostUsers") is not None and not isinstance(spec.get("hostUsers"), bool):
            self.bad("spec.hostUsers", spec.get("hostUsers"), "not a boolean")
        context = self.mapping(spec.get("securityContext"), "spec.securityContext")
        self.context(context, "spec.securityContext")
        for path, sysctl in self.items(context.get("sysctls"), "spec.securityContext.sysctls"):  # Sysctls (baseline)
            if sysctl.get("name") not in SAFE_SYSCTLS:
                self.bad(f"{path}.name", sysctl.get("name"), "not a safe, pod-namespaced sysctl (Sysctls)")
        for path, volume in self.items(spec.get("volumes"), "spec.volumes"):
            self.volume(volume, path)
        pod_non_root = context.get("runAsNonRoot") is True
        seccomp = context.get("seccompProfile")
        pod_seccomp = isinstance(seccomp, Mapping) and seccomp.get("type") in PROFILE_TYPES
        for field in CONTAINER_LISTS:
            for path, container in self.items(spec.get(field), f"spec.{field}"):
                self.container(container, path, pod_non_root=pod_non_root, pod_seccomp=pod_seccomp)
        annotations = self.mapping(metadata.get("annotations"), "metadata.annotations")
        for key, value in annotations.items():
            self.annotation(str(key), value)

    def volume(self, volume: Mapping[str, Any], path: str) -> None:
        sources = sorted(str(key) for key in volume if key != "name")
        if "hostPath" in sources:  # HostPath Volumes (baseline)
            self.bad(f"{path}.hostPath", volume["hostPath"], "a folder of the node (HostPath Volumes)")
        elif self.restricted:  # Volume Types (restricted)
            for source in sources:
                if source not in RESTRICTED_VOLUMES:
                    allowed = ", ".join(sorted(RESTRICTED_VOLUMES))
                    self.bad(f"{path}.{source}", volume[source], f"restricted pods mount only {allowed} (Volume Types)")

    def annotation(self, key: str, value: object) -> None:
        if key.startswith(APPARMOR_ANNOTATION):  # AppArmor (baseline), the annotations before the field (1.30)
            if not isinstance(value, str) or not (value in ("", "runtime/default") or value.startswith("localhost/")):
                self.bad(f"metadata.annotations[{key!r}]", value, "AppArmor other than runtime/default or localhost/*")
        elif key.startswith(SECCOMP_ANNOTATIONS):  # Seccomp (baseline), the annotations before the field (1.19)
            allowed = ("runtime/default", "docker/default")
            if not isinstance(value, str) or not (value in allowed or value.startswith("localhost/")):
                self.bad(f"metadata.annotations[{key!r}]", value, "seccomp other than runtime/default or localhost/*")

    # ------------------------------------------------------------------------------------------ contexts
    def context(self, context: Mapping[str, Any], path: str) -> None:
        """What a pod's and a container's security context share."""
        windows = self.mapping(context.get("windowsOptions"), f"{path}.windowsOptions")
        self.off(
            windows.get("hostProcess"), f"{path}.windowsOptions.hostProcess", "a Windows host process (HostProcess)"
        )
        selinux = self.mapping(context.get("seLinuxOptions"), f"{path}.seLinuxOptions")
        if selinux.get("type") is not None and selinux.get("type") not in SELINUX_TYPES:
            self.bad(f"{path}.seLinuxOptions.type", selinux.get("type"), f"one of {sorted(SELINUX_TYPES)} (SELinux)")
        for name in ("user", "role"):
            if selinux.get(name) not in (None, ""):
                self.bad(f"{path}.seLinuxOptions.{name}", selinux.get(name), "must be unset (SELinux)")
        for field, control in (("seccompProfile", "Seccomp"), ("appArmorProfile", "AppArmor")):
            if context.get(field) is not None:
                kind = self.mapping(context.get(field), f"{path}.{field}").get("type")
                if kind not in PROFILE_TYPES:
                    self.bad(f"{path}.{field}.type", kind, f"must be RuntimeDefault or Localhost ({control})")
        if not self.restricted:
            return
        non_root = context.get("runAsNonRoot")  # Running as Non-root (restricted)
        if non_root is not None and non_root is not True:
            self.bad(f"{path}.runAsNonRoot", non_root, "must be true (Running as Non-root)")
        user = context.get("runAsUser")  # Running as Non-root user (restricted)
        if user is not None and (isinstance(user, bool) or not isinstance(user, int) or user == 0):
            self.bad(f"{path}.runAsUser", user, "must be a non-zero user id (Running as Non-root user)")

    def container(self, container: Mapping[str, Any], path: str, *, pod_non_root: bool, pod_seccomp: bool) -> None:
        context = self.mapping(container.get("securityContext"), f"{path}.securityContext")
        where = f"{path}.securityContext"
        self.context(context, where)
        self.off(context.get("privileged"), f"{where}.privileged", "a privileged container has the node (Privileged)")
        if context.get("procMount") not in (None, "Default"):  # /proc masks (baseline; restricted from 1.35)
            self.bad(f"{where}.procMount", context.get("procMount"), "must be Default or unset (/proc Mount Type)")
        self.capabilities(context, where)
        for index, port in self.items(container.get("ports"), f"{path}.ports"):  # Host Ports (baseline)
            if port.get("hostPort") not in (None, 0):
                self.bad(f"{index}.hostPort", port.get("hostPort"), "must be 0 or unset: a node's port (Host Ports)")
        handlers = [(f"{path}.{probe}", container.get(probe)) for probe in PROBES]
        lifecycle = self.mapping(container.get("lifecycle"), f"{path}.lifecycle")
        handlers += [(f"{path}.lifecycle.{hook}", lifecycle.get(hook)) for hook in ("postStart", "preStop")]
        for at, handler in handlers:  # Host Probes / Lifecycle Hooks (baseline, 1.34)
            for kind in ("httpGet", "tcpSocket"):
                host = self.mapping(self.mapping(handler, at).get(kind), f"{at}.{kind}").get("host")
                if host not in (None, ""):
                    self.bad(f"{at}.{kind}.host", host, "must be unset: probes reach the pod only (Host Probes)")
        if not self.restricted:
            return
        if context.get("allowPrivilegeEscalation") is not False:  # Privilege Escalation (restricted)
            escalation = context.get("allowPrivilegeEscalation")
            self.bad(f"{where}.allowPrivilegeEscalation", escalation, "must be false (Privilege Escalation)")
        if context.get("runAsNonRoot") is None and not pod_non_root:
            self.bad(f"{where}.runAsNonRoot", None, "must be true, here or in spec.securityContext (Non-root)")
        if context.get("seccompProfile") is None and not pod_seccomp:
            reason = "must be RuntimeDefault or Localhost, here or in spec.securityContext (Seccomp)"
            self.bad(f"{where}.seccompProfile.type", None, reason)

    def capabilities(self, context: Mapping[str, Any], where: str) -> None:
        capabilities = self.mapping(context.get("capabilities"), f"{where}.capabilities")
        add = [(p, c) for p, c in self._strings(capabilities.get("add"), f"{where}.capabilities.add")]
        allowed = {"NET_BIND_SERVICE"} if self.restricted else DEFAULT_CAPABILITIES
        control = "only NET_BIND_SERVICE may be added (Capabilities)" if self.restricted else "beyond the default set"
        for path, name in add:
            if name not in allowed:
                self.bad(path, name, control)
        if self.restricted:
            drop = [name for _, name in self._strings(capabilities.get("drop"), f"{where}.capabilities.drop")]
            if "ALL" not in drop:
                self.bad(f"{where}.capabilities.drop", capabilities.get("drop"), "must hold 'ALL' (Capabilities)")

    def _strings(self, value: object, path: str) -> list[tuple[str, str]]:
        if value is None:
            return []
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            self.bad(path, value, "not a list of names")
            return []
        found = []
        for index, item in enumerate(value):
            if isinstance(item, str):
                found.append((f"{path}[{index}]", item))
            else:
                self.bad(f"{path}[{index}]", item, "not a name")
        return found
