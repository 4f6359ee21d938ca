"""The class of a failed try, decided by the runtime (``runtime/failures.py``) in real task processes.

GPU faults come from the NVML replay (``tests/nvml_replay``): its ``xid`` and ECC columns reach the runtime's own
``ctypes`` sampler as NVML's Xid events and ECC counters. Collective failures: a real gloo timeout between two
torch.distributed processes, and the exact texts ProcessGroupNCCL raises (the CPU build of torch has no NCCL).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from nvml_replay import RECORDINGS, built_or_skip, replay_environment
from shipped_runtime import run_sampled_task

from airflow_gpu_provider.exceptions import GpuInfrastructureError, GpuOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.task.result import task_result

XID_RECORDING = RECORDINGS / "rtx4090_rtx4080_2gpu_xid79.csv"
# Xid 94 on both GPUs; recovery action "none" on GPU 0, "GPU reset" on GPU 1 (NVML's field, through ctypes)
XID94_RECORDING = RECORDINGS / "rtx4090_rtx4080_2gpu_xid94.csv"
ECC_RECORDING = RECORDINGS / "rtx4090_1gpu_ecc.csv"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
# ProcessGroupNCCL.cpp's watchdog line and NCCLUtils.cpp's abort, as torch 2.x words them (a real run's log)
WATCHDOG = (
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, "
    "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
ABORTED = "NCCL communicator was aborted on rank 1.  Original reason for failure was: ..."


@pytest.fixture(scope="module")
def replay_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_or_skip(tmp_path_factory.mktemp("nvml"))


def run_task(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """Run ``body`` as a task function in the shipped runtime, sampled every 0.05 s; (result, log)."""
    return run_sampled_task(tmp_path, body, env=env, profile={"interval_s": 0.05, "host": "worker-7"})


CRASH = "import time\ntime.sleep(0.5)\nraise RuntimeError('CUDA error: unspecified launch failure')"


def test_an_xid_79_seen_by_the_sampler_makes_the_failure_the_infrastructures(tmp_path, replay_lib):
    env = {**replay_environment(XID_RECORDING, replay_lib), "CUDA_VISIBLE_DEVICES": "0"}
    result, log = run_task(tmp_path, CRASH, env)
    failure = result["failure"]
    assert failure["class"] == "infrastructure" and failure["reason"] == "GPU fault"
    assert failure["gpus"] == [{"index": "0", "uuid": GPU0}]
    assert failure["host"] == "worker-7"
    assert failure["evidence"][0] == f"Xid 79 on GPU 0 ({GPU0}): GPU has fallen off the bus"
    assert "unspecified launch failure" in failure["evidence"][1]
    [fault] = result["profile"]["gpu_faults"]
    assert fault["xid"] == 79 and fault["index"] == "0" and fault["at"] > 0
    assert "recovery_action" not in fault  # the recording's driver does not give it: NVIDIA's catalogue decides
    assert f"[gpu] profile: Xid 79 on GPU 0 ({GPU0}): GPU has fallen off the bus" in log
    assert "[gpu] infrastructure failure (GPU fault): Xid 79 on GPU 0" in log
    with pytest.raises(GpuInfrastructureError, match="because of the infrastructure, not its code") as raised:
        task_result(result, 1, where="the local task process")
    assert raised.value.failure == failure
    assert raised.value.remote_traceback.rstrip().endswith("RuntimeError: CUDA error: unspecified launch failure")


def test_the_other_gpu_of_the_same_recording_saw_no_xid_the_failure_is_the_tasks(tmp_path, replay_lib):
    env = {**replay_environment(XID_RECORDING, replay_lib), "CUDA_VISIBLE_DEVICES": "1"}
    result, log = run_task(tmp_path, CRASH, env)
    assert result["failure"]["class"] == "application" and result["failure"]["gpus"] == []
    assert result["profile"]["gpu_faults"] == []
    assert "infrastructure failure" not in log
    with pytest.raises(RemoteTaskError) as raised:
        task_result(result, 1, where="the local task process")
    assert type(raised.value) is RemoteTaskError


@pytest.mark.parametrize(
    ("device", "action", "klass"),
    [("0", "none", "application"), ("1", "GPU reset", "infrastructure")],
    ids=["recovery action none", "recovery action GPU reset"],
)
def test_the_gpus_recovery_action_decides_whether_an_xid_94_is_the_infrastructures(
    tmp_path, replay_lib, device, action, klass
):
    """Xid 94 is a contained error (NVIDIA: restart the application); the driver's recovery action has the last word."""
    env = {**replay_environment(XID94_RECORDING, replay_lib), "CUDA_VISIBLE_DEVICES": device}
    result, log = run_task(tmp_path, CRASH, env)
    [fault] = result["profile"]["gpu_faults"]
    assert fault["xid"] == 94 and fault["recovery_action"] == action
    assert result["failure"]["class"] == klass
    assert f"Xid 94 on GPU {device} (GPU-00000000-0000-0000-0000-00000000000{device}): contained memory error" in log
    assert f"(recovery action: {action})" in log
    assert ("infrastructure failure" in log) is (klass == "infrastructure")


