"""The DAG of tests/telemetry/test_right_size.py: a right-sized task, run twice on a replayed two-GPU host.

A worker runs it with ``dag.test()``; its NVML is the replay of an RTX 4090 (24 GiB, 10.4 GiB used) and an RTX 4080
(16 GiB), found by NVML (``[gpu] devices = auto``). The second run's conf ``{"oom": true}`` makes the 4080 run out of
memory.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import OomEscalation, gpu_task

RETRY_NOW = {"retries": 1, "retry_delay": datetime.timedelta(0)}

with DAG(
    "gpu_right_size",
    schedule=None,
    start_date=datetime.datetime(2024, 1, 1),
    catchup=False,
    params={"oom": False},
):

    @gpu_task(backend="local", gpu_count=1, right_size=True)
    def right_sized() -> str:
        """Which GPU the try got; the sampler reads the recording's ticks meanwhile."""
        import os
        import time

        time.sleep(0.6)
        return os.environ["CUDA_VISIBLE_DEVICES"]

    right_sized()

    @gpu_task(backend="local", gpu_count=1, right_size=True, on_oom=OomEscalation(), **RETRY_NOW)
    def oom_when_right_sized(params: dict) -> str:
        """Runs out of memory on the RTX 4080 when the run's conf says so: the retry climbs back to the 4090."""
        import os
        import time

        time.sleep(0.6)
        if params["oom"] and os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-00000000-0000-0000-0000-000000000001":
            raise RuntimeError("CUDA out of memory. Tried to allocate 14.00 GiB")
        return os.environ["CUDA_VISIBLE_DEVICES"]

    oom_when_right_sized()
