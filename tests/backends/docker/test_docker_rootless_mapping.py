"""What a rootless engine or Podman changes in a create call (``backends/docker/rootless.py``): pure, no engine."""

from __future__ import annotations

from airflow_gpu_provider.backends.docker.container import NVIDIA_ULIMITS
from airflow_gpu_provider.backends.docker.engine_facts import LIMITS, EngineFacts
from airflow_gpu_provider.backends.docker.rootless import engine_notes, gpu_problem, on_engine
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.settings import ResourceSettings

ROOTLESS_V1 = EngineFacts("Docker", "20.10", rootless=True, cgroup="cgroup v1, driver none", enforced=frozenset())
PODMAN_V2 = EngineFacts("Podman", "5.4", rootless=True, cgroup="cgroup v2", enforced=frozenset({"memory", "pids"}))


def kwargs(**host):
    limits = {"mem_limit": 2**30, "memswap_limit": 2**30, "nano_cpus": 2 * 10**9, "shm_size": 2**26}
    return {"user": worker_user(), "host_config": {**limits, "ulimits": [dict(u) for u in NVIDIA_ULIMITS], **host}}


def test_limits_the_engine_does_not_enforce_are_left_out_and_said_per_resource():
    given = on_engine(kwargs(), ROOTLESS_V1)["host_config"]
    assert {"mem_limit", "memswap_limit", "nano_cpus"}.isdisjoint(given) and given["shm_size"] == 2**26
    given = on_engine(kwargs(), PODMAN_V2)["host_config"]
    assert given["mem_limit"] == 2**30 and "nano_cpus" not in given  # cpu not delegated, memory is
    notes = engine_notes(ResourceSettings(memory="1Gi", cpu_count=2), PODMAN_V2)
    assert len(notes) == 1 and notes[0].startswith("cpus=2.0 is not enforced") and "no cpu cgroup" in notes[0]
    assert engine_notes(ResourceSettings(), ROOTLESS_V1) == ()  # nothing asked, nothing relied on
    assert on_engine(kwargs(), EngineFacts()) == kwargs()  # a rootful Docker: as planned
    assert EngineFacts().unenforced == () and ROOTLESS_V1.unenforced == LIMITS


def test_a_rootless_engine_keeps_its_users_memlock_and_runs_the_workers_tasks_as_its_root():
    given = on_engine(kwargs(), ROOTLESS_V1)
    assert [u["name"] for u in given["host_config"]["ulimits"]] == ["stack"] and given["user"] == "0:0"
    assert on_engine({**kwargs(), "user": "1234:1234"}, ROOTLESS_V1)["user"] == "1234:1234"  # a listed user
    notes = engine_notes(ResourceSettings(gpu_count=1), ROOTLESS_V1)
    assert any(note.startswith("memlock ulimit") for note in notes)


def test_podman_gets_gpus_by_cdi_name_and_a_dropped_request_is_a_refusal():
    named = {"driver": "", "capabilities": [["gpu"]], "device_ids": ["0", "GPU-8a1f"]}
    given = on_engine(kwargs(device_requests=[named]), PODMAN_V2)["host_config"]
    assert "device_requests" not in given
    assert given["devices"] == [
        "nvidia.com/gpu=0:nvidia.com/gpu=0:rwm",
        "nvidia.com/gpu=GPU-8a1f:nvidia.com/gpu=GPU-8a1f:rwm",
    ]
    every = on_engine(kwargs(device_requests=[{"count": -1, "capabilities": [["gpu"]]}]), PODMAN_V2)["host_config"]
    assert every["devices"] == ["nvidia.com/gpu=all:nvidia.com/gpu=all:rwm"]
    counted = kwargs(device_requests=[{"count": 2, "capabilities": [["gpu"]]}])  # unnamed: asked as is
    assert on_engine(counted, PODMAN_V2)["host_config"]["device_requests"]
    assert "dropped the GPU request" in gpu_problem({"HostConfig": {"DeviceRequests": None}}, counted)
    created = {"HostConfig": {"Devices": [{"PathOnHost": "nvidia.com/gpu=0", "PathInContainer": "nvidia.com/gpu=0"}]}}
    assert gpu_problem(created, {"host_config": given}) is not None  # GPU-8a1f was not recorded
    assert gpu_problem({"HostConfig": {"Devices": []}}, kwargs()) is None  # a CPU task
