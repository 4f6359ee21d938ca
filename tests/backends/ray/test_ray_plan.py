"""The Ray backend's parse half and pure plan, without a cluster: options, capability checks, the job's mapping."""

from __future__ import annotations

import json

import pytest

from airflow_gpu_provider import ImageSettings, ResourceSettings
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.ray.capacity import label_matches
from airflow_gpu_provider.backends.ray.connection import client_settings
from airflow_gpu_provider.backends.ray.options import RayOptions, ray_accelerator_type
from airflow_gpu_provider.backends.ray.plan import plan_job
from airflow_gpu_provider.backends.ray.trigger import RayJobTrigger
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

RAY = BACKENDS["ray"]
LABELS = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1", "try_number": "2"}


def _plan(resources: ResourceSettings, image: ImageSettings | None = None, **options) -> object:
    request = TaskRequest(resources, image or ImageSettings(), Envelope.run(["true"]), labels=LABELS)
    return plan_job(request, RayOptions.parse({"address": "http://head:8265", **options}), GpuConfig.read())


def test_options_are_checked_when_the_dag_is_parsed():
    assert RAY.parse_options({"address": "http://head:8265/"}).address == "http://head:8265"
    for bad, field in (
        ({"address": "head:8265"}, "address"),
        ({"label_selector": {"Bad Key!": "x"}}, "label_selector"),
        ({"label_selector": {"zone": "a;b"}}, "label_selector"),
        ({"pending_timeout": -1}, "pending_timeout"),
        ({"ray_conn_id": "ray_default", "address": "http://head:8265"}, "address"),
    ):
        with pytest.raises(InvalidSettingError, match=field):
            RAY.parse_options(bad)
    with pytest.raises(UnknownSettingError, match="namespace"):
        RAY.parse_options({"namespace": "x"})


def test_a_share_of_a_gpu_runs_on_ray_local_docker_and_slurm_only():
    half = ResourceSettings(gpu_count=0.5)
    assert half.gpu_count == 0.5 and ResourceSettings(gpu_count="0.25").gpu_count == 0.25
    for name in ("ray", "local", "docker", "slurm"):
        BACKENDS[name].check(half, 1, BACKENDS[name].parse_options({}))
    for name in ("kubernetes", "executor"):
        with pytest.raises(
            InvalidSettingError, match=r"gpu_count=0.5.*a share of one works on the local, docker, ray, slu"
        ):
            BACKENDS[name].check(half, 1, BACKENDS[name].parse_options({}))
    for bad in (1.5, 0.00001, "1.5"):
        with pytest.raises(InvalidSettingError, match="gpu_count"):
            ResourceSettings(gpu_count=bad)


def test_what_ray_cannot_run_is_refused_at_parse():
    with pytest.raises(InvalidSettingError, match="MIG slices"):
        RAY.check(ResourceSettings(mig_profile="1g.10gb"), 1, RAY.parse_options({}))
    with pytest.raises(InvalidSettingError, match="credentials"):
        RAY.check(None, 1, RAY.parse_options({}), ImageSettings(index_url="https://u:secret@pypi.example/simple"))
    with pytest.raises(InvalidSettingError, match="label_selector"):
        options = RAY.parse_options({"label_selector": {"ray.io/accelerator-type": "A100"}})
        RAY.check(ResourceSettings(accelerator="H100"), 1, options)
    RAY.check(ResourceSettings(gpu_count=2), 4, RAY.parse_options({}))  # several machines


