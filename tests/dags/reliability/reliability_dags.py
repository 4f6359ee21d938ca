"""DAGs of the failure matrix (tests/reliability): one per backend and scenario, each run by a worker process.

``reliability_<backend>_<scenario>``: one GpuStepOperator that asks for a GPU of the host's configured inventory
(``AIRFLOW__GPU__DEVICES``, set by the matrix) and does what the scenario says. No retries: one try per run.
A matrix worker names its DAG in ``AIRFLOW_GPU_MATRIX_DAG``: the file then defines only that one (its parse, and
``dag.test()``'s parse of the matrix's bundle, this folder, cost one DAG instead of ~55). Without it, every DAG.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings

START = datetime.datetime(2024, 1, 1)
BASE_IMAGE = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
MISSING_PACKAGE = "airflow-gpu-provider-no-such-package==0.0.1"
#: Set by the matrix: a folder where scenarios name the processes it must count that carry no token of its run
PIDS_VARIABLE = "AIRFLOW_GPU_MATRIX_PIDS"
#: Set by the matrix: a password-protected index (credentials in the URL) that answers as slowly as it is told
INDEX_VARIABLE = "AIRFLOW_GPU_MATRIX_INDEX"
#: Set by the matrix for its workers: the one DAG the file defines (unset: all of them)
DAG_VARIABLE = "AIRFLOW_GPU_MATRIX_DAG"
#: Set by the matrix: the Jobs API of its Ray cluster (tests/backends/ray/ray_cluster.py)
RAY_VARIABLE = "AIRFLOW_GPU_TEST_RAY_ADDRESS"
#: What a Ray or Slurm job gets of its worker's environment, so that the matrix finds its processes and files
RAY_PASSED = ("AIRFLOW_GPU_MATRIX_RUN", PIDS_VARIABLE, "TMPDIR")
PRIVATE_PACKAGE = "airflow-gpu-private==1.0"


def succeeds() -> int:
    return 42


def raises() -> None:
    raise ValueError("the scenario's own error")


def exits_abruptly() -> None:
    import os

    os._exit(7)  # no result, no exception: the process is gone


def runs_out_of_memory() -> None:
    import resource

    # The container's limit stops Docker and Kubernetes tasks first; the local backend does not enforce memory,
    # so the scenario caps its own address space there (the host's memory is not the test's to exhaust).
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    hog = []
    while True:
        hog.append(bytearray(32 << 20))


def sleeps() -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(600)


def sleeps_beside_a_setsid_grandchild() -> None:
    import subprocess
    import time

    # The task process dies with its worker (PR_SET_PDEATHSIG); a grandchild out of its session does not.
    subprocess.Popen(["sleep", "600"], start_new_session=True, stdout=subprocess.DEVNULL)
    print("sleeping", flush=True)
    time.sleep(600)


def leaves_a_background_child() -> str:
    import subprocess

    subprocess.Popen(["sleep", "600"])  # inherits stdout: the pipe stays open after the function returns
    return "done"


def leaves_a_setsid_grandchild() -> str:
    import subprocess

    subprocess.Popen(["sleep", "600"], start_new_session=True, stdout=subprocess.DEVNULL)
    return "done"


def leaves_an_escaped_child() -> str:
    import os
    import shutil
    import signal

    sleep = shutil.which("sleep") or "/bin/sleep"
    child = os.fork()
    if child == 0:  # out of the task's group, none of its descriptors (GPU locks), no environment (no token)
        os.setpgid(0, 0)
        os.closerange(3, 65536)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignored across execve: only SIGKILL ends it
        os.execve(sleep, ["sleep", "600"], {})
    folder = os.environ.get("AIRFLOW_GPU_MATRIX_PIDS")
    if folder:  # the matrix counts it by its pid and start time: it carries nothing of the run
        with open(f"/proc/{child}/stat") as stat, open(os.path.join(folder, str(child)), "w") as handle:
            handle.write(stat.read().rsplit(")", 1)[1].split()[19])
    return "done"


def prints_a_flood() -> int:
    import sys

    sys.stdout.write("x" * 16_000_000 + "\n")  # one 16 MB line
    for i in range(20_000):
        sys.stdout.write(f"line {i}\r" if i % 2 else f"line {i}\n")
    sys.stdout.flush()
    return 1


#: scenario -> the operator arguments that make it (on top of the common ones)
SCENARIOS: dict[str, dict[str, Any]] = {
    "success": {"python_callable": succeeds},
    "exception": {"python_callable": raises},
    "non-zero exit": {"command": ["python3", "-c", "import sys; sys.exit(3)"]},
    "os._exit": {"python_callable": exits_abruptly},
    "out of memory": {"python_callable": runs_out_of_memory, "memory": "256Mi"},
    "execution_timeout": {"python_callable": sleeps, "execution_timeout": datetime.timedelta(seconds=4)},
    "on_kill": {"python_callable": sleeps},
    "worker SIGKILL": {"python_callable": sleeps_beside_a_setsid_grandchild},
    "background child": {"python_callable": leaves_a_background_child},
    "setsid grandchild": {"python_callable": leaves_a_setsid_grandchild},
    "huge output": {"python_callable": prints_a_flood},
    "missing GPU": {"python_callable": succeeds, "gpu_count": 3, "on_missing_gpu": "fail"},
    "failed install": {"python_callable": succeeds, "requirements": [MISSING_PACKAGE]},
    "escaped child": {"python_callable": leaves_an_escaped_child},
    "worker SIGKILL in image build": {
        "python_callable": succeeds,
        "requirements": [PRIVATE_PACKAGE],
        "index_url": os.environ.get(INDEX_VARIABLE, "http://alice:token@127.0.0.1:9/simple"),
    },
}


def dag_id(backend: str, scenario: str) -> str:
    """The DAG of one cell of the matrix."""
    return f"reliability_{backend}_{scenario.replace(' ', '_').replace('.', '_')}"


def operator_arguments(backend: str, scenario: str) -> dict[str, Any]:
    """Everything the cell's GpuStepOperator is given (the Kubernetes cells render it instead of running it)."""
    deferred = backend == "docker-deferred"  # the Docker backend, its container run while the task is deferred
    backend = "docker" if deferred else backend
    arguments: dict[str, Any] = {
        "task_id": "task",
        "backend": backend,
        "gpu_count": 1,
        "on_missing_gpu": "cpu",  # a GPU of the configured inventory, or the CPU where it cannot be used
        "retries": 0,
        **SCENARIOS[scenario],
    }
    if backend != "local" or "index_url" in arguments:
        requirements, index_url = arguments.pop("requirements", []), arguments.pop("index_url", None)
        parent = {} if backend == "local" else {"parent_image": BASE_IMAGE}
        arguments["image"] = ImageSettings(requirements=requirements, index_url=index_url, **parent)
    if backend == "docker":  # derived images under the tests' name: removed at the end of the session
        arguments["backend_options"] = {"stop_timeout": 2, "repository": "airflow-gpu-test-derived"}
        # the killed worker's container is the reaper's: the re-run is another DAG, not the task instance's next try
        arguments["durable"] = False
        arguments["deferrable"] = deferred
    if backend == "local":
        arguments["backend_options"] = {"kill_grace": 2}
    if backend == "ray":  # a job on the matrix's cluster, carrying the run's token into its processes
        environment = {name: os.environ[name] for name in RAY_PASSED if name in os.environ}
        arguments["image"] = ImageSettings(requirements=arguments["image"].requirements, environment=environment)
        arguments["backend_options"] = {"kill_grace": 2}  # the ray_default connection: the matrix's cluster
        arguments["durable"] = False  # as the Docker cells: the killed worker's job is the orphan reaper's
    if backend == "slurm":  # a batch job on the tests' cluster, carrying the run's token into its processes
        environment = {name: os.environ[name] for name in RAY_PASSED if name in os.environ}
        arguments["image"] = ImageSettings(requirements=arguments["image"].requirements, environment=environment)
        arguments["backend_options"] = {"kill_grace": 2}  # slurm_default: the matrix's cluster (allowed by default)
        arguments["durable"] = False  # as the Docker cells: the killed worker's job is the orphan reaper's
    return arguments


_ONLY = os.environ.get(DAG_VARIABLE)  # a matrix worker's parse: only its own DAG
for _backend in ("local", "docker", "docker-deferred", "ray", "slurm"):
    for _scenario in SCENARIOS:
        if _backend in ("ray", "slurm") and _scenario == "worker SIGKILL in image build":
            continue  # an index URL with credentials is refused at parse on Ray and Slurm
        if _ONLY and dag_id(_backend, _scenario) != _ONLY:
            continue
        with DAG(dag_id(_backend, _scenario), schedule=None, start_date=START, tags=["reliability"]):
            GpuStepOperator(**operator_arguments(_backend, _scenario))