def test_without_a_recovery_action_nvidias_catalogue_decides():
    """Where the driver does not give it: a reset or more in the catalogue's immediate action is the infrastructure's."""
    from airflow_gpu_provider.runtime.failures import is_infrastructure_fault

    verdicts = {
        xid: is_infrastructure_fault({"xid": xid}) for xid in (13, 43, 48, 63, 74, 79, 92, 94, 95, 119, 120, 154)
    }
    assert [xid for xid, infrastructure in verdicts.items() if infrastructure] == [48, 74, 79, 95, 119, 120, 154]
    assert not is_infrastructure_fault({"xid": 79, "recovery_action": "none"})  # the driver's word comes first
    assert is_infrastructure_fault({"xid": 63, "recovery_action": "node reboot"})


def test_a_rise_of_the_uncorrectable_ecc_count_is_a_gpu_fault(tmp_path, replay_lib):
    result, _ = run_task(tmp_path, CRASH, replay_environment(ECC_RECORDING, replay_lib))
    assert result["failure"]["class"] == "infrastructure"
    [fault] = result["profile"]["gpu_faults"]
    assert fault["ecc_uncorrected"] == 2  # the recording's count went from 0 to 2
    assert f"2 uncorrectable ECC error(s) on GPU 0 ({GPU0})" in result["failure"]["evidence"][0]


def test_a_task_that_succeeds_on_a_faulty_gpu_succeeds(tmp_path, replay_lib):
    env = {**replay_environment(XID_RECORDING, replay_lib), "CUDA_VISIBLE_DEVICES": "0"}
    result, log = run_task(tmp_path, "import time\ntime.sleep(0.5)\nreturn 3", env)
    assert result["ok"] and result["return_value"] == 3 and "failure" not in result
    assert result["profile"]["gpu_faults"][0]["xid"] == 79  # still recorded, and said in the log
    assert "Xid 79" in log


@pytest.mark.parametrize("message", [WATCHDOG, ABORTED], ids=["watchdog timeout", "communicator aborted"])
def test_nccl_timeouts_and_aborts_are_the_infrastructures(tmp_path, message):
    body = f"import torch.distributed as dist\nraise dist.DistBackendError({message!r})"
    result, log = run_task(tmp_path, body, {"CUDA_VISIBLE_DEVICES": ""})
    assert result["error"]["kind"] == "infrastructure" and result["error"]["type"] == "DistBackendError"
    assert result["failure"]["class"] == "infrastructure"
    assert result["failure"]["evidence"] == [message.splitlines()[0].strip()]
    assert "[gpu] infrastructure failure (collective (NCCL) timeout or abort)" in log
    with pytest.raises(GpuInfrastructureError):
        task_result(result, 1, where="pod ml/train")


def test_a_real_gloo_collective_timeout_between_two_processes(tmp_path):
    """Rank 1 joins the group and never takes part in the all_reduce: rank 0 times out in gloo."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    peer = (
        "import datetime, sys, time, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', rank=1, world_size=2, init_method='tcp://127.0.0.1:{port}',"
        " timeout=datetime.timedelta(seconds=20))\ntime.sleep(8)\n"
    )
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", peer])
    try:
        body = f"""
            import datetime, torch, torch.distributed as dist
            dist.init_process_group("gloo", rank=0, world_size=2, init_method="tcp://127.0.0.1:{port}",
                                    timeout=datetime.timedelta(seconds=2))
            dist.all_reduce(torch.ones(1))
        """
        result, _ = run_task(tmp_path, body, {"CUDA_VISIBLE_DEVICES": ""})
    finally:
        other.kill()
        other.wait()
    assert result["failure"]["class"] == "infrastructure"
    [evidence] = result["failure"]["evidence"]
    assert "Timed out waiting 2000ms for recv operation to complete" in evidence


@pytest.mark.parametrize(
    ("body", "klass", "error"),
    [
        ("raise ValueError('bad input')", "application", RemoteTaskError),
        (
            "import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
            "resources",
            GpuOutOfMemoryError,
        ),
    ],
    ids=["application", "resources"],
)
def test_the_users_errors_and_out_of_memory_keep_their_classes(tmp_path, body, klass, error):
    result, _ = run_task(tmp_path, body, {"CUDA_VISIBLE_DEVICES": ""})
    assert result["failure"]["class"] == klass and result["failure"]["evidence"] == []
    with pytest.raises(error) as raised:
        task_result(result, 1, where="the local task process")
    assert type(raised.value) is error
