"""The DAG of tests/telemetry/test_right_size.py: a right-sized task, run twice on a replayed two-GPU host.

A worker runs it with ``dag.test()``; its NVML is the replay of an RTX 4090 (24 GiB, 10.4 GiB used) and an RTX 4080
(16 GiB), found by NVML (``[gpu] devices = auto``).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import gpu_task

with DAG("gpu_right_size", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):

    @gpu_task(backend="local", gpu_count=1, right_size=True)
    def right_sized() -> str:
        """Which GPU the try got; the sampler reads the recording's ticks meanwhile."""
        import os
        import time

        time.sleep(0.6)
        return os.environ["CUDA_VISIBLE_DEVICES"]

    right_sized()
