"""``backend_options`` of the Kubernetes backend: one typed, frozen dataclass, checked when the DAG is parsed.

Every option is documented in ``docs/kubernetes.md``. Values are checked for shape here (names, types, closed sets);
whether the cluster accepts them is the API server's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_gpu_provider.backends.kubernetes.kueue import PRIORITY_LABEL, QUEUE_LABEL, kueue_name, kueue_queue_name
from airflow_gpu_provider.backends.options import BadOption, boolean, one_of, option, seconds
from airflow_gpu_provider.backends.pods import dra
from airflow_gpu_provider.backends.pods.node_labels import node_selector
from airflow_gpu_provider.backends.pods.options import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    PodOptions,
    check_affinity,
    check_label_key,
    check_tolerations,
    dns_subdomain,
    string_check,
)
from airflow_gpu_provider.backends.pods.security import overlay, skeleton
from airflow_gpu_provider.policy.pods import refused, violations
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

REQUIREMENTS_MODES: tuple[str, ...] = ("init-container", "image")
PULL_POLICIES: tuple[str, ...] = ("Always", "IfNotPresent", "Never")
FINISH_ACTIONS: tuple[str, ...] = ("delete_pod", "delete_succeeded_pod", "keep_pod")

RequirementsMode = Literal["init-container", "image"]


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
    check_tolerations(spec.get("tolerations") or [])  # the same rules as backend_options['tolerations']
    check_affinity(spec.get("affinity") or {})
    containers = spec.get("containers")
    if containers is not None and (
        not isinstance(containers, list)
        or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"] for c in containers)
    ):
        raise BadOption("its spec.containers is not a list of containers with names", accepted)
    return dict(value)


def _secret_names(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(i, str) and DNS_SUBDOMAIN.fullmatch(i) for i in items):
        raise BadOption("expected secret names", "a list of secret names, or 'secret_a,secret_b'")
    return tuple(items)


def _grace_seconds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:  # an int64 in the API
        raise BadOption("expected a non-negative integer", "seconds, e.g. 30")
    return value


_dns_label = string_check(DNS_LABEL, "a DNS label: lower-case letters, digits and '-'")


@dataclass(frozen=True)
class KubernetesOptions(PodOptions):
    """The Kubernetes backend's options (``backend_options=``), with their defaults. See ``docs/kubernetes.md``.

    The pod's shape (:class:`~airflow_gpu_provider.backends.pods.options.PodOptions`), and how to reach the cluster
    and run the pod.
    """

    kubernetes_conn_id: str = option("kubernetes_default", check=string_check())
    namespace: str | None = option(check=_dns_label)
    in_cluster: bool | None = option(check=boolean)
    cluster_context: str | None = option(check=string_check())
    config_file: str | None = option(check=string_check())
    pod_template_file: str | None = option(check=string_check())
    pod_template_dict: Mapping[str, Any] | None = option(check=check_pod_template)
    image_pull_secrets: tuple[str, ...] = option((), check=_secret_names)
    image_pull_policy: str | None = option(check=one_of(*PULL_POLICIES))
    requirements_mode: RequirementsMode = option("init-container", check=one_of(*REQUIREMENTS_MODES))
    index_secret: str | None = option(check=dns_subdomain)
    derived_image: str | None = option(check=string_check())
    installer_image: str | None = option(check=string_check(accepted="an image reference with python3"))
    pending_timeout: float | None = option(check=seconds)
    startup_timeout: float = option(1800.0, check=seconds)
    termination_grace_period: int | None = option(check=_grace_seconds)
    checkpoint_claim: str | None = option(check=dns_subdomain)
    on_finish_action: str = option("delete_pod", check=one_of(*FINISH_ACTIONS))
    kueue_queue: str | None = option(check=kueue_queue_name)  # None: the connection's; '': no Kueue
    kueue_priority_class: str | None = option(check=kueue_name)
    gpu_allocation: str | None = option(check=one_of(*dra.ALLOCATIONS))  # None: the connection's

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pod_template_file is not None and self.pod_template_dict is not None:
            raise self.invalid("pod_template_dict", "...", "give pod_template_file or pod_template_dict, not both")
        if self.pod_template_dict is not None:  # rule P1: the template's every container, volume, namespace, ...
            found = violations(overlay(self.pod_template_dict, skeleton(self)), self.pod_security)
            if found:
                raise refused(
                    f"backend {self.backend!r}", "backend_options['pod_template_dict']", found, self.pod_security
                )
        if self.requirements_mode == "image" and not self.derived_image:
            raise self.invalid(
                "requirements_mode",
                "image",
                "needs backend_options['derived_image'], the image the Docker backend pushed to your registry",
                "derived_image='registry.example.com/team/train:<tag>', or requirements_mode='init-container'",
            )

    def objects(self) -> dict[str, dict[str, Any]]:
        """The pod options' objects, and the namespace, the Kueue queue and priority class, the template's (rule P3)."""
        return {
            **super().objects(),
            "namespace": {"metadata": {"namespace": self.namespace}},
            "kueue_queue": {"metadata": {"labels": {QUEUE_LABEL: self.kueue_queue}}},
            "kueue_priority_class": {"metadata": {"labels": {PRIORITY_LABEL: self.kueue_priority_class}}},
            "pod_template_dict": dict(self.pod_template_dict or {}),
        }

    def check(self, resources: ResourceSettings) -> None:
        """At DAG parse time: the accelerator's node labels exist in the label scheme and no selector contradicts them.

        The selectors are the pod template's (``pod_template_dict``; a template file is read when the task runs) and
        ``node_selector``.
        """
        if self.kueue_queue == "":  # no queue at all; without one named, the worker's plan sees the connection's
            self.kueue_queue_or("")
        template = (self.pod_template_dict or {}).get("spec") or {}
        if self.gpu_allocation == "dra":
            self.check_dra(resources, template)
        node_selector(
            resources,
            self.label_scheme,
            self.accelerator_labels,
            template=template.get("nodeSelector") or {},
            user=self.node_selector or {},
        )

    def kueue_queue_or(self, default: str) -> str:
        """The task's Kueue LocalQueue: ``kueue_queue``, else ``default`` (the connection's, checked); empty: none.

        A priority class without a queue is refused.
        """
        queue = self.kueue_queue if self.kueue_queue is not None else default
        if not queue and self.kueue_priority_class is not None:
            raise self.invalid(
                "kueue_priority_class",
                self.kueue_priority_class,
                "no Kueue queue: neither backend_options['kueue_queue'] nor the Kubernetes connection's extra "
                "kueue_queue is set",
                "a queue as well, e.g. backend_options={'kueue_queue': 'team-a', 'kueue_priority_class': 'high'}",
            )
        return queue

    def check_dra(self, resources: ResourceSettings, template: Mapping[str, Any]) -> None:
        """A DRA request the drivers can serve, and a pod template that holds no claims of its own.

        The provider's claim would replace the template's ``resourceClaims``.
        """
        dra.check("ResourceSettings", resources)
        if resources.requests_gpus and template.get("resourceClaims"):
            raise self.invalid(
                "pod_template_dict" if self.pod_template_dict is not None else "pod_template_file",
                {"spec": {"resourceClaims": template["resourceClaims"]}},
                "the pod template holds resource claims, and gpu_allocation='dra' gives the pod its own",
                "a template without spec.resourceClaims, or gpu_allocation='device-plugin'",
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
