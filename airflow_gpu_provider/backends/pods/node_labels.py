"""Accelerator model -> node labels, for each kind of cluster (a *label scheme*).

A label scheme says which node label carries the accelerator model and which values mean a given model. A model
that maps to one value becomes a ``nodeSelector`` entry; several values (``A100`` is a 40 GB or an 80 GB card)
become a required node-affinity ``In`` expression (:mod:`.scheduling`). ``backend_options["accelerator_labels"]``
replaces the lookup with exact labels, for clusters whose nodes carry other values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings

Requirements = dict[str, tuple[str, ...]]  # node label -> accepted values


@dataclass(frozen=True)
class LabelScheme:
    """How one kind of cluster labels its accelerator nodes.

    :param name: the ``label_scheme`` option value
    :param models: upper-case model -> node label -> accepted values
    :param documentation: where the labels come from
    """

    name: str
    models: Mapping[str, Requirements]
    documentation: str


def _same(label: str, table: Mapping[str, Sequence[str]]) -> dict[str, Requirements]:
    return {model: {label: tuple(values)} for model, values in table.items()}


_GFD_PRODUCTS = {
    "T4": ["Tesla-T4"],
    "V100": ["Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB", "Tesla-V100-PCIE-16GB", "Tesla-V100-PCIE-32GB"],
    "A10": ["NVIDIA-A10"],
    "A10G": ["NVIDIA-A10G"],
    "L4": ["NVIDIA-L4"],
    "L40S": ["NVIDIA-L40S"],
    "A100-40GB": ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"],
    "A100-80GB": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"],
    "H100-80GB": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"],
    "H100-NVL": ["NVIDIA-H100-NVL"],
    "H200": ["NVIDIA-H200"],
    "B200": ["NVIDIA-B200"],
}
_GFD_PRODUCTS["A100"] = _GFD_PRODUCTS["A100-40GB"] + _GFD_PRODUCTS["A100-80GB"]
_GFD_PRODUCTS["H100"] = _GFD_PRODUCTS["H100-80GB"] + _GFD_PRODUCTS["H100-NVL"]

_GKE_GPUS = {
    "T4": ["nvidia-tesla-t4"],
    "V100": ["nvidia-tesla-v100"],
    "L4": ["nvidia-l4"],
    "A100-40GB": ["nvidia-tesla-a100"],
    "A100-80GB": ["nvidia-a100-80gb"],
    "A100": ["nvidia-tesla-a100", "nvidia-a100-80gb"],
    "H100": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
    "H100-80GB": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
    "H200": ["nvidia-h200-141gb"],
    "B200": ["nvidia-b200"],
}
_GKE_TPUS = {"TPU-V4": ["tpu-v4-podslice"], "TPU-V5E": ["tpu-v5-lite-podslice"], "TPU-V5P": ["tpu-v5p-slice"]}

_EKS_GPUS = {
    "T4": ["nvidia-tesla-t4"],
    "V100": ["nvidia-tesla-v100"],
    "A10G": ["nvidia-a10g"],
    "L4": ["nvidia-l4"],
    "L40S": ["nvidia-l40s"],
    "A100": ["nvidia-tesla-a100"],
    "H100": ["nvidia-h100"],
    "H200": ["nvidia-h200"],
    "B200": ["nvidia-b200"],
}

_KARPENTER_GPU = "karpenter.k8s.aws/instance-gpu-name"
_KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"  # MiB per GPU
_KARPENTER_ACCELERATOR = "karpenter.k8s.aws/instance-accelerator-name"
_KARPENTER: dict[str, Requirements] = {
    **_same(_KARPENTER_GPU, {m: [m.lower()] for m in ("T4", "V100", "A10G", "L4", "L40S", "A100", "H100", "H200")}),
    "A100-40GB": {_KARPENTER_GPU: ("a100",), _KARPENTER_GPU_MEMORY: ("40960",)},
    "A100-80GB": {_KARPENTER_GPU: ("a100",), _KARPENTER_GPU_MEMORY: ("81920",)},
    "H100-80GB": {_KARPENTER_GPU: ("h100",), _KARPENTER_GPU_MEMORY: ("81920",)},
    **_same(_KARPENTER_ACCELERATOR, {"TRAINIUM": ["trainium"], "INFERENTIA2": ["inferentia2"]}),
}

LABEL_SCHEMES: dict[str, LabelScheme] = {
    "nvidia-gfd": LabelScheme(
        "nvidia-gfd",
        _same("nvidia.com/gpu.product", _GFD_PRODUCTS),
        "NVIDIA GPU Feature Discovery (GPU Operator): nvidia.com/gpu.product is the NVML product name",
    ),
    "gke": LabelScheme(
        "gke",
        {
            **_same("cloud.google.com/gke-accelerator", _GKE_GPUS),
            **_same("cloud.google.com/gke-tpu-accelerator", _GKE_TPUS),
        },
        "GKE node pools: cloud.google.com/gke-accelerator (GPUs), cloud.google.com/gke-tpu-accelerator (TPUs)",
    ),
    "eks": LabelScheme(
        "eks",
        _same("k8s.amazonaws.com/accelerator", _EKS_GPUS),
        "EKS node groups labelled for the cluster autoscaler: k8s.amazonaws.com/accelerator",
    ),
    "karpenter": LabelScheme(
        "karpenter",
        _KARPENTER,
        "Karpenter on AWS: karpenter.k8s.aws/instance-gpu-name (+ instance-gpu-memory, instance-accelerator-name)",
    ),
    "none": LabelScheme("none", {}, "no node labels: the extended resource request alone picks the nodes"),
}


def accelerator_requirements(
    resources: ResourceSettings, scheme_name: str, explicit: Mapping[str, str] | None
) -> list[Requirements]:
    """Node labels that select each acceptable model, preferred first; ``[]`` without a model or labels.

    ``accelerator_labels`` (``explicit``) stands for every model of a list.
    """
    if explicit:
        return [{key: (value,) for key, value in explicit.items()}]
    if not resources.accelerators or scheme_name == "none" or not resources.requests_gpus:
        return []
    scheme = LABEL_SCHEMES[scheme_name]
    found = [scheme.models.get(model.upper()) for model in resources.accelerators]
    for model, labels in zip(resources.accelerators, found, strict=True):
        if labels is None:
            raise InvalidSettingError(
                "ResourceSettings",
                "accelerator",
                model,
                f"the label scheme {scheme_name!r} ({scheme.documentation}) has no node labels for this model",
                f"one of {', '.join(sorted(scheme.models))}; or give the node labels yourself with "
                "backend_options={'accelerator_labels': {'<label>': '<value>'}}; or label_scheme='none'",
            )
    return [dict(labels) for labels in found if labels is not None]


def expressions(requirements: Requirements) -> list[dict[str, Any]]:
    """Node-selector ``In`` expressions for one model's labels."""
    return [{"key": key, "operator": "In", "values": list(values)} for key, values in requirements.items()]


