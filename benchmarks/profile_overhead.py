"""The profile's cost: the same GPU task with ``[gpu] profile_interval`` 1 s and 0 (off), side by side (goal <= 1.02x).

The task is ``GpuStepOperator.execute()`` on the local backend (envelope, allocator, child runtime, result): a
fixed amount of CPU work (a torch matmul loop, about 2 s) so that the sampler's own CPU time shows against it.
Runs interleave (on, off, on, off, ...) so drift hits both alike.

Rows:
- the CPU profile (no NVML here: ``/proc`` of the task's process tree) at the default 1 s interval;
- the NVML path at 1 s, against the recorded-stream replay of ``tests/nvml_replay`` (when gcc can build it): it
  measures the runtime's ctypes calls, not a real driver's (on a GPU machine, run this there for that figure).

Run: ``.venv/bin/python benchmarks/profile_overhead.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from _common import REPO, airflow_home, alternate, report


def work(seconds_of_work: int) -> float:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    total = 0.0
    for _ in range(seconds_of_work * 400):
        total += float((a @ a).sum())
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    runs = parser.parse_args().runs
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "ERROR"  # the task logs would bury the table
    airflow_home()
    from airflow_gpu_provider import GpuStepOperator

    ti = SimpleNamespace(
        dag_id="bench", task_id="bench", run_id="r", try_number=1, map_index=-1, xcom_push=lambda **_: None
    )

    def execute(operator: GpuStepOperator, profile: bool) -> object:
        os.environ["AIRFLOW__GPU__PROFILE_INTERVAL"] = "1.0" if profile else "0"
        return operator.execute({"ti": ti})

    cpu_task = GpuStepOperator(task_id="bench", python_callable=work, op_args=[3], cpu_count=1)
    execute(cpu_task, True)  # warm: page cache, bytecode
    ratios = {
        "CPU (/proc)": report(
            "Task with the CPU profile (1 s) vs without",
            alternate(runs, on=lambda: execute(cpu_task, True), off=lambda: execute(cpu_task, False)),
            baseline="off",
            goal="<= 1.02x",
        )
    }
    sys.path.insert(0, str(REPO / "tests"))
    from nvml_replay import RECORDINGS, ReplayBuildError, build, replay_environment

    recording = RECORDINGS / "rtx4090_1gpu.csv"
    try:
        os.environ.update(replay_environment(recording, build(Path(os.environ["AIRFLOW_HOME"]) / "nvml")))
    except ReplayBuildError as err:
        print(f"\n(NVML replay row skipped: {err})")
    else:  # the task gets the recorded GPU (by UUID) and its child process loads the replay as NVML
        os.environ["AIRFLOW__GPU__DEVICES"] = recording.read_text().splitlines()[1].split(", ")[2]
        gpu_task = GpuStepOperator(task_id="bench", python_callable=work, op_args=[3], cpu_count=1, gpu_count=1)
        ratios["NVML (replay)"] = report(
            "Task with the NVML profile (replayed stream, 1 s) vs without",
            alternate(runs, on=lambda: execute(gpu_task, True), off=lambda: execute(gpu_task, False)),
            baseline="off",
            goal="<= 1.02x",
        )
    print("\n| profile | ratio (on / off) | goal |\n| --- | --- | --- |")
    for name, ratio in ratios.items():
        print(f"| {name} | {ratio:.3f}x | <= 1.02x |")


if __name__ == "__main__":
    main()
