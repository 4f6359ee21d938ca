"""The pod options that the kubernetes backend's pods and the executor backend's KubernetesExecutor pods share.

:class:`PodOptions` holds every option that shapes a GPU pod wherever it runs: the accelerator's node labels, the
scheduling fields, labels and annotations, and the security context. The kubernetes backend's options extend it with
how to reach the cluster and run the pod; the executor backend takes it as ``backend_options['kubernetes']``. Values
are checked for shape here (names, types, closed sets); whether the cluster accepts them is the API server's
business.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from airflow_gpu_provider.backends.options import BackendOptions, BadOption, boolean, dict_list, one_of, option
from airflow_gpu_provider.backends.pods.node_labels import LABEL_SCHEMES, node_selector
from airflow_gpu_provider.backends.pods.security import skeleton
from airflow_gpu_provider.policy import LEVELS, PolicyError
from airflow_gpu_provider.policy.pods import level_refused, refused, refused_names, unlisted, violations
from airflow_gpu_provider.settings import ResourceSettings

TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
TOLERATION_OPERATORS: tuple[str, ...] = ("Exists", "Equal")
TAINT_EFFECTS: tuple[str, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POD_SECURITY: tuple[str, ...] = LEVELS  # restricted, baseline, privileged: weaker ones as min_pod_security allows

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME_PART}$")
LABEL_VALUE = re.compile(rf"^({_NAME_PART})?$")


def string_check(pattern: re.Pattern[str] | None = None, accepted: str = "str") -> Any:
    """A check of non-empty strings (matching ``pattern``, when given)."""

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


def check_tolerations(value: Any) -> tuple[dict[str, Any], ...]:
    """Tolerations in the API form, by the API server's own rules (``validateTolerations``)."""
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


def _user_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise BadOption("expected a non-root user id", "an integer such as 1000 (not 0)")
    return value


dns_subdomain = string_check(DNS_SUBDOMAIN, "a DNS subdomain name")


@dataclass(frozen=True)
class PodOptions(BackendOptions):
    """What shapes a GPU pod, on the kubernetes backend and in a KubernetesExecutor ``pod_override`` alike.

    See ``docs/kubernetes.md`` for each option.
    """

    backend: ClassVar[str] = "kubernetes"

    label_scheme: str = option("nvidia-gfd", check=one_of(*LABEL_SCHEMES))
    accelerator_labels: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    node_selector: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    tolerations: tuple[dict[str, Any], ...] = option((), check=check_tolerations)
    gpu_toleration: bool = option(True, check=boolean)
    affinity: Mapping[str, Any] | None = option(check=check_affinity)
    labels: Mapping[str, str] | None = option(check=_string_map(label_values=True))
    annotations: Mapping[str, str] | None = option(check=_string_map(label_values=False))
    service_account_name: str | None = option(check=dns_subdomain)
    priority_class_name: str | None = option(check=dns_subdomain)
    runtime_class_name: str | None = option(check=dns_subdomain)
    container_security_context: Mapping[str, Any] | None = option(check=_api_dict)
    pod_security: Literal["restricted", "baseline", "privileged"] = option("restricted", check=one_of(*POD_SECURITY))
    run_as_user: int = option(1000, check=_user_id)

    def __post_init__(self) -> None:
        """The pod these options shape meets the task's own level (rule P1 of docs/security.md; pure)."""
        for name, pod in (
            ("container_security_context", skeleton(self, annotations=False)),
            ("annotations", {"metadata": {"annotations": dict(self.annotations or {})}}),
        ):
            found = violations(pod, self.pod_security)
            if found:
                raise refused(f"backend {self.backend!r}", f"backend_options[{name!r}]", found, self.pod_security)

    def objects(self) -> dict[str, dict[str, Any]]:
        """The cluster objects these options name, as pieces of a pod by option (rule P3 judges them)."""
        return {
            "service_account_name": {"spec": {"serviceAccountName": self.service_account_name}},
            "priority_class_name": {"spec": {"priorityClassName": self.priority_class_name}},
            "runtime_class_name": {"spec": {"runtimeClassName": self.runtime_class_name}},
            "labels": {"metadata": {"labels": dict(self.labels or {})}},  # Kueue's labels
        }

    def permitted(self, owner: str) -> None:
        """At DAG parse: a level weaker than restricted only where ``min_pod_security`` allows it (rule P2).

        And the cluster objects the options name only as ``[gpu_policy] allowed_objects`` lists (rule P3). The
        policy is read only for tasks that name any, or ask for less than restricted.
        """
        from airflow_gpu_provider.policy import Policy

        named = {name: pod for name, pod in self.objects().items() if unlisted(pod, {})}
        allowed = Policy.current().objects if named else {}
        for name, pod in named.items():
            found = unlisted(pod, allowed)
            if found:
                raise refused_names(owner, f"backend_options[{name!r}]", found)
        if self.pod_security == "restricted":
            return
        minimum = Policy.current().min_pod_security
        problem = level_refused(self.pod_security, minimum)
        if problem:
            raise PolicyError(
                owner,
                "backend_options['pod_security']",
                self.pod_security,
                f"{problem}, so a GPU pod must meet that level",
                option="min_pod_security",
                allow=f"levels at least as strong as {minimum!r} (of {', '.join(LEVELS)}, strongest first)",
            )

    def check(self, resources: ResourceSettings) -> None:
        """At DAG parse time: the accelerator's node labels exist in its label scheme; no selector contradicts them."""
        node_selector(resources, self.label_scheme, self.accelerator_labels, template={}, user=self.node_selector or {})