def preferred_terms(alternatives: list[Requirements]) -> list[dict[str, Any]]:
    """Preferred node affinity for a fallback list: the first model weighs 100, each next one less (none for one)."""
    if len(alternatives) < 2:
        return []
    n = len(alternatives)
    return [
        {"weight": max(1, 100 * (n - i) // n), "preference": {"matchExpressions": expressions(labels)}}
        for i, labels in enumerate(alternatives)
    ]


def merge_node_selectors(*sources: tuple[str, Mapping[str, str]]) -> dict[str, str]:
    """Unite ``(origin, selector)`` pairs; one key with two values is an error naming both origins."""
    merged: dict[str, str] = {}
    origin_of: dict[str, str] = {}
    for origin, selector in sources:
        for key, value in selector.items():
            if key in merged and merged[key] != value:
                raise InvalidSettingError(
                    "backend 'kubernetes'",
                    "backend_options['node_selector']",
                    {key: value},
                    f"{origin} sets {key}={value!r} but {origin_of[key]} sets {key}={merged[key]!r}; "
                    "no node can have both",
                    "one value per label key (drop one of them, or use accelerator_labels)",
                )
            merged[key] = value
            origin_of.setdefault(key, origin)
    return merged


def node_selector(
    resources: ResourceSettings,
    scheme_name: str,
    explicit: Mapping[str, str] | None,
    *,
    template: Mapping[str, str],
    user: Mapping[str, str],
) -> tuple[dict[str, str], list[list[dict[str, Any]]]]:
    """The pod's nodeSelector and the accelerator's required node-affinity alternatives (ORed, each one ANDed).

    The selector unites the pod template's, the accelerator's (one model with one label value) and ``node_selector``;
    a model with several label values becomes an ``In`` expression; a fallback list becomes one alternative per model
    (the scheduler takes a node of any of them). Asked at DAG parse time (the options' check, with
    ``pod_template_dict``) and when the pod is planned (with the template file too).
    """
    alternatives = accelerator_requirements(resources, scheme_name, explicit)
    derived: dict[str, str] = {}
    if len(alternatives) == 1:
        [required] = alternatives
        derived = {key: values[0] for key, values in required.items() if len(values) == 1}
        alternatives = [{key: values for key, values in required.items() if len(values) > 1}]
    selector = merge_node_selectors(
        ("the pod template", template),
        (f"accelerator={resources.accelerator!r}", derived),
        ("backend_options['node_selector']", user),
    )
    return selector, [expressions(labels) for labels in alternatives if labels]
