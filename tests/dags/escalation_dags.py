"""DAGs of tests/operators/test_oom_escalation.py: tasks that run out of memory on purpose (dag.test() runs retries).

The inventory is set by the test: ``[gpu] devices = 0=L4,1=A100-80GB`` (models, hence memory, of fake devices).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_gpu_provider import GpuStepOperator, OomEscalation

START = datetime.datetime(2024, 1, 1)
RETRY_NOW = {"retries": 1, "retry_delay": datetime.timedelta(0)}


def oom_on_l4():
    """Run out of GPU memory on an L4 (torch's own error), report the resources of the try that succeeds."""
    import json
    import os

    resources = json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])
    if resources["accelerator"] == "L4":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 22.05 GiB total)")
    return {"resources": resources, "devices": os.environ["CUDA_VISIBLE_DEVICES"]}


def oom_on_device_0():
    """Run out of GPU memory on device 0, whatever its model."""
    import json
    import os

    if os.environ["CUDA_VISIBLE_DEVICES"] == "0":
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return {"resources": json.loads(os.environ["AIRFLOW_GPU_RESOURCES"]), "devices": os.environ["CUDA_VISIBLE_DEVICES"]}


def fail_once(marker):
    """A failure that is not an OOM on the first try; the resources of the second."""
    import json
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError("not a memory problem")
    return {"resources": json.loads(os.environ["AIRFLOW_GPU_RESOURCES"]), "devices": os.environ["CUDA_VISIBLE_DEVICES"]}


def always_oom():
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 200.00 GiB")


with DAG("oom_escalation", schedule=None, start_date=START, default_args=RETRY_NOW):
    GpuStepOperator(
        task_id="climb",
        python_callable=oom_on_l4,
        accelerator="L4",
        on_oom=OomEscalation(accelerators=["L4", "A100-80GB"]),
    )

with DAG("oom_larger_gpu", schedule=None, start_date=START, default_args=RETRY_NOW):
    GpuStepOperator(task_id="larger", python_callable=oom_on_device_0, gpu_count=1, on_oom=OomEscalation())

with DAG(
    "oom_other_failure",
    schedule=None,
    start_date=START,
    default_args=RETRY_NOW,
    params={"marker": Param("", type="string")},
):
    GpuStepOperator(
        task_id="unchanged",
        python_callable=fail_once,
        op_kwargs={"marker": "{{ params.marker }}"},
        accelerator="L4",
        on_oom=OomEscalation(accelerators=["A100-80GB"]),
    )

with DAG(
    "oom_top_of_ladder",
    schedule=None,
    start_date=START,
    default_args={"retries": 3, "retry_delay": datetime.timedelta(0)},
):
    GpuStepOperator(
        task_id="top",
        python_callable=always_oom,
        accelerator="L4",
        on_oom=OomEscalation(accelerators=["A100-80GB"]),
    )


def rank_1_ooms_on_l4() -> dict:
    """Rank 1 of a 2-process launch runs out of GPU memory on an L4; on the next rung every rank succeeds."""
    import json
    import os

    from accelerate import Accelerator

    accelerator = Accelerator()
    resources = json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])
    if resources["accelerator"] == "L4" and accelerator.process_index == 1:
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
    return {"world_size": accelerator.num_processes, "accelerator": resources["accelerator"]}


with DAG("oom_accelerate", schedule=None, start_date=START, default_args=RETRY_NOW):
    from airflow_gpu_provider import AccelerateOperator

    AccelerateOperator(
        task_id="launch",
        python_callable=rank_1_ooms_on_l4,
        cpu=True,
        num_processes=2,
        accelerator="L4",
        on_oom=OomEscalation(accelerators=["A100-80GB"]),
    )
