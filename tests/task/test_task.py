"""What every backend shares, decided once in ``task/``: each backend's plan carries the same decision."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import RemoteTaskError
from airflow_gpu_provider.launchers.accelerate import launch_section
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope, summary
from airflow_gpu_provider.task.environment import (
    gpu_free_environment,
    lock_holder,
    thread_environment,
    visible_devices,
)
from airflow_gpu_provider.task.missing_gpu import POLICIES
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import result_value

LABELS = {"dag_id": "d", "task_id": "t", "run_id": "r1", "try_number": "1", "map_index": "3"}


def request(resources: ResourceSettings, policy: str = "fail") -> TaskRequest:
    return TaskRequest(resources, ImageSettings(), Envelope.run(["true"]), policy, LABELS)  # type: ignore[arg-type]


def environments(resources: ResourceSettings, launch: dict | None = None) -> dict[str, dict[str, str]]:
    """The task process's environment as each backend plans it (no engine, no cluster)."""
    req = request(resources)
    if launch is not None:
        req = dataclasses.replace(req, envelope=req.envelope.launched(launch))
    local = BACKENDS["local"].create().plan(req, GpuConfig.read()).environment
    docker = BACKENDS["docker"].create().plan(req, GpuConfig.read()).create_kwargs("img")["environment"]
    kubernetes = BACKENDS["kubernetes"].create().plan(req, GpuConfig.read()).environment
    return {"local": dict(local), "docker": docker, "kubernetes": kubernetes}


def test_every_backend_gives_the_same_thread_count():
    for backend, environment in environments(ResourceSettings(cpu_count=2.5)).items():
        assert environment["OMP_NUM_THREADS"] == environment["MKL_NUM_THREADS"] == "3", backend


@pytest.mark.parametrize(("cpus", "processes", "threads"), [(8, 4, "2"), (2, 2, "1"), (2.5, 2, "1"), (1, 4, "1")])
def test_every_backend_gives_each_rank_of_a_launch_its_share_of_threads(cpus, processes, threads):
    """max(1, ceil(cpu_count) // processes): 4 ranks on 8 CPUs get 2 threads each, not 8."""
    section = launch_section(
        ResourceSettings(cpu_count=cpus), {"num_processes": processes, "cpu": True}, num_machines=1, owner="t"
    )
    assert section["processes"] == processes
    for backend, environment in environments(ResourceSettings(cpu_count=cpus), section).items():
        assert environment["OMP_NUM_THREADS"] == environment["MKL_NUM_THREADS"] == threads, backend