def test_resources_become_the_entrypoints():
    plan = _plan(ResourceSettings(gpu_count=0.5, cpu_count=2, memory="1Gi"))
    assert plan.submit == {"entrypoint_num_cpus": 2.0, "entrypoint_num_gpus": 0.5, "entrypoint_memory": 2**30}
    assert plan.entrypoint == "python airflow_gpu_ray_reaper.py runtime.pyz envelope.json -"
    assert plan.metadata == {**LABELS, "airflow_gpu_provider": "true"}
    assert plan.runtime_env["env_vars"]["OMP_NUM_THREADS"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in plan.runtime_env["env_vars"]  # Ray sets it for the GPUs it gives
    cpu = _plan(ResourceSettings(cpu_count=1), ImageSettings(environment={"CUDA_VISIBLE_DEVICES": "0", "A": "b"}))
    assert cpu.runtime_env["env_vars"]["CUDA_VISIBLE_DEVICES"] == ""
    # the task's own variables (credentials, often) are in no runtime_env: the reaper sets them (issue 34, H4)
    assert cpu.environment == {"A": "b"} and "A" not in cpu.runtime_env["env_vars"]
    neuron = _plan(ResourceSettings(gpu_count=2, gpu_vendor="aws-neuron"))
    assert neuron.submit == {"entrypoint_resources": {"neuron_cores": 2.0}}


def test_models_become_a_label_selector_and_requirements_the_runtime_env():
    assert ray_accelerator_type("A100-80GB") == "A100" and ray_accelerator_type("rtx-pro-6000") == "RTX-PRO-6000"
    plan = _plan(
        ResourceSettings(accelerator=["H100", "A100-80GB", "A100-40GB"]),
        ImageSettings(requirements=["six==1.16.0"], index_url="https://mirror.example/simple"),
        label_selector={"zone": "!in(a,b)"},
    )
    selector = {"zone": "!in(a,b)", "ray.io/accelerator-type": "in(H100,A100)"}
    assert plan.submit == {"entrypoint_num_gpus": 1, "entrypoint_label_selector": selector}
    assert plan.runtime_env["uv"] == {
        "packages": ["six==1.16.0"],
        "uv_pip_install_options": ["--index-url", "https://mirror.example/simple"],
    }
    pip = _plan(ResourceSettings(), ImageSettings(requirements=["six"], python_package_installer="pip"))
    assert pip.runtime_env["pip"] == {"packages": ["six"], "pip_install_options": []}
    assert label_matches({"zone": "c", "ray.io/accelerator-type": "A100"}, selector)
    assert not label_matches({"zone": "a", "ray.io/accelerator-type": "A100"}, selector)


def test_missing_gpus_and_several_machines():
    fallback = _plan(ResourceSettings(gpu_count=1), pending_timeout=30).cpu_fallback
    assert fallback is None  # on_missing_gpu="fail" (the request's default)
    request = TaskRequest(
        ResourceSettings(gpu_count=2, cpu_count=4), ImageSettings(), Envelope.run(["true"]), on_missing_gpu="cpu"
    )
    plan = plan_job(request, RayOptions(), GpuConfig.read())
    assert plan.cpu_fallback is not None and plan.cpu_fallback.on_cpu
    assert plan.cpu_fallback.submit == {"entrypoint_num_cpus": 4.0} and plan.pending_timeout == 300
    nodes = plan_job(TaskRequest(**{**request.__dict__, "num_nodes": 2}), RayOptions(), GpuConfig.read())
    assert nodes.entrypoint == "python airflow_gpu_ray_nodes.py nodes.json" and nodes.submit == {
        "entrypoint_num_cpus": 0
    }
    assert nodes.nodes is not None and nodes.nodes["bundle"] == {"CPU": 4.0, "GPU": 2}
    assert nodes.nodes["num_nodes"] == 2


def test_the_cluster_comes_from_the_options_a_connection_or_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    assert client_settings(None, "http://head:8265") == ("http://head:8265", {"headers": {}})
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-cli")  # an address takes the token where Ray's CLI finds it
    assert client_settings(None, "http://head:8265")[1] == {"headers": {"Authorization": "Bearer from-the-cli"}}
    extra = {"address": "https://ray.example:443", "headers": json.dumps({"Authorization": "Bearer t"}), "verify": "0"}
    monkeypatch.setenv("AIRFLOW_CONN_MY_RAY", json.dumps({"conn_type": "ray", "extra": extra}))
    address, settings = client_settings("my_ray", None)
    assert address == "https://ray.example:443"
    assert settings == {"headers": {"Authorization": "Bearer t"}, "cookies": {}, "verify": False}
    connection = {"conn_type": "ray", "host": "head", "password": "the-token"}  # the connection carries the token
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(connection))
    address, settings = client_settings(None, None)
    assert address == "http://head:8265" and settings["headers"] == {"Authorization": "Bearer the-token"}


def test_the_trigger_serialises_what_the_triggerer_needs():
    trigger = RayJobTrigger("airflow-gpu-x", {"ray_conn_id": "ray_default", "address": None}, 0.5, 1e12, 2e12)
    path, arguments = trigger.serialize()
    assert path == "airflow_gpu_provider.backends.ray.trigger.RayJobTrigger"
    assert json.loads(json.dumps(arguments)) == arguments
    assert RayJobTrigger(**arguments).serialize() == (path, arguments)
