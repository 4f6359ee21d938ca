"""Slurm backend speed, side by side in one run on a real two-node Slurm cluster started here (the tests' own).

A trivial one-GPU task (print a time stamp) run by ``GpuStepOperator(backend="slurm").execute()`` through the
submit-host connection vs the same job submitted by hand with ``sbatch --wait`` (the same GRES, the same Python,
the script's output read back from the shared folder), interleaved:

* submit-to-function-start: from the call to the moment the function (or the hand-written script) starts, as the
  job itself stamps it;
* end to end: from the call until the call returns (the result read back).

Goal: the operator within 1.1x of the hand submission plus one poll interval (``[gpu] poll_interval``).

    python benchmarks/slurm_submit.py [--runs 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from _common import submit_report

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-gpu-bench-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__GPU__STATE_DIR", os.path.join(os.environ["AIRFLOW_HOME"], "gpu-state"))
os.environ["AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS"] = "slurm=slurm_bench"


def stamp() -> float:
    import time

    return time.time()


def by_operator(number: int) -> tuple[float, float]:
    """The operator, reaching the cluster as a submit host (the CLI) through ``slurm_bench``."""
    from airflow_gpu_provider import GpuStepOperator

    operator = GpuStepOperator(
        task_id="slurm", python_callable=stamp, backend="slurm", gpu_count=1, accelerator="A100",
        backend_options={"slurm_conn_id": "slurm_bench"},
    )  # fmt: skip
    ti = SimpleNamespace(
        dag_id="bench", task_id="slurm", run_id=f"bench-{number}", try_number=1, map_index=-1, stats_tags={}
    )
    started = time.time()
    function_start = operator.execute({"ti": ti, "task": operator})  # type: ignore[arg-type]
    return function_start - started, time.time() - started


def by_hand(cluster: object, number: int) -> tuple[float, float]:
    """``sbatch --wait`` of a script that stamps the time with the same Python, its output read back."""
    shared: Path = cluster.shared  # type: ignore[attr-defined]
    output = shared / f"hand-{number}.out"
    script = shared / f"hand-{number}.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -c 'import time; print(time.time())'\n")
    started = time.time()
    subprocess.run(
        ["sbatch", "--wait", "--quiet", "--gres=gpu:a100:1", f"--output={output}", str(script)],
        env=cluster.env, check=True, capture_output=True,  # type: ignore[attr-defined]
    )  # fmt: skip
    function_start = float(output.read_text().split()[-1])
    return function_start - started, time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    runs = parser.parse_args().runs
    from backends.slurm.slurm_cluster import slurm_cluster, why_not

    from airflow_gpu_provider.config.worker import GpuConfig

    reason = why_not()
    if reason is not None:
        print(f"slurm_submit: skipped: {reason}")
        return 0
    poll = GpuConfig.read().poll_interval
    with slurm_cluster() as cluster:
        os.environ["AIRFLOW_CONN_SLURM_BENCH"] = cluster.connection()
        by_operator(0), by_hand(cluster, 0)  # warm-up: the nodes' first Python start, the runtime's folder
        times: dict[str, list[tuple[float, float]]] = {"operator": [], "sbatch --wait": []}
        for number in range(1, runs + 1):
            times["operator"].append(by_operator(number))
            times["sbatch --wait"].append(by_hand(cluster, number))
    load = os.getloadavg()[0]
    print(f"{runs} runs each, interleaved; poll interval {poll}s; load average {load:.1f}")
    submit_report(times, "operator", "sbatch --wait", poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
