"""Accelerator model -> node labels under each label scheme; the GPU toleration; merges with user settings."""

from __future__ import annotations

import pytest
from k8s_manifests import plan_and_render

from airflow_gpu_provider.backends.pods.node_labels import LABEL_SCHEMES, accelerator_requirements
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _required_expressions(pod):
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"]


@pytest.mark.parametrize(
    ("scheme", "accelerator", "selector"),
    [
        ("nvidia-gfd", "L4", {"nvidia.com/gpu.product": "NVIDIA-L4"}),
        ("nvidia-gfd", "T4", {"nvidia.com/gpu.product": "Tesla-T4"}),
        ("gke", "A100-80GB", {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}),
        ("gke", "L4:2", {"cloud.google.com/gke-accelerator": "nvidia-l4"}),
        ("gke", "TPU-V5E", {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}),
        ("eks", "A10G", {"k8s.amazonaws.com/accelerator": "nvidia-a10g"}),
        ("karpenter", "h100", {"karpenter.k8s.aws/instance-gpu-name": "h100"}),
        (
            "karpenter",
            "H100-80GB",
            {"karpenter.k8s.aws/instance-gpu-name": "h100", "karpenter.k8s.aws/instance-gpu-memory": "81920"},
        ),
        ("karpenter", "TRAINIUM", {"karpenter.k8s.aws/instance-accelerator-name": "trainium"}),
    ],
)
def test_single_valued_model_becomes_a_node_selector(scheme, accelerator, selector):
    _, [pod] = plan_and_render(ResourceSettings(accelerator=accelerator), options={"label_scheme": scheme})
    assert pod["spec"]["nodeSelector"] == selector
    assert not pod["spec"].get("affinity")


def test_model_with_several_products_becomes_a_required_in_expression():
    _, [pod] = plan_and_render(ResourceSettings(accelerator="A100:2"))
    [term] = _required_expressions(pod)
    assert term["matchExpressions"] == [
        {
            "key": "nvidia.com/gpu.product",
            "operator": "In",
            "values": [
                "NVIDIA-A100-SXM4-40GB",
                "NVIDIA-A100-PCIE-40GB",
                "NVIDIA-A100-SXM4-80GB",
                "NVIDIA-A100-80GB-PCIe",
            ],
        }
    ]
    assert pod["spec"]["nodeSelector"] == {}


def test_accelerator_vendor_follows_the_model():
    _, [pod] = plan_and_render(ResourceSettings(accelerator="TRAINIUM:4"), options={"label_scheme": "karpenter"})
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"aws.amazon.com/neuron": "4"}
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_unknown_model_names_scheme_and_escape_hatches():
    with pytest.raises(InvalidSettingError) as err:
        accelerator_requirements(ResourceSettings(accelerator="RTX-4090"), "gke", None)
    message = str(err.value)
    assert "accelerator='RTX-4090'" in message
    assert "'gke'" in message
    assert "accelerator_labels" in message
    assert "A100-80GB" in message


def test_accelerator_labels_replace_the_scheme_lookup():
    _, [pod] = plan_and_render(
        ResourceSettings(accelerator="RTX-4090"), options={"accelerator_labels": {"example.com/gpu": "rtx-4090"}}
    )
    assert pod["spec"]["nodeSelector"] == {"example.com/gpu": "rtx-4090"}


def test_scheme_none_selects_by_resource_only():
    _, [pod] = plan_and_render(ResourceSettings(accelerator="H100"), options={"label_scheme": "none"})
    assert pod["spec"]["nodeSelector"] == {}
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]


def test_every_scheme_table_value_is_a_valid_label_value():
    for scheme in LABEL_SCHEMES.values():
        for model, requirements in scheme.models.items():
            _, [pod] = plan_and_render(ResourceSettings(accelerator=model), options={"label_scheme": scheme.name})
            selected = {k: (v,) for k, v in pod["spec"]["nodeSelector"].items()}
            for term in (
                (pod["spec"].get("affinity") or {})
                .get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []})["nodeSelectorTerms"]
            ):
                selected.update({e["key"]: tuple(e["values"]) for e in term["matchExpressions"]})
            assert selected == dict(requirements), (scheme.name, model)


