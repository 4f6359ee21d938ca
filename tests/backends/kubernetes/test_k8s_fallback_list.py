"""A fallback list on Kubernetes with the device plugin: required node affinity to any listed model, preferred
affinity weighted in the list's order. Every pod passes kubernetes-validate (strict) and the restricted profile."""

from __future__ import annotations

import pytest
from k8s_manifests import plan_and_render

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings


def _node_affinity(pod):
    return pod["spec"]["affinity"]["nodeAffinity"]


def test_any_listed_model_is_required_and_the_first_is_preferred_most():
    _, [pod] = plan_and_render(ResourceSettings(accelerator=["H100", "A100-80GB"]), options={"label_scheme": "gke"})
    node = _node_affinity(pod)
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    h100 = {
        "key": "cloud.google.com/gke-accelerator",
        "operator": "In",
        "values": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
    }
    a100 = {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-a100-80gb"]}
    assert terms == [{"matchExpressions": [h100]}, {"matchExpressions": [a100]}]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": {"matchExpressions": [h100]}},
        {"weight": 50, "preference": {"matchExpressions": [a100]}},
    ]
    assert "nodeSelector" not in pod["spec"] or "cloud.google.com/gke-accelerator" not in pod["spec"]["nodeSelector"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_models_with_several_labels_are_alternatives_anded_into_every_user_term():
    """Karpenter names an A100-80GB by two labels: each model is one term, crossed with the user's own terms."""
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]}}}  # fmt: skip
    _, [pod] = plan_and_render(
        ResourceSettings(accelerator=["A100-80GB", "H100", "L4"]),
        options={"label_scheme": "karpenter", "affinity": user},
    )
    node = _node_affinity(pod)
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 6  # 2 user terms x 3 models
    a100_in_zone_a = terms[0]["matchExpressions"]
    assert a100_in_zone_a == [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a100"]},
        {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "In", "values": ["81920"]},
    ]
    assert [p["weight"] for p in node["preferredDuringSchedulingIgnoredDuringExecution"]] == [100, 66, 33]


def test_a_single_model_renders_as_before():
    _, [pod] = plan_and_render(ResourceSettings(accelerator="L4"), options={"label_scheme": "gke"})
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in (pod["spec"].get("affinity") or {}).get(
        "nodeAffinity", {}
    )


def test_a_model_the_label_scheme_lacks_is_refused_at_parse():
    from airflow_gpu_provider import GpuStepOperator

    with pytest.raises(InvalidSettingError, match="accelerator='RTX-4090'.*label scheme 'gke'"):
        GpuStepOperator(
            task_id="t", command=["true"], backend="kubernetes", accelerator=["L4", "RTX-4090"],
            backend_options={"label_scheme": "gke"},
        )  # fmt: skip


def test_a_multi_node_job_carries_the_lists_affinity_and_validates():
    """The Indexed Job (and its Service) of a multi-node launch: every pod may take any listed model."""
    import dataclasses

    from k8s_manifests import validate

    from airflow_gpu_provider.backends.kubernetes.multinode_run import multinode_manifests

    plan, _ = plan_and_render(ResourceSettings(accelerator=["H100", "A100-80GB"], gpu_count=8))
    _, service, job = multinode_manifests(dataclasses.replace(plan, num_nodes=2))
    validate(service)
    validate(job)
    node = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert len(node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]) == 2
    assert [p["weight"] for p in node["preferredDuringSchedulingIgnoredDuringExecution"]] == [100, 50]
