"""Ray backend speed, side by side in one run on a real one-node Ray cluster started here.

A trivial task (print a time stamp) run by ``GpuStepOperator(backend="ray").execute()`` vs the same job submitted
by hand with ``ray job submit`` (the CLI waits for the job and streams its log, as the operator does), interleaved,
both with the cluster's token (token auth on, as the tests' cluster runs):

* submit-to-function-start: from the call to the moment the function (or the hand-written script) starts, as the
  job itself stamps it;
* end to end: from the call until the call returns.

Goal: the operator within 1.1x of the hand submission plus one poll interval (``[gpu] poll_interval``).

    python benchmarks/ray_submit.py [--runs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from _common import submit_report

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "backends" / "ray"))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-gpu-bench-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__GPU__STATE_DIR", os.path.join(os.environ["AIRFLOW_HOME"], "gpu-state"))

SCRIPT = "import time; print('STARTED', time.time(), flush=True)"
TOKEN: dict[str, str] = {}  # the CLI's token (Ray's own variables), once the cluster runs


def stamp() -> float:
    import time

    return time.time()


def context() -> dict:
    ti = SimpleNamespace(dag_id="bench", task_id="ray", run_id="bench", try_number=1, map_index=-1)
    return {"ti": ti}


def by_operator(address: str) -> tuple[float, float]:
    """The operator, reaching the cluster through ``ray_default`` (its password: the token)."""
    from airflow_gpu_provider import GpuStepOperator

    operator = GpuStepOperator(task_id="ray", python_callable=stamp, backend="ray")
    started = time.time()
    function_start = operator.execute(context())
    return function_start - started, time.time() - started


def by_hand(address: str) -> tuple[float, float]:
    started = time.time()
    out = subprocess.run(
        [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", address, "--", "python", "-c",
         SCRIPT],
        capture_output=True, text=True, check=True, env={**os.environ, **TOKEN},
    ).stdout  # fmt: skip
    function_start = float(re.search(r"STARTED (\S+)", out)[1])  # type: ignore[index]
    return function_start - started, time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    runs = parser.parse_args().runs
    from ray_cluster import ray_cluster

    from airflow_gpu_provider.config.worker import GpuConfig

    poll = GpuConfig.read().poll_interval
    with ray_cluster(nodes=1) as cluster:
        connection = {"conn_type": "ray", "password": cluster.token, "extra": {"address": cluster.address}}
        os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps(connection)
        TOKEN.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token)
        by_operator(cluster.address), by_hand(cluster.address)  # warm-up: the first job's worker start
        times: dict[str, list[tuple[float, float]]] = {"operator": [], "ray job submit": []}
        for _ in range(runs):
            times["operator"].append(by_operator(cluster.address))
            times["ray job submit"].append(by_hand(cluster.address))
    print(f"{runs} runs each, interleaved; poll interval {poll}s")
    submit_report(times, "operator", "ray job submit", poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