def test_gpu_toleration_can_be_switched_off_and_user_tolerations_are_added():
    spot = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), options={"tolerations": [spot]})
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION, spot]
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), options={"gpu_toleration": False, "tolerations": [spot]})
    assert pod["spec"]["tolerations"] == [spot]


def test_duplicate_tolerations_are_dropped():
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), options={"tolerations": [GPU_TOLERATION]})
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]


def test_user_node_selector_merges_with_the_accelerator_labels():
    _, [pod] = plan_and_render(
        ResourceSettings(accelerator="L4"), options={"label_scheme": "gke", "node_selector": {"pool": "gpu"}}
    )
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4", "pool": "gpu"}


def test_conflicting_node_selector_is_an_error_naming_both_sources():
    with pytest.raises(InvalidSettingError) as err:
        plan_and_render(
            ResourceSettings(accelerator="L4"),
            options={"label_scheme": "gke", "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}},
        )
    assert "accelerator='L4'" in str(err.value)
    assert "backend_options['node_selector']" in str(err.value)


def test_user_affinity_terms_each_get_the_accelerator_expression():
    zone_a = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
    zone_b = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone_a, zone_b]}},
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}},
                }
            ]
        },
    }
    _, [pod] = plan_and_render(ResourceSettings(accelerator="H100"), options={"affinity": affinity})
    terms = _required_expressions(pod)
    assert len(terms) == 2
    for term, zone in zip(terms, "ab", strict=True):
        assert term["matchExpressions"][0]["values"] == [zone]
        assert term["matchExpressions"][1]["key"] == "nvidia.com/gpu.product"
    assert "podAntiAffinity" in pod["spec"]["affinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0] == zone_a


def test_pod_template_fields_merge_with_the_provider_fields(tmp_path):
    template = tmp_path / "pod.yaml"
    template.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {team: vision}\n  annotations: {owner: ada}\n"
        "spec:\n  nodeSelector: {pool: gpu}\n  tolerations:\n  - {key: spot, operator: Exists}\n"
        "  priorityClassName: batch\n  containers:\n  - name: base\n    env:\n    - {name: FROM_TEMPLATE, value: '1'}\n"
    )
    _, [pod] = plan_and_render(
        ResourceSettings(accelerator="L4"),
        options={"pod_template_file": str(template), "label_scheme": "gke", "labels": {"cost": "ml"}},
    )
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu", "cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert spec["tolerations"] == [GPU_TOLERATION, {"key": "spot", "operator": "Exists"}]
    assert spec["priorityClassName"] == "batch"
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["cost"] == "ml"
    assert pod["metadata"]["annotations"]["owner"] == "ada"
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert {"FROM_TEMPLATE", "AIRFLOW_GPU_ENVELOPE"} <= env


def test_pod_template_file_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(InvalidSettingError, match="no such file"):
        plan_and_render(options={"pod_template_file": str(tmp_path / "missing.yaml")})


def test_user_labels_annotations_and_pod_settings_reach_the_pod():
    _, [pod] = plan_and_render(
        ResourceSettings(gpu_count=1),
        options={
            "labels": {"team": "vision"},
            "annotations": {"example.com/ticket": "ML-42"},
            "service_account_name": "trainer",
            "image_pull_secrets": ["regcred"],
            "priority_class_name": "gpu-high",
            "runtime_class_name": "nvidia",
        },
    )
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "airflow-gpu-provider"
    assert pod["metadata"]["annotations"]["example.com/ticket"] == "ML-42"
    assert pod["metadata"]["annotations"]["airflow-gpu-provider/resources"] == "1x nvidia GPU"
    assert pod["metadata"]["namespace"] == "ml"
    spec = pod["spec"]
    assert (spec["serviceAccountName"], spec["priorityClassName"], spec["runtimeClassName"]) == (
        "trainer",
        "gpu-high",
        "nvidia",
    )
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
