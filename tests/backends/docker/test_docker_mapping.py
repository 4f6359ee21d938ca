"""The Docker mapping and plan: pure functions, no engine needed."""

from __future__ import annotations

import os
import sys

import pytest

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.container import NVIDIA_ULIMITS, map_resources
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.plan import COMMAND
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.settings import GpuVendor, ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

GiB = 1024**3


def mapped(default_shm: int = 8 * GiB, **resources):
    return map_resources(ResourceSettings(**resources), shm_size=default_shm)


def test_gpu_count_becomes_a_device_request_with_nvidia_ulimits():
    result = mapped(gpu_count=2)
    assert result.host_config["device_requests"] == [{"driver": "", "capabilities": [["gpu"]], "count": 2}]
    assert result.host_config["ulimits"] == [dict(u) for u in NVIDIA_ULIMITS]
    assert {u["name"]: u["soft"] for u in result.host_config["ulimits"]} == {"memlock": -1, "stack": 67108864}
    assert result.environment["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "NVIDIA_VISIBLE_DEVICES" not in result.environment  # the engine sets it from the request
    assert result.host_config["privileged"] is False


def test_all_gpus_is_count_minus_one():
    assert mapped(gpu_count="all").host_config["device_requests"][0]["count"] == -1


def test_device_ids_replace_the_count_and_are_cut_to_it():
    result = map_resources(ResourceSettings(gpu_count=1), shm_size=GiB, device_ids=["GPU-abc", "GPU-def"])
    assert result.host_config["device_requests"] == [
        {"driver": "", "capabilities": [["gpu"]], "device_ids": ["GPU-abc"]}
    ]


def test_too_few_device_ids_is_an_error():
    with pytest.raises(InvalidSettingError, match="fewer device ids than gpu_count=3"):
        map_resources(ResourceSettings(gpu_count=3), shm_size=GiB, device_ids=["0"])


def test_mig_needs_device_ids():
    with pytest.raises(InvalidSettingError, match="MIG"):
        mapped(mig_profile="1g.10gb")
    result = map_resources(ResourceSettings(mig_profile="1g.10gb"), shm_size=GiB, device_ids=["MIG-1234"])
    assert result.host_config["device_requests"][0]["device_ids"] == ["MIG-1234"]


def test_cpu_task_gets_no_gpu_and_void_visible_devices():
    result = mapped(cpu_count=2)
    assert "device_requests" not in result.host_config
    assert "ulimits" not in result.host_config
    assert result.environment["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_cpu_and_memory():
    result = mapped(cpu_count=1.5, memory="4Gi")
    assert result.host_config["nano_cpus"] == 1_500_000_000
    assert result.host_config["mem_limit"] == 4 * GiB
    assert result.host_config["memswap_limit"] == 4 * GiB
    assert result.environment["OMP_NUM_THREADS"] == "2"


def test_shm_default_is_large_configurable_and_capped_by_memory():
    assert mapped().host_config["shm_size"] == 8 * GiB  # Docker's own default is 64 MB
    assert mapped(default_shm=GiB).host_config["shm_size"] == GiB
    assert mapped(shm_size="3Gi").host_config["shm_size"] == 3 * GiB
    assert mapped(memory="2Gi").host_config["shm_size"] == 2 * GiB
    assert mapped(memory="2Gi", shm_size="4Gi").host_config["shm_size"] == 4 * GiB  # explicit wins


def test_ipc_host_sets_no_shm_size():
    result = map_resources(ResourceSettings(gpu_count=1), shm_size=GiB, ipc_mode="host")
    assert result.host_config["ipc_mode"] == "host"
    assert "shm_size" not in result.host_config


def test_amd_gets_kfd_and_dri_devices_and_groups():
    result = map_resources(ResourceSettings(gpu_count=2, gpu_vendor="amd"), shm_size=GiB, device_groups=["44", "108"])
    assert result.host_config["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert result.host_config["group_add"] == ["44", "108"]  # the host's video and render gids
    assert result.environment["ROCR_VISIBLE_DEVICES"] == "0,1"
    assert "device_requests" not in result.host_config
    assert result.host_config["privileged"] is False


def test_group_add_is_added_to_the_device_groups_and_kept_for_every_task():
    amd = ResourceSettings(gpu_count=1, gpu_vendor="amd")
    result = map_resources(amd, shm_size=GiB, group_add=["44", "1234"], device_groups=["44", "108"])
    assert result.host_config["group_add"] == ["44", "108", "1234"]
    for resources in (ResourceSettings(gpu_count=1), ResourceSettings()):  # NVIDIA and CPU tasks keep theirs too
        assert map_resources(resources, shm_size=GiB, group_add=["1234"]).host_config["group_add"] == ["1234"]


def test_intel_gets_dri():
    result = mapped(gpu_count="all", gpu_vendor="intel")
    assert result.host_config["devices"] == ["/dev/dri:/dev/dri:rwm"]
    assert "ZE_AFFINITY_MASK" not in result.environment


def test_unsupported_vendor_is_an_error_naming_the_supported_ones():
    with pytest.raises(InvalidSettingError, match="nvidia, amd, intel"):
        mapped(gpu_count=1, gpu_vendor="aws-neuron")
    with pytest.raises(InvalidSettingError):
        mapped(gpu_count=1, gpu_vendor=GpuVendor("acme", "acme.com/gpu", "ACME_VISIBLE"))


def test_accelerator_model_is_noted_not_silently_dropped():
    assert "A100" in mapped(accelerator="A100").notes[0]


# ---------------------------------------------------------------------- plan
def plan_for(options=None, parent_image="airflow-gpu-base:bookworm", **resources):
    request = TaskRequest(
        ResourceSettings(**resources),
        ImageSettings(parent_image=parent_image, environment={"OMP_NUM_THREADS": "7"}),
        Envelope.run(["true"]),
        "cpu",
        {"dag_id": "d", "task_id": "t", "run_id": "r", "try_number": "1", "map_index": "-1"},
    )
    return BACKENDS["docker"].create(options).plan(request, GpuConfig.read())


def test_plan_holds_the_create_arguments(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "1000:1000")
    plan = plan_for({"network_mode": "none", "user": "1000:1000"}, gpu_count=1, cpu_count=2, memory="1Gi")
    kwargs = plan.create_kwargs("img:1")
    assert kwargs["image"] == "img:1"
    assert kwargs["command"] == COMMAND
    assert kwargs["user"] == "1000:1000"
    assert kwargs["labels"]["airflow-gpu-provider.task_id"] == "t"
    assert kwargs["environment"]["OMP_NUM_THREADS"] == "7"  # the image's environment wins
    assert kwargs["host_config"]["network_mode"] == "none"
    assert kwargs["host_config"]["device_requests"][0]["count"] == 1
    assert kwargs["host_config"]["mem_limit"] == GiB
    fallback = plan.create_kwargs("img:1", cpu_fallback=True)
    assert "device_requests" not in fallback["host_config"]
    assert fallback["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert fallback["host_config"]["mem_limit"] == GiB


def test_the_shm_size_and_parent_image_defaults_are_the_docker_connections_and_the_old_options_warn(monkeypatch):
    """Issue 37: ``[gpu] shm_size`` and ``default_parent_image`` became the connection's extras (else built in)."""
    import json

    from airflow.exceptions import AirflowProviderDeprecationWarning

    from airflow_gpu_provider.settings.image import DEFAULT_PARENT_IMAGE

    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(["true"]))
    plan = DockerBackend(DockerOptions()).plan(request, GpuConfig.read())  # no docker_default connection
    assert (plan.parent_image, plan.create_kwargs("x")["host_config"]["shm_size"]) == (DEFAULT_PARENT_IMAGE, 8 * GiB)
    extra = {"shm_size": "2Gi", "parent_image": "nvcr.io/nvidia/pytorch:24.10-py3"}
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_ENGINE", json.dumps({"conn_type": "docker", "extra": extra}))
    plan = plan_for({"docker_conn_id": "team_engine"}, parent_image=None)
    assert (plan.parent_image, plan.create_kwargs("x")["host_config"]["shm_size"]) == (extra["parent_image"], 2 * GiB)
    assert plan_for({"docker_conn_id": "team_engine"}, memory="1Gi").resources.host_config["shm_size"] == GiB
    monkeypatch.setenv("AIRFLOW__GPU__SHM_SIZE", "3Gi")
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Docker connection's extra shm_size"):
        assert plan_for().create_kwargs("x")["host_config"]["shm_size"] == 3 * GiB
    monkeypatch.setenv("AIRFLOW__GPU__DEFAULT_PARENT_IMAGE", "old/image:1")
    with pytest.warns(AirflowProviderDeprecationWarning, match="Docker or Kubernetes connection's extra parent_image"):
        assert plan_for(parent_image=None).parent_image == "old/image:1"


@pytest.mark.parametrize(
    ("extra", "accepted"),
    [
        ({"shm_size": "lots"}, "an amount of bytes such as 16Gi"),
        ({"parent_image": "Not An Image"}, "[registry/]name[:tag]"),
        ({"image_registry": "https://registry.example.com"}, "a registry host and namespace"),
        ({"ca_bundle": "certs/ca.pem"}, "an absolute path of a PEM file"),
    ],
)
def test_a_bad_docker_connection_extra_is_refused_naming_the_connection_field_value_and_forms(
    monkeypatch, extra, accepted
):
    import json

    monkeypatch.setenv("AIRFLOW_CONN_TEAM_ENGINE", json.dumps({"conn_type": "docker", "extra": extra}))
    [(name, value)] = extra.items()
    with pytest.raises(InvalidSettingError) as raised:
        plan_for({"docker_conn_id": "team_engine"})
    assert f"the Docker connection 'team_engine': extra {name}={value!r} is invalid" in str(raised.value)
    assert accepted in str(raised.value)


def test_the_registry_of_derived_images_is_the_docker_connections_and_the_old_option_warns(monkeypatch):
    """An engine fact lives in its connection (issue 37); ``backend_options['registry']`` still overrides it."""
    import json

    from airflow.exceptions import AirflowProviderDeprecationWarning

    extra = {
        "conn_type": "docker",
        "host": "registry.example.com",
        "extra": {"image_registry": "registry.example.com/ml"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_ENGINE", json.dumps(extra))
    assert plan_for({"docker_conn_id": "team_engine"}).build.registry == "registry.example.com/ml"
    assert plan_for({"docker_conn_id": "team_engine", "registry": "other:5000"}).build.registry == "other:5000"
    assert plan_for().build.registry is None  # no docker_default connection: no registry
    monkeypatch.setenv("AIRFLOW__GPU__IMAGE_REGISTRY", "old.example.com/ml")
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Docker connection's extra image_registry"):
        assert plan_for().build.registry == "old.example.com/ml"


def test_the_ca_bundle_of_derived_image_builds_is_the_docker_connections_and_always_allowed(monkeypatch):
    """The admin's CA (the connection's extra) is used where a task names none, and allowed as it is."""
    import json

    from airflow.exceptions import AirflowProviderDeprecationWarning

    ca = "/etc/ssl/certs/ca-certificates.crt"
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_ENGINE", json.dumps({"conn_type": "docker", "extra": {"ca_bundle": ca}}))
    build = plan_for({"docker_conn_id": "team_engine"}).build
    assert (build.ca_bundle, build.policy.ca_bundle) == (ca, ca)
    assert plan_for().build.ca_bundle is None  # no docker_default connection: none
    monkeypatch.setenv("AIRFLOW__GPU__CA_BUNDLE", ca)
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Docker connection's extra ca_bundle"):
        assert plan_for().build.ca_bundle == ca


def test_cpu_task_has_no_fallback():
    assert plan_for().fallback is None


# ---------------------------------------------------------------------- options
def test_docker_backend_is_registered():
    assert BACKENDS["docker"].backend_class() is DockerBackend


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"auto_remove": "sometimes"}, "'force' or 'success' or 'never'"),
        ({"pull": "maybe"}, "'missing' or 'always' or 'never'"),
        ({"mounts": [{"source": "/data", "target": "relative"}]}, "absolute path"),
        ({"mounts": [{"source": "/data", "target": "/data", "type": "nfs"}]}, "unknown mount type"),
        ({"devices": "0,1"}, "expected a non-empty list"),
        ({"stop_timeout": -1}, "positive number"),
        ({"uv_source": "conda"}, "'worker' or 'pip'"),
    ],
)
def test_bad_option_values_fail_at_parse_time(options, message):
    with pytest.raises(InvalidSettingError, match=message) as excinfo:
        DockerOptions.parse(options)
    assert excinfo.value.field == f"backend_options[{next(iter(options))!r}]"


def test_unknown_option_lists_the_supported_ones():
    with pytest.raises(UnknownSettingError, match="privileged") as excinfo:
        DockerOptions.parse({"privileged": True})
    assert "docker_conn_id" in str(excinfo.value)


def test_good_options_pass():
    DockerOptions.parse(
        {
            "docker_conn_id": "docker_default",
            "docker_url": "tcp://gpu-host:2376",
            "mounts": [
                {"source": "/srv/data", "target": "/data", "read_only": True},
                {"target": "/scratch", "type": "tmpfs"},
            ],
            "devices": ["0", 1],
            "auto_remove": "success",
            "ipc_mode": "host",
        }
    )


def test_operator_checks_docker_options_when_the_dag_is_parsed():
    from airflow_gpu_provider import GpuStepOperator

    with pytest.raises(InvalidSettingError, match=r"no task may see.*allowed_mount_roots"):
        GpuStepOperator(
            task_id="t",
            command=["true"],
            backend="docker",
            backend_options={"mounts": [{"source": "/var/run/docker.sock", "target": "/sock"}]},
        )


def test_parsing_a_docker_task_does_not_import_docker():
    """DAG parsing checks the options (the backend's options half) and never loads docker-py."""
    import subprocess

    code = (
        "import sys; from airflow_gpu_provider import GpuStepOperator; "
        "GpuStepOperator(task_id='t', command=['true'], backend='docker', gpu_count=1, "
        "backend_options={'mounts': [{'source': '/data', 'target': '/data'}]}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'docker' "
        "or m.startswith('airflow_gpu_provider.backends.docker.') and not m.endswith('.options')))"
    )
    environment = {**os.environ, "AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS": "/data:rw"}  # the deployment allows it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment)
    out = out.stdout
    assert out.strip() == "[]"
