"""``backend_options`` of the Kubernetes backend: one typed, frozen dataclass, checked when the DAG is parsed.

Every option is documented in ``docs/kubernetes.md``. Values are checked for shape here (names, types, closed sets);
whether the cluster accepts them is the API server's business.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from airflow_gpu_provider.backends.kubernetes.labels import LABEL_SCHEMES, node_selector
from airflow_gpu_provider.backends.options import BackendOptions, BadOption, boolean, dict_list, one_of, option, seconds
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

REQUIREMENTS_MODES: tuple[str, ...] = ("init-container", "image")
PULL_POLICIES: tuple[str, ...] = ("Always", "IfNotPresent", "Never")
FINISH_ACTIONS: tuple[str, ...] = ("delete_pod", "delete_succeeded_pod", "keep_pod")
TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
TOLERATION_OPERATORS: tuple[str, ...] = ("Exists", "Equal")
TAINT_EFFECTS: tuple[str, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME_PART}$")
LABEL_VALUE = re.compile(rf"^({_NAME_PART})?$")

RequirementsMode = Literal["init-container", "image"]
POD_SECURITY: tuple[str, ...] = ("restricted", "baseline")


def _string(pattern: re.Pattern[str] | None = None, accepted: str = "str") -> Any:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
            raise BadOption("not a valid value", accepted)
        return value

    return check


def check_label_key(key: object) -> str:
    """A label, annotation or node-selector key: ``[prefix/]name``."""
    accepted = "a qualified name such as 'team' or 'example.com/team' (prefix: DNS subdomain; name: 63 characters)"
    if (
        not isinstance(key, str)
        or not QUALIFIED_NAME.fullmatch(key)
        or len(key.partition("/")[2] or key) > 63
        or len(key.rpartition("/")[0]) > 253
    ):
        raise BadOption("not a Kubernetes label key", accepted, value=key)
    return key


def _string_map(*, label_values: bool) -> Any:
    """A dict of label keys to strings (label values obey the 63-character label grammar)."""

    def check(value: Any) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise BadOption("expected a mapping", "a dict of str to str")
        for key, item in value.items():
            check_label_key(key)
            if not isinstance(item, str):
                raise BadOption(f"the value of {key!r} must be a string", "str", value=item)
            if label_values and not LABEL_VALUE.fullmatch(item):
                raise BadOption(
                    f"the value of {key!r} is not a label value",
                    "up to 63 of [A-Za-z0-9-_.], alphanumeric ends",
                    value=item,
                )
        return dict(value)

    return check


def _tolerations(value: Any) -> tuple[dict[str, Any], ...]:
    accepted = "a list of dicts with key, operator (Exists|Equal), value, effect, tolerationSeconds"
    tolerations = dict_list(value, keys=TOLERATION_KEYS, what="toleration", accepted=accepted)
    for item in tolerations:  # the API server's rules (validateTolerations)
        operator, key, value = item.get("operator", "Equal"), item.get("key"), item.get("value")
        if operator not in TOLERATION_OPERATORS:
            raise BadOption("unknown operator", " or ".join(TOLERATION_OPERATORS), value=item)
        if "effect" in item and item["effect"] not in TAINT_EFFECTS:
            raise BadOption("unknown effect", " or ".join(TAINT_EFFECTS), value=item)
        if key:
            check_label_key(key)
        elif (key is not None and key != "") or operator != "Exists":
            raise BadOption("a toleration without a key must have operator 'Exists'", accepted, value=item)
        if (value is not None and not isinstance(value, str)) or (operator == "Exists" and value):
            raise BadOption("'value' is a string, and operator 'Exists' takes none", accepted, value=item)
        if operator == "Equal" and not LABEL_VALUE.fullmatch(value or ""):
            raise BadOption("'value' is not a label value", "up to 63 of [A-Za-z0-9-_.], alphanumeric ends", value=item)
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int) or seconds >= 2**63):
            raise BadOption("'tolerationSeconds' must be an integer", accepted, value=item)
        if seconds is not None and item.get("effect") != "NoExecute":
            raise BadOption("'tolerationSeconds' needs effect 'NoExecute'", accepted, value=item)
    return tolerations


def check_affinity(value: Any) -> dict[str, Any]:
    """An affinity in the API form, whose required node-selector terms the accelerator's expressions join."""
    accepted = "{'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [{...}]}}}"
    if not isinstance(value, Mapping):
        raise BadOption("expected a dict in the Kubernetes API form", accepted)
    node = value.get("nodeAffinity", {})
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution", {}) if isinstance(node, Mapping) else None
    terms = required.get("nodeSelectorTerms", []) if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not all(
        isinstance(term, Mapping) and isinstance(term.get("matchExpressions", []), list) for term in terms
    ):
        raise BadOption("its nodeAffinity is not in the API form", accepted)
    return dict(value)


def _api_dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise BadOption("expected a dict in the Kubernetes API form", "a dict")
    return dict(value)


def check_pod_template(value: Any) -> dict[str, Any]:
    """A pod template's shape: a Pod whose metadata and spec are dicts, and whose containers have names.

    KubernetesPodOperator merges the task's pod into it; it needs a container to merge into (the plan adds one
    named ``base`` when the template has none).
    """
    accepted = "a Pod manifest as a dict, e.g. {'spec': {'nodeSelector': {...}, 'containers': [{'name': 'base'}]}}"
    if not isinstance(value, Mapping) or value.get("kind", "Pod") != "Pod":
        raise BadOption("not a Pod manifest", accepted)
    for key in ("metadata", "spec"):
        if not isinstance(value.get(key) or {}, Mapping):
            raise BadOption(f"its {key!r} is not a dict", accepted)
    spec = value.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(isinstance(v, str) for v in selector.values()):
        raise BadOption("its spec.nodeSelector is not a dict of label keys to strings", accepted)
    for key in selector:
        check_label_key(key)
    _tolerations(spec.get("tolerations") or [])  # the same rules as backend_options['tolerations']
    check_affinity(spec.get("affinity") or {})
    containers = spec.get("containers")
    if containers is not None and (
        not isinstance(containers, list)
        or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"] for c in containers)
    ):
        raise BadOption("its spec.containers is not a list of containers with names", accepted)
    return dict(value)


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


