"""A GPU out-of-memory failure is a distinct kind of failure: recognised by the runtime, raised as such on the worker.

The first step of OOM-aware retries (issue 13): the kind travels in the result envelope (``error.kind``), from the
task process or from any rank of a launch, and the worker raises :class:`GpuOutOfMemoryError`.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from shipped_runtime import run_runtime, shipped

from airflow_gpu_provider.exceptions import GpuOutOfMemoryError, HostOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.runtime.protocol import GPU_OOM, HOST_OOM
from airflow_gpu_provider.task.result import task_result

escalation, launch = shipped("escalation"), shipped("launch")  # the runtime's halves, from its archive


def run_task(tmp_path, body: str) -> tuple[dict, str]:
    envelope = {
        "version": 2,
        "mode": "callable",
        "function": "task",
        "source": "def task():\n" + textwrap.indent(textwrap.dedent(body), "    "),
        "summary": {"backend": "test", "gpus": []},
    }
    (tmp_path / "envelope.json").write_text(json.dumps(envelope))
    done = run_runtime(str(tmp_path / "envelope.json"), str(tmp_path / "result.json"), timeout=120)
    return json.loads((tmp_path / "result.json").read_text()), done.stderr


def test_torchs_out_of_memory_error_is_a_gpu_oom(tmp_path):
    body = """
        import torch
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)")
    """
    result, stderr = run_task(tmp_path, body)
    assert result["error"]["kind"] == GPU_OOM and result["error"]["type"] == "OutOfMemoryError"
    assert "[gpu] the task ran out of GPU memory (OutOfMemoryError)" in stderr
    with pytest.raises(GpuOutOfMemoryError, match=r"ran out of GPU memory in the pod \(OutOfMemoryError: CUDA out"):
        task_result(result, 1, where="the pod")


def test_an_oom_wrapped_by_the_users_code_is_still_one(tmp_path):
    body = """
        try:
            raise RuntimeError("CUDA error: out of memory")
        except RuntimeError as err:
            raise ValueError("the batch failed") from err
    """
    result, _ = run_task(tmp_path, body)
    assert result["error"]["type"] == "ValueError" and result["error"]["kind"] == GPU_OOM


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad value"), RuntimeError("out of patience")],
    ids=["ValueError", "other RuntimeError"],
)
def test_other_failures_are_plain_errors(exc):
    assert not escalation.is_gpu_oom(exc)
    error = escalation.error_record(exc)
    assert error["kind"] == "error"
    with pytest.raises(RemoteTaskError) as raised:
        task_result({"ok": False, "error": error}, 1, where="x")
    assert type(raised.value) is RemoteTaskError


@pytest.mark.parametrize(
    "text",
    [
        "HIP out of memory. Tried to allocate",
        "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
        "XPU out of memory",
    ],
)
def test_other_accelerators_oom_texts(text):
    assert escalation.is_gpu_oom(RuntimeError(text))


def test_an_oom_in_any_rank_of_a_launch_is_the_launchs():
    ok = {"ok": True, "return_value": 1}
    oom = {
        "ok": False,
        "error": escalation.error_record(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")),
    }
    result, status = launch.merge_ranks({0: ok, 1: oom}, 1, "accelerate.commands.launch")
    assert status == 1 and result["error"]["kind"] == GPU_OOM
    with pytest.raises(GpuOutOfMemoryError, match="rank 1: CUDA out of memory"):
        task_result(result, 1, where="the local task process")


def test_pythons_memory_error_is_a_host_oom(tmp_path):
    result, stderr = run_task(tmp_path, "raise MemoryError('no more host memory')")
    assert result["error"]["kind"] == HOST_OOM
    assert "[gpu] the task ran out of host memory (MemoryError)" in stderr
    with pytest.raises(HostOutOfMemoryError, match="ran out of host memory"):
        task_result(result, 1, where="x")


def test_a_failed_try_names_the_gpus_it_ran_on(tmp_path):
    """What OOM escalation compares the next try's GPU with."""
    result, _ = run_task(tmp_path, "raise RuntimeError('CUDA out of memory')")
    assert result["gpus"] == []  # the summary's GPUs (none here); a success does not carry them
    gpus = [{"index": "0", "name": "L4", "memory_total": 24 * 2**30}]
    with pytest.raises(GpuOutOfMemoryError) as raised:
        task_result({**result, "gpus": gpus}, 1, where="x")
    assert raised.value.gpus == gpus and raised.value.kind == GPU_OOM


def test_an_oom_is_the_cause_even_when_another_rank_failed_first():
    """A rank that ran out of memory breaks the collective: the others fail after it, or even before it reports."""
    broken = {
        "ok": False,
        "error": {**escalation.error_record(RuntimeError("NCCL communicator was aborted")), "time": 1.0},
    }
    oom = {"ok": False, "error": {**escalation.error_record(RuntimeError("CUDA out of memory")), "time": 2.0}}
    result, _ = launch.merge_ranks({0: broken, 1: oom}, 1, "accelerate.commands.launch")
    assert result["error"]["kind"] == GPU_OOM and result["error"]["message"].startswith("rank 1:")
