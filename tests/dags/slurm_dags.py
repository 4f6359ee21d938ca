"""DAGs of the Slurm backend's tests (tests/backends/slurm/): each task is a batch job on the tests' own cluster.

The cluster comes from the connections ``slurm_test`` (a submit host: Slurm's commands) and ``slurm_rest``
(slurmrestd with a JWT), set by the cluster fixture; its nodes (``<name>n1``: an A100 and an H100, ``<name>n2``: an
A100, as GRES) share this machine's file system, and run the tests' Python (the connection's ``python``).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, ImageSettings, OomEscalation

START = datetime.datetime(2024, 1, 1)
SLURM = {"backend": "slurm", "backend_options": {"slurm_conn_id": "slurm_test"}}
REST = {"backend": "slurm", "backend_options": {"slurm_conn_id": "slurm_rest"}}
ONCE = {"retries": 0}
AGAIN = {"retries": 1, "retry_delay": datetime.timedelta(0)}
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def where(leave_behind: bool = False) -> dict:
    """What the job sees: its GPUs, its node, when it ran; with ``leave_behind``, a process escapes in a session of
    its own (the job's reaper must stop it); with ``GATE`` set, it runs until that file exists (at most 60 s)."""
    import json
    import os
    import subprocess
    import time

    started = time.time()
    if leave_behind:
        subprocess.Popen(["setsid", "sleep", "3600"], start_new_session=True)
    gate = os.environ.get("GATE")
    while gate and not os.path.exists(gate) and time.time() < started + 60:  # held until the test opens it
        time.sleep(0.05)
    found = {"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "node": os.environ.get("SLURMD_NODENAME")}
    found.update(job=os.environ.get("SLURM_JOB_ID"), start=started, end=time.time())
    return {**found, "resources": json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])}


def uses_the_requirement() -> bool:
    import airflow_gpu_private  # installed by the job into the cached folder on the shared folder

    return airflow_gpu_private.SECRET_PACKAGE


def counts_its_runs(marks: str, seconds: float) -> dict:
    """Append a line to ``marks`` (each run of the function: its job and Slurm's restart count); the first run then
    sleeps ``seconds`` (the test ends its job meanwhile), a later one returns at once; the runs and the node."""
    import os
    import time

    first = not os.path.exists(marks)
    with open(marks, "a") as handle:
        handle.write(f"{os.environ.get('SLURM_JOB_ID')} {os.environ.get('SLURM_RESTART_COUNT', '0')}\n")
    if first:
        time.sleep(seconds)
    with open(marks) as handle:
        return {"runs": handle.read().splitlines(), "node": os.environ.get("SLURMD_NODENAME")}


def grows(megabytes: int) -> int:
    blocks = [bytearray(2**20) for _ in range(megabytes)]
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touched: resident
    return len(blocks)


def sleeps() -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(600)


