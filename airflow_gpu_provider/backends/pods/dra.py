"""``ResourceSettings`` -> a Dynamic Resource Allocation claim (``resource.k8s.io/v1``, GA in Kubernetes 1.34). Pure.

With ``gpu_allocation="dra"`` a GPU pod asks for no extended resource (``nvidia.com/gpu``): it names one claim,
made by the cluster from a ``ResourceClaimTemplate`` that the backend creates with the pod
(:mod:`..kubernetes.companions`). The template's one device request:

- the driver's device class (:data:`DRIVERS`: NVIDIA ``gpu.nvidia.com``, a MIG slice ``mig.nvidia.com``; AMD
  ``gpu.amd.com``; Intel ``gpu.intel.com``); other vendors have no published class here and are refused;
- ``count``: the task's ``gpu_count`` (exactly that many);
- CEL selectors on the driver's attributes: the model's words in ``productName`` (the rule of
  :func:`~airflow_gpu_provider.settings.accelerators.model_words`, as the host inventory matches NVML's names), the
  MIG ``profile``, and after a GPU out-of-memory try more ``memory`` capacity than the card that ran out had;
- a fallback list of models: ``firstAvailable``, one subrequest per model in the list's order (the scheduler takes
  the first it can satisfy).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.accelerators import model_words
from airflow_gpu_provider.settings.units import format_k8s_bytes

API_VERSION = "resource.k8s.io/v1"
CLAIM = "gpu"  # the pod's claim, the container's claim and the template's request: one name
ALLOCATIONS: tuple[str, ...] = ("device-plugin", "dra")


@dataclass(frozen=True)
class DraDriver:
    """What one vendor's DRA driver publishes.

    :param device_class: the DeviceClass of whole GPUs the driver installs
    :param domain: the domain of its device attributes and capacities (``device.attributes[domain]``)
    :param models: whether the model is selectable (an attribute with the product name)
    :param memory: whether devices publish their memory as the ``memory`` capacity
    :param mig_class: the DeviceClass of MIG slices, when the driver has one
    :param whole: a CEL expression that keeps whole GPUs, where the class holds partitions too
    """

    device_class: str
    domain: str
    models: bool
    memory: bool
    mig_class: str | None = None
    whole: str | None = None


DRIVERS: dict[str, DraDriver] = {
    # NVIDIA's DRA driver for GPUs (NVIDIA/k8s-dra-driver-gpu): productName is NVML's name, memory a capacity
    "nvidia": DraDriver("gpu.nvidia.com", "gpu.nvidia.com", models=True, memory=True, mig_class="mig.nvidia.com"),
    # AMD's GPU DRA driver (ROCm/k8s-gpu-dra-driver): whole GPUs are type "amdgpu", partitions "amdgpu-partition"
    "amd": DraDriver("gpu.amd.com", "gpu.amd.com", models=False, memory=False, whole='.type == "amdgpu"'),
    # Intel's resource drivers for Kubernetes (intel/intel-resource-drivers-for-kubernetes): memory a capacity
    "intel": DraDriver("gpu.intel.com", "gpu.intel.com", models=False, memory=True),
}
_ACCEPTED = (
    "a GPU of nvidia (gpu.nvidia.com; MIG slices: mig.nvidia.com), amd (gpu.amd.com) or intel (gpu.intel.com); "
    "or backend_options={'gpu_allocation': 'device-plugin'}"
)


def check(owner: str, resources: ResourceSettings) -> DraDriver | None:
    """The driver of a GPU request under DRA (``None`` for a CPU task), or an error naming the field.

    Called when the DAG is parsed (``gpu_allocation="dra"``) and when the pod is planned (``[gpu]``'s default).
    """
    if not resources.requests_gpus:
        return None
    vendor = resources.gpu_vendor.name
    driver = DRIVERS.get(vendor)
    if driver is None:
        raise InvalidSettingError(
            owner, "gpu_vendor", vendor,
            "no DRA device class is known for this vendor (an unknown device class would leave the pod pending)",
            _ACCEPTED,
        )  # fmt: skip
    if resources.accelerators and not driver.models:
        raise InvalidSettingError(
            owner, "accelerator", list(resources.accelerators),
            f"the {vendor} DRA driver ({driver.device_class}) publishes no product name this provider can select",
            f"no accelerator (any {vendor} GPU), or backend_options={{'gpu_allocation': 'device-plugin'}}",
        )  # fmt: skip
    return driver


def _cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def _model_expression(domain: str, model: str) -> str:
    """The driver's product name holds each word of the model (``NVIDIA A100-SXM4-80GB`` is an ``A100-80GB``)."""
    attribute = f'device.attributes["{domain}"].productName'
    words = [f"(?i)(^|[ -]){re.escape(word)}([ -]|$)" for word in model_words(model)]
    return " && ".join(f"{attribute}.matches({json.dumps(word)})" for word in words)


def _request(
    driver: DraDriver, resources: ResourceSettings, model: str | None, min_memory: int | None
) -> dict[str, Any]:
    """One exact device request: the class, the count and the selectors of one model."""
    selectors = []
    if driver.whole is not None:
        selectors.append(_cel(f'device.attributes["{driver.domain}"]{driver.whole}'))
    if model is not None:
        selectors.append(_cel(_model_expression(driver.domain, model)))
    if resources.mig_profile is not None:
        selectors.append(_cel(f'device.attributes["{driver.domain}"].profile == {json.dumps(resources.mig_profile)}'))
    if min_memory is not None and driver.memory:
        quantity = json.dumps(format_k8s_bytes(min_memory))
        selectors.append(_cel(f'device.capacity["{driver.domain}"].memory.compareTo(quantity({quantity})) > 0'))
    device_class = driver.mig_class if resources.mig_profile is not None else driver.device_class
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount"}
    request["count"] = int(resources.gpu_count)
    if selectors:
        request["selectors"] = selectors
    return request


def subrequest_name(model: str) -> str:
    """A model as a subrequest name (a DNS label): ``A100-80GB`` -> ``a100-80gb``."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:63].strip("-") or "any"


def claim_spec(owner: str, resources: ResourceSettings, min_memory: int | None = None) -> dict[str, Any] | None:
    """The ``spec`` of a ResourceClaim for the task's GPUs (``None`` for a CPU task).

    :param min_memory: a try after a GPU out-of-memory failure: each device needs more memory than this (bytes)
    """
    driver = check(owner, resources)
    if driver is None:
        return None
    models = resources.accelerators
    if len(models) > 1:
        alternatives = [{"name": subrequest_name(m), **_request(driver, resources, m, min_memory)} for m in models]
        request: dict[str, Any] = {"name": CLAIM, "firstAvailable": alternatives}
    else:
        request = {"name": CLAIM, "exactly": _request(driver, resources, models[0] if models else None, min_memory)}
    return {"devices": {"requests": [request]}}


def template_name(pod_name: str) -> str:
    """The name of a pod's claim template: the pod's, with ``-gpu`` (a DNS subdomain, like the pod's)."""
    return f"{pod_name[:240]}-{CLAIM}"


def claim_template(name: str, namespace: str | None, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate object, as the API's dict."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata, "spec": {"spec": spec}}


def pod_claims(template: str) -> list[dict[str, str]]:
    """The pod's ``spec.resourceClaims``: one claim made from ``template``."""
    return [{"name": CLAIM, "resourceClaimTemplateName": template}]


def container_claims() -> list[dict[str, str]]:
    """The main container's ``resources.claims``: the pod's one claim."""
    return [{"name": CLAIM}]
