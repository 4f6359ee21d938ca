"""``backend_options`` of the Kubernetes backend, validated when the DAG is parsed.

Every option is documented in ``docs/kubernetes.md``. Values are checked for shape here (names, types, closed sets);
whether the cluster accepts them is the API server's business.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError

OWNER = "backend 'kubernetes'"
LABEL_SCHEME_NAMES: tuple[str, ...] = ("nvidia-gfd", "gke", "eks", "karpenter", "none")
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

LabelSchemeName = Literal["nvidia-gfd", "gke", "eks", "karpenter", "none"]
RequirementsMode = Literal["init-container", "image"]


def invalid(name: str, value: object, reason: str, accepted: str | None = None) -> InvalidSettingError:
    """An error for ``backend_options[name]``."""
    return InvalidSettingError(OWNER, f"backend_options[{name!r}]", value, reason, accepted)


def check_label_key(name: str, key: object) -> str:
    """A label, annotation or node-selector key: ``[prefix/]name``."""
    accepted = "a qualified name such as 'team' or 'example.com/team' (prefix: DNS subdomain; name: 63 characters)"
    if not isinstance(key, str) or not QUALIFIED_NAME.match(key) or len(key.partition("/")[2] or key) > 63:
        raise invalid(name, key, "not a Kubernetes label key", accepted)
    return key


def string_map(name: str, value: object, *, label_values: bool) -> dict[str, str]:
    """A dict of label keys to strings (label values obey the 63-character label grammar)."""
    if not isinstance(value, Mapping):
        raise invalid(name, value, "expected a mapping", "a dict of str to str")
    result = {}
    for key, item in value.items():
        check_label_key(name, key)
        if not isinstance(item, str):
            raise invalid(name, item, f"the value of {key!r} must be a string", "str")
        if label_values and not LABEL_VALUE.match(item):
            raise invalid(
                name,
                item,
                f"the value of {key!r} is not a label value",
                "up to 63 of [A-Za-z0-9-_.], alphanumeric ends",
            )
        result[key] = item
    return result


def _tolerations(value: object) -> tuple[dict[str, Any], ...]:
    accepted = "a list of dicts with key, operator (Exists|Equal), value, effect, tolerationSeconds"
    if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence):
        raise invalid("tolerations", value, "expected a list of tolerations", accepted)
    result = []
    for item in value:
        if not isinstance(item, Mapping) or set(item) - TOLERATION_KEYS:
            raise invalid("tolerations", item, "not a toleration in the Kubernetes API form", accepted)
        if item.get("operator", "Equal") not in TOLERATION_OPERATORS:
            raise invalid("tolerations", item, "unknown operator", " or ".join(TOLERATION_OPERATORS))
        if "effect" in item and item["effect"] not in TAINT_EFFECTS:
            raise invalid("tolerations", item, "unknown effect", " or ".join(TAINT_EFFECTS))
        result.append(dict(item))
    return tuple(result)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise invalid(name, value, "unknown value", " or ".join(map(repr, choices)))
    return str(value)


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise invalid(name, value, "expected a positive number of seconds", "e.g. 300")
    return float(value)


def _optional_str(name: str, value: object, pattern: re.Pattern[str] | None = None, accepted: str = "str") -> str:
    if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
        raise invalid(name, value, "not a valid value", accepted)
    return value


@dataclass(frozen=True)
class KubernetesOptions:
    """The Kubernetes backend's options (``backend_options=``), with their defaults. See ``docs/kubernetes.md``."""

    kubernetes_conn_id: str = "kubernetes_default"
    namespace: str | None = None
    in_cluster: bool | None = None
    cluster_context: str | None = None
    config_file: str | None = None
    label_scheme: LabelSchemeName = "nvidia-gfd"
    accelerator_labels: Mapping[str, str] | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    gpu_toleration: bool = True
    affinity: Mapping[str, Any] | None = None
    pod_template_file: str | None = None
    pod_template_dict: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    container_security_context: Mapping[str, Any] = field(default_factory=dict)
    requirements_mode: RequirementsMode = "init-container"
    derived_image: str | None = None
    installer_image: str | None = None
    pending_timeout: float | None = None
    startup_timeout: float = 1800.0
    termination_grace_period: int | None = None
    on_finish_action: str = "delete_pod"

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every accepted option name."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> KubernetesOptions:
        """Validate ``backend_options``; unknown names and bad values raise errors naming the accepted forms."""
        unknown = set(options) - cls.names()
        if unknown:
            raise UnknownSettingError(OWNER, unknown, cls.names())
        values: dict[str, Any] = {}
        for name, value in options.items():
            if value is not None:  # None keeps the default
                values[name] = _check(name, value)
        if values.get("pod_template_file") is not None and values.get("pod_template_dict") is not None:
            raise invalid("pod_template_dict", "...", "give pod_template_file or pod_template_dict, not both")
        if values.get("requirements_mode") == "image" and not values.get("derived_image"):
            raise invalid(
                "requirements_mode",
                "image",
                "needs backend_options['derived_image'], the image the Docker backend pushed to your registry",
                "derived_image='registry.example.com/team/train:<tag>', or requirements_mode='init-container'",
            )
        return cls(**values)


def _check(name: str, value: Any) -> Any:
    """Validate and normalise one option value."""
    if name in ("in_cluster", "gpu_toleration"):
        if not isinstance(value, bool):
            raise invalid(name, value, "expected a boolean", "True or False")
        return value
    if name == "namespace":
        return _optional_str(name, value, DNS_LABEL, "a DNS label: lower-case letters, digits and '-'")
    if name in ("service_account_name", "priority_class_name", "runtime_class_name"):
        return _optional_str(name, value, DNS_SUBDOMAIN, "a DNS subdomain name")
    if name in ("kubernetes_conn_id", "cluster_context", "config_file", "pod_template_file", "derived_image"):
        return _optional_str(name, value)
    if name == "installer_image":
        return _optional_str(name, value, accepted="an image reference with python3")
    if name == "label_scheme":
        return _choice(name, value, LABEL_SCHEME_NAMES)
    if name == "requirements_mode":
        return _choice(name, value, REQUIREMENTS_MODES)
    if name == "image_pull_policy":
        return _choice(name, value, PULL_POLICIES)
    if name == "on_finish_action":
        return _choice(name, value, FINISH_ACTIONS)
    if name in ("node_selector", "labels", "accelerator_labels"):
        return string_map(name, value, label_values=True)
    if name == "annotations":
        return string_map(name, value, label_values=False)
    if name == "tolerations":
        return _tolerations(value)
    if name in ("affinity", "pod_template_dict", "container_security_context"):
        if not isinstance(value, Mapping):
            raise invalid(name, value, "expected a dict in the Kubernetes API form", "a dict")
        return dict(value)
    if name == "image_pull_secrets":
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, Sequence) or not all(isinstance(i, str) and DNS_SUBDOMAIN.match(i) for i in items):
            raise invalid(name, value, "expected secret names", "a list of secret names, or 'secret_a,secret_b'")
        return tuple(items)
    if name in ("pending_timeout", "startup_timeout"):
        return _seconds(name, value)
    if name == "termination_grace_period":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(name, value, "expected a non-negative integer", "seconds, e.g. 30")
        return value
    raise AssertionError(f"unhandled option {name}")  # pragma: no cover - names() and _check() agree