def on_a_share(oom_first: bool = False) -> dict:
    """What a share's job sees (held until ``GATE`` exists, at most 60 s); with ``oom_first``, a try on shards fails
    as a GPU out of memory does."""
    import os
    import time

    started = time.time()
    while os.environ.get("GATE") and not os.path.exists(os.environ["GATE"]) and time.time() < started + 60:
        time.sleep(0.05)
    if oom_first and os.environ.get("SLURM_SHARDS_ON_NODE"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    names = {"gpus": "CUDA_VISIBLE_DEVICES", "shards": "SLURM_SHARDS_ON_NODE", "node": "SLURMD_NODENAME"}
    return {key: os.environ.get(name) for key, name in names.items()}


_marks = os.environ.get("AIRFLOW_GPU_TEST_MARKS", "/nowhere")
_gate = os.environ.get("AIRFLOW_GPU_TEST_GATE", "")

with DAG("slurm_basics", schedule=None, start_date=START):  # what one worker checks in one run, task by task
    GpuStepOperator(task_id="a100", python_callable=where, op_args=[True], accelerator="A100", **SLURM, **ONCE)
    GpuStepOperator(task_id="either", python_callable=where, accelerator=["A100", "H100", "B200"], **SLURM, **ONCE)
    GpuStepOperator(task_id="no_gpu", python_callable=where, cpu_count=1, memory="256Mi", **SLURM, **ONCE)
    GpuStepOperator(
        task_id="requirement",
        python_callable=uses_the_requirement,
        image=ImageSettings(
            requirements=["airflow-gpu-private==1.0"],
            find_links=[os.environ.get("AIRFLOW_GPU_TEST_WHEELS", "/nowhere")],
            python_package_installer="pip",
        ),
        **SLURM,
        **ONCE,
    )
    GpuStepOperator(task_id="never", python_callable=where, gpu_count=3, **SLURM, **ONCE)
    GpuStepOperator(task_id="deferred", python_callable=where, gpu_count=1, deferrable=True, **SLURM, **ONCE)
    GpuStepOperator(task_id="rest", python_callable=where, accelerator="H100", **REST, **ONCE)
    GpuStepOperator(  # Airflow's timeout: the job is cancelled (scancel)
        task_id="timeout", python_callable=sleeps, execution_timeout=datetime.timedelta(seconds=8), **SLURM, **ONCE
    )

with DAG("slurm_oom", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="grow",
        python_callable=grows,
        op_args=[300],
        memory="128Mi",
        on_oom=OomEscalation(memory=["1Gi"]),
        **SLURM,
        **AGAIN,
    )

# tests/backends/slurm/test_slurm_two_workers.py: two workers at once, each first wanting the only H100 (held until
# the test sees one job run and the other wait), then one's jobs preempted by a job of partition high, the other's
# past its time limit (the test shortens it: scontrol update EndTime)
_H100 = {"python_callable": where, "accelerator": "H100", "image": ImageSettings(environment={"GATE": _gate})}

with DAG("slurm_h100_then_preempted", schedule=None, start_date=START):
    _requeued = [
        GpuStepOperator(
            task_id=f"requeue_{str(_requeue).lower()}",
            python_callable=counts_its_runs,
            op_args=[f"{_marks}-requeue_{str(_requeue).lower()}", 60],
            accelerator="H100",
            backend="slurm",
            backend_options={"slurm_conn_id": "slurm_test", "partition": "low", "requeue": _requeue},
            **AGAIN,
        )
        for _requeue in (True, False)
    ]
    GpuStepOperator(task_id="h100", **_H100, **SLURM, **ONCE) >> _requeued[0] >> _requeued[1]

with DAG("slurm_h100_then_timeout", schedule=None, start_date=START):
    GpuStepOperator(task_id="h100", **_H100, **SLURM, **ONCE) >> GpuStepOperator(
        task_id="timeout",
        python_callable=counts_its_runs,
        op_args=[f"{_marks}-timeout", 600],
        backend="slurm",
        backend_options={"slurm_conn_id": "slurm_test", "partition": "quick"},  # one node, a one-minute MaxTime
        **AGAIN,
    )

with DAG("slurm_node_down", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="task",
        python_callable=counts_its_runs,
        op_args=[f"{_marks}-node", 8],
        accelerator="A100",
        backend="slurm",
        backend_options={"slurm_conn_id": "slurm_test", "requeue": False},
        **AGAIN,
    )

with DAG("slurm_accelerate", schedule=None, start_date=START, params={"out": ""}):
    AccelerateOperator(
        task_id="two_nodes",
        script=str(SCRIPTS / "accelerate_script.py"),
        script_args=["--epochs", "1", "--out", "{{ params.out }}"],
        num_machines=2,
        num_processes=2,
        cpu=True,
        memory="1Gi",  # per node: torch and gloo
        **SLURM,
        **ONCE,
    )

# tests/backends/slurm/test_slurm_backend.py: shares of one GPU as gres/shard (the only H100 shared with a job of the
# test's own; a quarter held until the test opens the gate), one by memory through slurmrestd, one that climbs to a
# whole GPU after a GPU out of memory
with DAG("slurm_shares", schedule=None, start_date=START):
    _quarter = GpuStepOperator(
        task_id="quarter",
        python_callable=on_a_share,
        gpu_count=0.25,
        accelerator="H100",
        image=ImageSettings(environment={"GATE": _gate}),
        **SLURM,
        **ONCE,
    )
    _by_memory = GpuStepOperator(
        task_id="by_memory", python_callable=on_a_share, gpu_share="40GiB", accelerator="H100", **REST, **ONCE
    )
    _climbs = GpuStepOperator(
        task_id="climbs",
        python_callable=on_a_share,
        op_args=[True],
        gpu_count=0.5,
        accelerator="A100",
        on_oom=OomEscalation(),
        **SLURM,
        **AGAIN,
    )
    _quarter >> _by_memory >> _climbs
