"""The DAGs of tests/backends/local/test_local_shares.py: shares of one GPU, in two workers at once.

Each worker runs one DAG with ``dag.test()`` on a host whose NVML is the replay of an RTX 4090 (24 GiB). The
share tasks wait until both shares are held at once on their GPU (a barrier: the two runs overlap), then return what
their process was given. ``share_oom`` runs out of GPU memory on its share: its retry climbs to a whole GPU.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import OomEscalation, gpu_task

RETRY_NOW = {"retries": 1, "retry_delay": datetime.timedelta(0)}
SHARED = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")

with DAG("gpu_share_a", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):

    @gpu_task(backend="local", gpu_share="8GiB")
    def share_a(names: list) -> dict:
        """Hold the share until both shares of this GPU were seen held at once, by both tasks (a barrier)."""
        import os
        import time
        from pathlib import Path

        from airflow_gpu_provider.host.shares import live_claims

        state = Path(os.environ["AIRFLOW__GPU__STATE_DIR"])
        lock = state / "locks" / f"nvidia-{os.environ['CUDA_VISIBLE_DEVICES']}.lock"
        together, deadline = 0, time.monotonic() + 120
        while not (together == 2 and (state / "saw-b").exists()) and time.monotonic() < deadline:
            if len(live_claims(lock)) == 2:
                together = 2
                (state / "saw-a").touch()
            time.sleep(0.1)
        return {"together": together, **{name: os.environ.get(name) for name in names}}

    @gpu_task(backend="local", gpu_share="8GiB", on_oom=OomEscalation(), on_missing_gpu="wait", **RETRY_NOW)
    def share_oom(names: list) -> dict:
        """Out of GPU memory on its share (as MPS's limit or PyTorch's cap would say): the retry waits for the whole
        GPU (the other worker's share may still hold a part of it)."""
        import os

        if os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return {"resources": os.environ["AIRFLOW_GPU_RESOURCES"], **{name: os.environ.get(name) for name in names}}

    share_a(list(SHARED)) >> share_oom(list(SHARED))

with DAG("gpu_share_b", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):

    @gpu_task(backend="local", gpu_count=0.45)
    def share_b(names: list) -> dict:
        """As share_a: a fraction of a GPU instead of an amount of its memory."""
        import os
        import time
        from pathlib import Path

        from airflow_gpu_provider.host.shares import live_claims

        state = Path(os.environ["AIRFLOW__GPU__STATE_DIR"])
        lock = state / "locks" / f"nvidia-{os.environ['CUDA_VISIBLE_DEVICES']}.lock"
        together, deadline = 0, time.monotonic() + 120
        while not (together == 2 and (state / "saw-a").exists()) and time.monotonic() < deadline:
            if len(live_claims(lock)) == 2:
                together = 2
                (state / "saw-b").touch()
            time.sleep(0.1)
        return {"together": together, **{name: os.environ.get(name) for name in names}}

    share_b(list(SHARED))
