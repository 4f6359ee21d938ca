"""DAGs of the infrastructure-failure tests (tests/host/test_quarantine.py)."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import gpu_task

with DAG("gpu_fault_on_gpu0", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):

    @gpu_task(backend="local", gpu_count=1, retries=0)
    def trains_on_one_gpu() -> dict:
        """GPU 0 of the replayed host fails (its recording has an Xid 79): the CUDA call after it fails."""
        import os
        import time

        time.sleep(0.6)  # the sampler reads the recording's third tick, and its Xid, meanwhile
        if os.environ["CUDA_VISIBLE_DEVICES"] == "0":
            raise RuntimeError("CUDA error: unspecified launch failure")
        return {"gpu": os.environ["CUDA_VISIBLE_DEVICES"], "try": os.environ.get("AIRFLOW_CTX_TRY_NUMBER")}

    trains_on_one_gpu()
