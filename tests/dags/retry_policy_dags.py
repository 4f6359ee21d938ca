"""The DAG of tests/escalation/test_retry_policy.py and tests/telemetry/test_metrics.py: tries that fail by class.

Run by a worker (``dag.test()``) whose tasks load the NVML replay of a host whose GPU 0 reports Xid 79 at its third
tick (``[gpu] devices = 0,1``). Every task has two retries, without delay.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuRetryPolicy, gpu_task

FAIL_FAST = GpuRetryPolicy(application="fail", infrastructure_delay=0)
RETRIES = {"retries": 2, "retry_delay": datetime.timedelta(0)}

with DAG("gpu_retry_policy", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):

    @gpu_task(backend="local", gpu_count=0, retry_policy=FAIL_FAST, **RETRIES)
    def bad_input() -> None:
        """The task's own error: the policy fails it at once, whatever its retries."""
        raise ValueError("bad input: 'lr' must be positive")

    @gpu_task(backend="local", gpu_count=1, retry_policy=FAIL_FAST, **RETRIES)
    def gpu_fault() -> dict:
        """GPU 0 fails (Xid 79): the CUDA call after it fails; the retry runs on GPU 1 (GPU 0 is quarantined)."""
        import os
        import time

        time.sleep(0.6)  # the sampler reads the recording's third tick, and its Xid, meanwhile
        if os.environ["CUDA_VISIBLE_DEVICES"] == "0":
            raise RuntimeError("CUDA error: unspecified launch failure")
        return {"gpu": os.environ["CUDA_VISIBLE_DEVICES"], "try": os.environ.get("AIRFLOW_CTX_TRY_NUMBER")}

    @gpu_task(backend="local", gpu_count=0, retry_policy=FAIL_FAST, **RETRIES)
    def collective_timeout() -> str:
        """Try 1: rank 1 of a real 2-process gloo group never joins the all_reduce, rank 0 times out. Try 2 runs."""
        import os

        if os.environ.get("AIRFLOW_CTX_TRY_NUMBER") != "1":
            return "ran again"
        import datetime
        import socket
        import subprocess
        import sys
        import tempfile
        import time

        import torch
        import torch.distributed as dist

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ready = tempfile.mktemp(prefix="gloo-peer-")
        peer = (  # rank 1: joins the group (after its slow imports), then never takes part in the all_reduce
            f"import datetime, pathlib, time, torch.distributed as dist\npathlib.Path({ready!r}).touch()\n"
            f"dist.init_process_group('gloo', rank=1, world_size=2, init_method='tcp://127.0.0.1:{port}',"
            " timeout=datetime.timedelta(seconds=30))\ntime.sleep(10)\n"
        )
        other = subprocess.Popen([sys.executable, "-c", peer])
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(ready) and time.monotonic() < deadline and other.poll() is None:
                time.sleep(0.05)
            dist.init_process_group(
                "gloo",
                rank=0,
                world_size=2,
                init_method=f"tcp://127.0.0.1:{port}",
                timeout=datetime.timedelta(seconds=2),
            )
            dist.all_reduce(torch.ones(1))
        finally:
            other.kill()
            other.wait()
            if os.path.exists(ready):
                os.remove(ready)
        return "unreachable"

    @gpu_task(backend="local", gpu_count=0, **RETRIES)
    def fails_once() -> str:
        """No retry_policy: the GPU operators' own GpuRetryPolicy() retries it, naming the class."""
        import os

        if os.environ.get("AIRFLOW_CTX_TRY_NUMBER") == "1":
            raise KeyError("checkpoint-7")
        return "second try"

    bad_input(), gpu_fault(), collective_timeout(), fails_once()