def test_ranks_per_machine_share_one_machines_threads():
    section = launch_section(ResourceSettings(cpu_count=16, gpu_count=4), {}, num_machines=2, owner="t")
    assert section["processes"] == 4  # 8 ranks on 2 machines: 4 share each machine's 16 CPUs
    assert thread_environment(ResourceSettings(cpu_count=16), section["processes"])["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_containers_and_pods_without_gpus_are_kept_off_the_hosts_gpus(vendor):
    planned = environments(ResourceSettings(cpu_count=1, gpu_vendor=vendor))
    assert planned["docker"]["NVIDIA_VISIBLE_DEVICES"] == planned["kubernetes"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert gpu_free_environment(ResourceSettings(gpu_count=1)) == {}


def test_a_gpu_pod_cannot_widen_what_it_sees_with_its_own_environment():
    """On a GPU pod the device plugin says which GPUs it gets; NVIDIA_VISIBLE_DEVICES=all must not say otherwise."""
    image = ImageSettings(environment={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1,2", "X": "1"})
    req = TaskRequest(ResourceSettings(gpu_count=1), image, Envelope.run(["true"]), "fail", LABELS)
    for backend in ("docker", "kubernetes"):
        plan = BACKENDS[backend].create().plan(req, GpuConfig.read())
        environment = plan.create_kwargs("img")["environment"] if backend == "docker" else plan.environment
        assert "NVIDIA_VISIBLE_DEVICES" not in environment and "CUDA_VISIBLE_DEVICES" not in environment, backend
        assert environment["X"] == "1"


def test_visible_devices_by_vendor():
    assert visible_devices(ResourceSettings().gpu_vendor, ["GPU-a", "GPU-b"]) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert visible_devices(ResourceSettings(gpu_vendor="amd").gpu_vendor, ["1"]) == {"ROCR_VISIBLE_DEVICES": "1"}
    assert visible_devices(ResourceSettings().gpu_vendor, [])["CUDA_VISIBLE_DEVICES"] == ""  # none visible


def test_the_summary_and_the_lock_holder():
    req = request(ResourceSettings(gpu_count=2, cpu_count=4))
    assert summary(req.resources, req.image, backend="docker", image_name="img", gpus=None) == {
        "backend": "docker",
        "image": "img",
        "requirements_hash": "none",
        "resources": "2x nvidia GPU, 4 CPUs",
        "gpus": None,
        "effective": {
            "cpu_count": 4.0,
            "gpu_count": 2,
            "memory": None,
            "accelerator": None,
            "gpu_vendor": "nvidia",
            "mig_profile": None,
            "shm_size": None,
            "cpu_fallback": False,
        },
    }
    fallback = summary(req.resources, req.image, backend="docker", image_name="img", gpus=None, cpu_fallback=True)
    assert (fallback["resources"], fallback["gpus"]) == ("2x nvidia GPU, 4 CPUs -> CPU fallback", [])
    assert fallback["effective"]["gpu_count"] == 0 and fallback["effective"]["cpu_fallback"] is True
    assert summary(ResourceSettings(), ImageSettings(), backend="local", image_name="i", gpus=None)["gpus"] == []
    assert lock_holder(req, "docker") == "d.t[3] run r1 (docker)"


def test_the_kubernetes_fallback_pod_reports_what_was_asked_for():
    plan = BACKENDS["kubernetes"].create().plan(request(ResourceSettings(gpu_count=1), policy="cpu"), GpuConfig.read())
    assert plan.cpu_fallback is not None
    envelope = json.loads(base64.b64decode(plan.cpu_fallback.envelope))  # for the pod's Secret
    assert envelope["summary"]["resources"] == "1x nvidia GPU -> CPU fallback"


def test_one_table_of_policies():
    assert list(POLICIES) == ["fail", "wait", "cpu"]
    assert [p.waits for p in POLICIES.values()] == [False, True, False]
    assert [p.runs_on_cpu for p in POLICIES.values()] == [False, False, True]
    assert request(ResourceSettings(), "wait").missing_gpu.pending_timeout == 86400.0


def test_result_value():
    assert result_value({"ok": True, "return_value": 7}, 0, where="x") == 7
    assert result_value({"ok": True, "return_value": None}, 0, where="x") is None  # an exec'd command's report
    with pytest.raises(RemoteTaskError, match="result is missing"):  # a lost result is never a success
        result_value(None, 0, where="x")
    with pytest.raises(RemoteTaskError, match="exited with status 3"):
        result_value(None, 3, where="x")
    with pytest.raises(RemoteTaskError, match="raised ValueError in x: boom") as err:
        result_value({"ok": False, "error": {"type": "ValueError", "message": "boom", "traceback": "tb"}}, 1, where="x")
    assert (err.value.error_type, err.value.remote_traceback) == ("ValueError", "tb")


def test_a_request_travels_through_a_deferral_whole_but_its_image():
    """What a deferred try carries (``TaskRequest.to_state``): JSON that gives the same request back, the same
    plan on every backend; the image (index credentials) stays out and comes from the task again."""
    from airflow_gpu_provider.checkpoint.location import CheckpointLocation

    image = ImageSettings(requirements=["numpy==2.1.0"], index_url="https://user:s3cret@pypi.example.com/simple")
    request = TaskRequest(
        ResourceSettings(gpu_count=2, memory="16Gi", accelerator=["H100", "A100"], cpu_count="500m"),
        image,
        Envelope.run(["python", "train.py"]).launched({"module": "accelerate.commands.launch", "args": []}),
        "cpu",
        LABELS,
        min_gpu_memory=2**34,
        checkpoint=CheckpointLocation("s3://ml/ckpt", "d/r/t"),
        resume=True,
        durable=False,
        project_path=("/dags",),
        avoid_nodes=("node-1",),
    )
    state = request.to_state()
    stored = json.loads(json.dumps(state))  # as the metadata database gives it back
    assert "s3cret" not in json.dumps(stored) and "image" not in stored
    again = TaskRequest.from_state(stored, image)
    assert again.to_state() == state and again.image is image
    assert dataclasses.replace(again, envelope=request.envelope) == request
    conf = GpuConfig.read()
    for name in ("docker", "kubernetes"):
        backend = BACKENDS[name].backend_class()(BACKENDS[name].parse_options({}))
        planned = backend.plan(again, conf)  # the same plan (a plan that keeps the request: its envelope's args
        if hasattr(planned, "request"):  # are [] where they were (), the same JSON)
            planned = dataclasses.replace(planned, request=request)
        assert planned == backend.plan(request, conf), name
