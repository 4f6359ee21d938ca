"""backend_options of the Kubernetes backend: one good and one bad value per option, checked at DAG parse time."""

from __future__ import annotations

import pytest

from airflow_gpu_provider.backends.kubernetes.options import KubernetesOptions
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError

GOOD = {
    "kubernetes_conn_id": "gke_prod",
    "namespace": "ml-training",
    "in_cluster": True,
    "cluster_context": "prod",
    "config_file": "/etc/kube/config",
    "label_scheme": "gke",
    "accelerator_labels": {"example.com/gpu": "a100-80"},
    "node_selector": {"team": "vision"},
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "gpu_toleration": False,
    "affinity": {"nodeAffinity": {}},
    "pod_template_file": "/opt/pod.yaml",
    "pod_template_dict": {"spec": {}},
    "labels": {"team": "vision"},
    "annotations": {"example.com/owner": "Ada Lovelace <ada@example.com>"},
    "service_account_name": "trainer",
    "image_pull_secrets": ["regcred", "other"],
    "image_pull_policy": "IfNotPresent",
    "priority_class_name": "gpu-high",
    "runtime_class_name": "nvidia",
    "container_security_context": {"runAsNonRoot": True},
    "pod_security": "baseline",
    "run_as_user": 2000,
    "requirements_mode": "init-container",
    "index_secret": "pypi-credentials",
    "derived_image": "registry.example.com/train:abc",
    "installer_image": "python:3.11",
    "pending_timeout": 120,
    "startup_timeout": 600.5,
    "termination_grace_period": 30,
    "checkpoint_claim": "training-checkpoints",
    "on_finish_action": "keep_pod",
    "kueue_queue": "team-a",
    "kueue_priority_class": "gpu-high",
    "gpu_allocation": "dra",
}
BAD = {
    "kubernetes_conn_id": "",
    "namespace": "ML_Training",
    "in_cluster": "yes",
    "cluster_context": 3,
    "config_file": 1,
    "label_scheme": "aks",
    "accelerator_labels": {"example.com/gpu": "a100 80"},
    "node_selector": {"bad key!": "x"},
    "tolerations": [{"key": "spot", "operator": "Matches"}],
    "gpu_toleration": 1,
    "affinity": ["nodeAffinity"],
    "pod_template_file": "",
    "pod_template_dict": "spec: {}",
    "labels": {"team": 7},
    "annotations": ["owner"],
    "service_account_name": "Trainer",
    "image_pull_secrets": ["reg cred"],
    "image_pull_policy": "always",
    "priority_class_name": "GPU",
    "runtime_class_name": "nvidia runtime",
    "container_security_context": "privileged",
    "pod_security": "unrestricted",
    "run_as_user": 0,
    "requirements_mode": "venv",
    "index_secret": "PyPI Credentials",
    "derived_image": 5,
    "installer_image": "",
    "pending_timeout": 0,
    "startup_timeout": -1,
    "termination_grace_period": 1.5,
    "checkpoint_claim": "Checkpoints_PVC",
    "on_finish_action": "delete",
    "kueue_queue": "Team_A",
    "kueue_priority_class": "a" * 64,
    "gpu_allocation": "DRA",
}


def test_every_option_has_a_good_and_a_bad_case():
    assert set(GOOD) == set(BAD) == KubernetesOptions.names()


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_value_is_kept(name):
    options = KubernetesOptions.parse({name: GOOD[name]})
    value = getattr(options, name)
    assert value == (tuple(GOOD[name]) if isinstance(GOOD[name], list) and name != "affinity" else GOOD[name])


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_value_names_option_value_and_accepted_forms(name):
    with pytest.raises(InvalidSettingError) as err:
        KubernetesOptions.parse({name: BAD[name]})
    message = str(err.value)
    assert f"backend_options[{name!r}]" in message
    assert "Accepted:" in message


def test_unknown_option_lists_the_supported_ones():
    with pytest.raises(UnknownSettingError) as err:
        KubernetesOptions.parse({"namepsace": "ml"})
    assert "'namepsace'" in str(err.value)
    assert "namespace" in str(err.value)
    assert "pending_timeout" in str(err.value)


def test_none_keeps_the_default():
    assert KubernetesOptions.parse({"namespace": None, "label_scheme": None}) == KubernetesOptions()


def test_image_pull_secrets_accepts_comma_separated_string():
    assert KubernetesOptions.parse({"image_pull_secrets": "a,b"}).image_pull_secrets == ("a", "b")


def test_template_file_and_dict_are_exclusive():
    with pytest.raises(InvalidSettingError, match="not both"):
        KubernetesOptions.parse({"pod_template_file": "/x.yaml", "pod_template_dict": {}})


def test_image_mode_needs_the_derived_image():
    with pytest.raises(InvalidSettingError, match="derived_image"):
        KubernetesOptions.parse({"requirements_mode": "image"})
    assert KubernetesOptions.parse({"requirements_mode": "image", "derived_image": "r/x:1"}).derived_image == "r/x:1"