def _secret_names(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(i, str) and DNS_SUBDOMAIN.fullmatch(i) for i in items):
        raise BadOption("expected secret names", "a list of secret names, or 'secret_a,secret_b'")
    return tuple(items)


def _user_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise BadOption("expected a non-root user id", "an integer such as 1000 (not 0)")
    return value


def _grace_seconds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:  # an int64 in the API
        raise BadOption("expected a non-negative integer", "seconds, e.g. 30")
    return value


_dns_label = _string(DNS_LABEL, "a DNS label: lower-case letters, digits and '-'")
_dns_subdomain = _string(DNS_SUBDOMAIN, "a DNS subdomain name")


@dataclass(frozen=True)
class KubernetesOptions(BackendOptions):
    """The Kubernetes backend's options (``backend_options=``), with their defaults. See ``docs/kubernetes.md``."""

    backend: ClassVar[str] = "kubernetes"

    kubernetes_conn_id: str = option("kubernetes_default", check=_string())
    namespace: str | None = option(check=_dns_label)
    in_cluster: bool | None = option(check=boolean)
    cluster_context: str | None = option(check=_string())
    config_file: str | None = option(check=_string())
    label_scheme: str = option("nvidia-gfd", check=one_of(*LABEL_SCHEMES))
    accelerator_labels: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    node_selector: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    tolerations: tuple[dict[str, Any], ...] = option((), check=_tolerations)
    gpu_toleration: bool = option(True, check=boolean)
    affinity: Mapping[str, Any] | None = option(check=check_affinity)
    pod_template_file: str | None = option(check=_string())
    pod_template_dict: Mapping[str, Any] | None = option(check=check_pod_template)
    labels: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    annotations: Mapping[str, str] | None = option(check=_string_map(label_values=False))
    service_account_name: str | None = option(check=_dns_subdomain)
    image_pull_secrets: tuple[str, ...] = option((), check=_secret_names)
    image_pull_policy: str | None = option(check=one_of(*PULL_POLICIES))
    priority_class_name: str | None = option(check=_dns_subdomain)
    runtime_class_name: str | None = option(check=_dns_subdomain)
    container_security_context: Mapping[str, Any] | None = option(check=_api_dict)
    pod_security: Literal["restricted", "baseline"] = option("restricted", check=one_of(*POD_SECURITY))
    run_as_user: int = option(1000, check=_user_id)
    requirements_mode: RequirementsMode = option("init-container", check=one_of(*REQUIREMENTS_MODES))
    index_secret: str | None = option(check=_dns_subdomain)
    derived_image: str | None = option(check=_string())
    installer_image: str | None = option(check=_string(accepted="an image reference with python3"))
    pending_timeout: float | None = option(check=seconds)
    startup_timeout: float = option(1800.0, check=seconds)
    termination_grace_period: int | None = option(check=_grace_seconds)
    checkpoint_claim: str | None = option(check=_dns_subdomain)
    on_finish_action: str = option("delete_pod", check=one_of(*FINISH_ACTIONS))

    def __post_init__(self) -> None:
        problem = restricted_problem(self.container_security_context or {})
        if self.pod_security == "restricted" and problem:
            raise self.invalid(
                "container_security_context",
                self.container_security_context,
                f"{problem}, which the restricted pod security profile (pod_security='restricted') forbids",
                "a context within the restricted profile, or pod_security='baseline' to opt out",
            )
        if self.pod_template_file is not None and self.pod_template_dict is not None:
            raise self.invalid("pod_template_dict", "...", "give pod_template_file or pod_template_dict, not both")
        if self.requirements_mode == "image" and not self.derived_image:
            raise self.invalid(
                "requirements_mode",
                "image",
                "needs backend_options['derived_image'], the image the Docker backend pushed to your registry",
                "derived_image='registry.example.com/team/train:<tag>', or requirements_mode='init-container'",
            )

    def check(self, resources: ResourceSettings) -> None:
        """At DAG parse time: the accelerator's node labels exist in the label scheme and no selector contradicts them.

        The selectors are the pod template's (``pod_template_dict``; a template file is read when the task runs) and
        ``node_selector``.
        """
        template = (self.pod_template_dict or {}).get("spec") or {}
        node_selector(
            resources,
            self.label_scheme,
            self.accelerator_labels,
            template=template.get("nodeSelector") or {},
            user=self.node_selector or {},
        )

    def check_image(self, image: ImageSettings) -> None:
        """Credentials in index URLs would be in the pod spec, for everyone who may read pods: a Secret holds them."""
        installs = image.requirements and self.requirements_mode == "init-container"
        if installs and image.index_credentials and self.index_secret is None:
            raise self.invalid(
                "index_secret",
                None,
                "the index URLs carry credentials, which would be in the pod spec for anyone who may read pods",
                "index URLs without credentials, and a Secret with a netrc file under the key 'netrc' "
                "(machine HOST login USER password TOKEN) named in backend_options['index_secret']",
            )
