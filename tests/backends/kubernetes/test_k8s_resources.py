"""ResourceSettings -> requests/limits, vendor keys, MIG, /dev/shm; every pod built by KubernetesPodOperator and
validated against the official schemas (k8s_manifests.validate)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_manifests import main_container, plan_and_render
from kubernetes.utils import parse_quantity

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import AMD, AWS_NEURON, GOOGLE_TPU, INTEL, NVIDIA, MigProfile, ResourceSettings

VENDOR_KEYS = {
    NVIDIA: "nvidia.com/gpu",
    AMD: "amd.com/gpu",
    INTEL: "gpu.intel.com/i915",
    AWS_NEURON: "aws.amazon.com/neuron",
    GOOGLE_TPU: "google.com/tpu",
}


@pytest.mark.parametrize(("vendor", "key"), VENDOR_KEYS.items(), ids=str)
def test_vendor_resource_key_in_requests_and_limits(vendor, key):
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=2, gpu_vendor=vendor), options={"label_scheme": "none"})
    resources = main_container(pod)["resources"]
    assert resources["limits"] == {key: "2"}
    assert resources["requests"] == {key: "2"}


def test_mig_profile_is_its_own_extended_resource():
    _, [pod] = plan_and_render(ResourceSettings(mig_profile=MigProfile.P1G_10GB, gpu_count=3))
    resources = main_container(pod)["resources"]
    assert resources["limits"] == resources["requests"] == {"nvidia.com/mig-1g.10gb": "3"}
    # MIG nodes carry the ordinary GPU taint
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_cpu_and_memory_requests_equal_limits():
    _, [pod] = plan_and_render(ResourceSettings(cpu_count="500m", memory="16GB"))
    resources = main_container(pod)["resources"]
    assert resources["limits"] == resources["requests"]
    assert resources["limits"]["cpu"] == "500m"
    assert parse_quantity(resources["limits"]["memory"]) == 16 * 10**9
    assert "tolerations" not in pod["spec"] or pod["spec"]["tolerations"] == []


def test_gpu_count_all_is_a_clear_error():
    kubernetes = BACKENDS["kubernetes"]
    with pytest.raises(InvalidSettingError) as err:
        kubernetes.check(ResourceSettings(gpu_count="all"), 1, kubernetes.parse_options({}))
    assert "gpu_count='all'" in str(err.value)
    assert "integer" in str(err.value)


def test_shm_size_is_a_memory_backed_empty_dir_with_a_size_limit():
    _, [pod] = plan_and_render(ResourceSettings(shm_size="8Gi", memory="32Gi"))
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main_container(pod)["volumeMounts"]


def test_no_shm_volume_unless_asked():
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1))
    assert all(v["name"] != "dshm" for v in pod["spec"]["volumes"])


def test_security_defaults_on_every_container():
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), options={"container_security_context": {}})
    for container in pod["spec"]["containers"]:
        assert container["securityContext"]["privileged"] is False
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert not pod["spec"].get("hostNetwork")


def test_security_context_override_merges_over_defaults():
    _, [pod] = plan_and_render(options={"container_security_context": {"runAsNonRoot": True, "runAsUser": 1500}})
    assert main_container(pod)["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "runAsUser": 1500,
        "runAsGroup": 1000,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# ------------------------------------------------------------------ property: any valid settings -> valid pod
resource_settings = st.builds(
    ResourceSettings,
    cpu_count=st.one_of(st.none(), st.integers(1, 256), st.sampled_from([0.25, 0.5, 1.5, "250m", "3"])),
    gpu_count=st.integers(0, 16),
    memory=st.one_of(
        st.none(), st.integers(6 * 2**20, 2**40), st.sampled_from(["512Mi", "16Gi", "16GB", "1.5Gi", "3T"])
    ),
    gpu_vendor=st.sampled_from(list(VENDOR_KEYS)),
    shm_size=st.one_of(st.none(), st.integers(2**20, 2**36), st.sampled_from(["64Mi", "8Gi", "1G"])),
) | st.builds(ResourceSettings, mig_profile=st.sampled_from(list(MigProfile)), gpu_count=st.integers(1, 7))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resource_settings)
def test_any_valid_settings_give_a_schema_valid_pod_whose_limits_match(resources):
    _, [pod] = plan_and_render(resources, options={"label_scheme": "none"})  # validated inside
    limits = main_container(pod)["resources"]["limits"]
    requests = main_container(pod)["resources"]["requests"]
    assert requests == limits
    if resources.cpu_count is None:
        assert "cpu" not in limits
    else:  # rounded up to whole millicores, never below the request
        assert parse_quantity(limits["cpu"]) >= parse_quantity(str(resources.cpu_count))
        assert parse_quantity(limits["cpu"]) - parse_quantity(str(resources.cpu_count)) < parse_quantity("1m")
    if resources.memory is None:
        assert "memory" not in limits
    else:
        assert parse_quantity(limits["memory"]) == resources.memory
    gpu_keys = {k: v for k, v in limits.items() if k not in ("cpu", "memory")}
    if resources.mig_profile:
        assert gpu_keys == {f"nvidia.com/mig-{resources.mig_profile}": str(resources.gpu_count)}
    elif resources.gpu_count:
        assert gpu_keys == {VENDOR_KEYS[resources.gpu_vendor]: str(resources.gpu_count)}
    else:
        assert gpu_keys == {}
    shm = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    if resources.shm_size:
        assert parse_quantity(shm[0]["emptyDir"]["sizeLimit"]) == resources.shm_size
    else:
        assert shm == []
