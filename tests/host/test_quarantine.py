"""GPU quarantine after an infrastructure failure, on a host of two listed GPUs (``[gpu] devices = 0,1``).

The task's runtime loads the NVML replay of a recording whose GPU 0 reports Xid 79 (``tests/nvml_replay``): a real
``dag.test()`` run in a worker process, the real local backend, allocator, runtime and sampler, Airflow's own
reschedule and task state store.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest
from helpers import start_worker, worker_result
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

from airflow_gpu_provider.host import quarantine
from airflow_gpu_provider.host.allocator import HostGpus
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.state import UntrustedStateError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

DAG_FILE = Path(__file__).resolve().parents[1] / "dags" / "infrastructure_dags.py"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
log = logging.getLogger("test")


def one_gpu_request() -> TaskRequest:
    return TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), Envelope.run(["true"]), "fail", {})


def run_faulty_host(tmp_path: Path, replay_lib: Path, **options: str) -> tuple[dict, str, Path]:
    state_dir = tmp_path / "state"
    env = {
        **replay_environment(RECORDINGS / "rtx4090_rtx4080_2gpu_xid79.csv", replay_lib),
        "AIRFLOW__GPU__DEVICES": "0,1",
        "AIRFLOW__GPU__STATE_DIR": str(state_dir),
        "AIRFLOW__GPU__PROFILE_INTERVAL": "0.25",  # the floor
        **{f"AIRFLOW__GPU__{name.upper()}": value for name, value in options.items()},
    }
    worker = start_worker(DAG_FILE, "gpu_fault_on_gpu0", env=env)
    out, _ = worker.communicate(timeout=300)
    return worker_result(out), out, state_dir


def gpu_failures(*, since: float) -> list[dict]:
    """The ``gpu_failure`` XComs of the test DAG pushed since ``since`` (the worker's, in the tests' Airflow DB)."""
    from datetime import datetime, timezone

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query = select(XComModel).where(XComModel.dag_id == "gpu_fault_on_gpu0", XComModel.key == "gpu_failure")
    query = query.where(XComModel.timestamp >= datetime.fromtimestamp(since, timezone.utc))
    with create_session() as session:
        return [XComModel.deserialize_value(row) for row in session.scalars(query)]


@pytest.fixture(scope="module")
def replay_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_or_skip(tmp_path_factory.mktemp("nvml"))


@pytest.mark.usefixtures("airflow_home")
def test_an_xid_on_gpu_0_quarantines_it_and_the_task_runs_again_on_gpu_1(tmp_path, replay_lib):
    started = time.time()
    result, out, state_dir = run_faulty_host(tmp_path, replay_lib, infra_retries="1", quarantine_seconds="600")
    assert result["states"] == {"trains_on_one_gpu": "success"}, out[-4000:]
    # the second run: GPU 1, and still try 1 (retries=0: the reschedule used none)
    assert result["xcom"]["trains_on_one_gpu"] == {"gpu": "1", "try": "1"}
    assert f"[gpu] profile: Xid 79 on GPU 0 ({GPU0}): GPU has fallen off the bus" in out
    assert "[gpu] infrastructure failure: GPU fault on " in out and f"(GPU {GPU0}): Xid 79 on GPU 0 ({GPU0})" in out
    assert "[gpu] GPU 0 quarantined on this host for 600s" in out
    assert "running the task again without using one of its retries ([gpu] infra_retries: 1 of 1)" in out
    assert "[gpu] GPU 0 is quarantined until " in out and "Starting task process on GPUs ['1']" in out
    # the quarantine file: the worker's own, private, GPU 0 for 600 s
    path = state_dir / "quarantine" / "gpus.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    entries = json.loads(path.read_text())
    assert list(entries) == ["0"] and started + 600 < entries["0"]["until"] < time.time() + 600
    assert "Xid 79" in entries["0"]["reason"]
    assert gpu_failures(since=started) == []  # the rescheduled run's XComs were cleared when it started
    # the next allocation on this host gets GPU 1 as well, while the quarantine lasts
    host = HostGpus(devices="0,1", state_dir=str(state_dir))
    with host.allocate(one_gpu_request(), backend="local", log=log) as allocation:
        assert [device.id for device in allocation.devices] == ["1"]


@pytest.mark.usefixtures("airflow_home")
def test_without_infra_retries_the_failure_fails_the_try_saying_why(tmp_path, replay_lib):
    started = time.time()
    result, out, _ = run_faulty_host(tmp_path, replay_lib, quarantine_seconds="600")
    assert result["states"] == {"trains_on_one_gpu": "failed"}, out[-4000:]
    assert "GpuInfrastructureError" in out and "because of the infrastructure, not its code (GPU fault)" in out
    assert "[gpu] GPU 0 quarantined on this host" in out
    [failure] = gpu_failures(since=started)
    assert failure["class"] == "infrastructure" and failure["reason"] == "GPU fault"
    assert failure["gpus"] == [{"index": "0", "uuid": GPU0}] and failure["host"]


def test_a_quarantine_expires(tmp_path):
    state_dir = tmp_path / "state"
    host = HostGpus(devices="0,1", state_dir=str(state_dir))
    quarantine.quarantine(state_dir, [Device("0")], "Xid 79 (GPU has fallen off the bus)", 1.0, log)
    with host.allocate(one_gpu_request(), backend="local", log=log) as allocation:
        assert [device.id for device in allocation.devices] == ["1"]
    time.sleep(1.1)
    assert quarantine.quarantined(state_dir) == {}
    with host.allocate(one_gpu_request(), backend="local", log=log) as allocation:
        assert [device.id for device in allocation.devices] == ["0"]


def test_quarantine_seconds_0_quarantines_nothing(tmp_path):
    quarantine.quarantine(tmp_path, [Device("0")], "Xid 79", 0, log)
    assert quarantine.quarantined(tmp_path) == {}


def test_the_devices_a_failure_names(tmp_path):
    allocated = [Device("3"), Device("GPU-aaaa")]
    failure = {"gpus": [{"index": "0", "uuid": "GPU-aaaa"}, {"index": "3", "uuid": "GPU-other"}]}
    assert quarantine.failed_devices(failure, allocated, positional=False) == [Device("GPU-aaaa"), Device("3")]
    # in a container the task saw its GPUs as 0, 1, ... in the order given
    assert quarantine.failed_devices({"gpus": [{"index": "1", "uuid": "GPU-x"}]}, allocated, positional=True) == [
        Device("GPU-aaaa")
    ]


def test_a_quarantine_file_that_is_a_link_is_refused(tmp_path):
    folder = tmp_path / "quarantine"
    folder.mkdir(mode=0o700)
    (tmp_path / "elsewhere.json").write_text(json.dumps({"0": {"until": time.time() + 60, "reason": "planted"}}))
    os.symlink(tmp_path / "elsewhere.json", folder / "gpus.json")
    with pytest.raises(UntrustedStateError, match="symlink"):
        quarantine.quarantined(tmp_path)
