"""The failure matrix: every backend through every way a task can end, and what each one leaves behind.

Local and Docker cells run a real Airflow worker (``worker.py``: ``dag.test()``, the real task runner) on a DAG of
``tests/dags/reliability/reliability_dags.py``, in a place of the cell's own (``places.py``: a fresh state dir with
two configured GPUs, a copy of the tests' Airflow DB). The matrix signals that worker as Airflow would (SIGTERM:
on_kill) or as the kernel would (SIGKILL, then a re-run of the task on the same host) once the scenario's function
runs (it says so).
Kubernetes cells render the task's pod with the real provider code and run its containers in Docker
(``pod_in_docker``); the cells that need a Kubernetes API server are reported as not run, with the reason. Ray
cells run a real worker whose task is a job on the tests' two-node Ray cluster (tests/backends/ray/ray_cluster.py),
Slurm cells one whose task is a batch job on the tests' Slurm cluster (tests/backends/slurm/slurm_cluster.py).

After each cell the leftovers are counted against a snapshot taken before it: processes, containers, held GPU
locks, task folders and temp dirs, images (a failed or killed build's steps), and the Ray cluster's jobs, actors and
placement groups. Every count must be 0. Only the cell's own are counted (``leftovers.py``: a token of the cell, its
workers' identities, its labels and folders), so the matrix holds while other cells (``lanes.py``) and other
provider tasks run on the same host and engine.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "backends" / "kubernetes"))
sys.path.insert(0, str(TESTS))

from reliability.leftovers import LEFTOVERS, RUN_LABEL, settle, snapshot  # noqa: E402
from reliability.places import Place, Setup, run_worker  # noqa: E402
from reliability_dags import INDEX_VARIABLE, PRIVATE_PACKAGE, SCENARIOS, dag_id, operator_arguments  # noqa: E402

#: ``docker-deferred``: the Docker backend with ``deferrable=True`` (``dag.test()`` runs its trigger in line)
BACKENDS = ("local", "docker", "docker-deferred", "kubernetes", "ray", "slurm")
BUILD_KILLED = "worker SIGKILL in image build"

#: scenario -> (state the task must end in, what its log must show: one pattern per backend, or one for all)
EXPECTED: dict[str, tuple[str, str | dict[str, str]]] = {
    "success": ("success", ""),
    "exception": ("failed", r"ValueError.*the scenario's own error"),
    "non-zero exit": ("failed", r"exited with status 3"),
    "os._exit": ("failed", r"status 7"),
    "out of memory": (
        "failed",
        {
            "local": r"MemoryError",
            "docker": r"out of memory",
            "kubernetes": r"status 137",
            "ray": r"out of host memory",
            "slurm": r"ended OUT_OF_MEMORY",
        },
    ),
    "execution_timeout": ("failed", r"AirflowTaskTimeout|Timeout"),
    "on_kill": (
        "failed",
        {
            "local": r"status -15",
            "docker": r"status 1?43|Killing|stopp",
            "ray": r"Stopping Ray job",
            "slurm": r"Cancel",
        },
    ),
    # local: the killed worker's supervisor stopped its task and freed its GPU: the re-run gets GPU 0 again
    "worker SIGKILL": (
        "success",
        {
            "local": r"--- re-run ---(.|\n)*Starting task process on GPUs \['0'\]",
            "docker": r"left running by a worker",
            "ray": r"Stopped Ray job \S+, left running by a worker that died",
            "slurm": r"Cancelled Slurm job \S+, left running by a worker that died",
        },
    ),
    "background child": ("success", ""),
    "setsid grandchild": ("success", ""),
    "huge output": ("success", ""),
    "missing GPU": (
        "failed",
        {
            **dict.fromkeys(("local", "docker"), r"Requested 3x nvidia GPU but this host has 2 GPU"),
            "ray": r"Requested 3x nvidia GPU but the Ray cluster has 0 node",
            "slurm": r"no partition of the cluster can ever run 3x nvidia GPU",
        },
    ),
    "failed install": ("failed", r"airflow-gpu-provider-no-such-package"),
    "escaped child": ("success", {"local": r"stopping processes \[\d+\] that the task left running"}),
    BUILD_KILLED: ("success", r"left by a build whose worker died"),
}

#: Kubernetes cells that need an API server (none can be had here): why, and what covers them instead
NEEDS_API_SERVER = {
    "execution_timeout": "KPO deletes the pod on timeout: needs an API server",
    "on_kill": "KPO deletes the pod in on_kill: needs an API server",
    "worker SIGKILL": "the pod outlives its worker by design; KPO's reattach/cleanup needs an API server",
    "missing GPU": "an unschedulable pod stays Pending (pending.py reads its events): needs a scheduler",
}
#: Cells that do not apply to their backend: why
NOT_RUN = {
    **{("kubernetes", scenario): why for scenario, why in NEEDS_API_SERVER.items()},
    ("local", BUILD_KILLED): "the local backend builds no image (its requirements go into a venv)",
    ("kubernetes", BUILD_KILLED): "no image is built: an init container installs the requirements in the pod",
    ("docker-deferred", "on_kill"): "a deferred task has no worker to signal: a user's kill reaches the trigger's "
    "on_kill (test_local_airflow.py: test_a_user_ending_a_deferred_docker_task_stops_its_container)",
    ("ray", BUILD_KILLED): "no image is built: the cluster installs the requirements (runtime_env), and an index URL "
    "with credentials is refused at parse",
    ("slurm", BUILD_KILLED): "no image is built: the job installs the requirements, and an index URL with "
    "credentials is refused at parse",
    ("docker-deferred", "worker SIGKILL"): "the killed dag.test() leaves its task instance deferred, so its durable "
    "container is spared by design (a triggerer would go on watching it); a killed worker's next try reattaching: "
    "tests/executors/test_reattach.py",
}


@dataclass
class Cell:
    """One run of the matrix: what happened, what it should have been, and what it left."""

    backend: str
    scenario: str
    state: str = "not run"
    expected_state: str = ""
    evidence: bool = False
    leftovers: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""
    log: str = ""

    @property
    def ran(self) -> bool:
        return self.state != "not run"

    @property
    def ok(self) -> bool:
        return self.ran and self.state == self.expected_state and self.evidence and not any(self.leftovers.values())

    def counts(self) -> dict[str, int]:
        return {name: len(self.leftovers.get(name, ())) for name in LEFTOVERS}


# ----------------------------------------------------------------------------------------------- cells
def _build_killed(place: Place, backend: str) -> tuple[str, str, str]:
    """A worker killed while its image's install runs (a slow index), then the task again: (state, log, note).

    The task runs again with a rotated token (another index): nothing it builds can reuse what the killed build left.
    """
    from backends.docker.docker_fixtures import make_wheel
    from private_index import docker_host_address, private_index

    from airflow_gpu_provider import ImageSettings

    wheels, host = place.scope.tmp / "private-wheels", docker_host_address()
    make_wheel(wheels, "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
    with private_index(wheels, delay=60) as slow, private_index(wheels, password="rotated-token") as rotated:
        for index in (slow, rotated):
            requirements = ImageSettings(requirements=[PRIVATE_PACKAGE], index_url=index.url(host)).requirements_hash
            place.scope.requirements.add(requirements)
        killed, first = run_worker(
            place, backend, BUILD_KILLED, interrupt=signal.SIGKILL, environment={INDEX_VARIABLE: slow.url(host)},
            started=lambda: slow.requests > 0,  # the build's installer asks the index
        )  # fmt: skip
        state, rerun = run_worker(place, backend, BUILD_KILLED, environment={INDEX_VARIABLE: rotated.url(host)})
    note = f"killed worker: {killed}; then the task ran again, its token rotated"
    return state, f"{first}\n--- re-run ---\n{rerun}", note


def _run_kubernetes(place: Place, scenario: str) -> tuple[str, str]:
    """Render the cell's pod with the real provider code and run its containers in Docker."""
    from airflow.sdk import DAG
    from pod_in_docker import run_pod

    from airflow_gpu_provider import GpuStepOperator
    from airflow_gpu_provider.exceptions import GpuTaskError
    from airflow_gpu_provider.task.result import result_value

    with DAG(dag_id("kubernetes", scenario), schedule=None):
        task = GpuStepOperator(**operator_arguments("kubernetes", scenario))
    run = run_pod(task.render_manifests(), labels={RUN_LABEL: place.scope.token}, tmp=place.scope.tmp)
    log = "\n".join(f"--- {name} (exit {run.exit_codes[name]})\n{text}" for name, text in run.logs.items())
    failed_init = [name for name, code in run.exit_codes.items() if code != 0 and name != "base"]
    if failed_init or "base" not in run.exit_codes:
        return "failed", log
    try:
        result_value(run.result, run.exit_codes["base"], where="the pod")
    except GpuTaskError as err:
        return "failed", f"{log}\n{err}"
    return "success", log


def run_cell(backend: str, scenario: str, setup: Setup) -> Cell:
    """Run one cell and count its leftovers."""
    cell = Cell(backend, scenario, expected_state=EXPECTED[scenario][0])
    if (backend, scenario) in NOT_RUN:
        cell.note = NOT_RUN[backend, scenario]
        return cell
    place = Place.of(setup, backend, f"{backend}-{dag_id(backend, scenario)}")
    try:
        _run(cell, place)
    finally:
        place.close()
    return cell


def _run(cell: Cell, place: Place) -> None:
    """Run the cell in its place; what it ended in, its log, and what it left."""
    backend, scenario = cell.backend, cell.scenario
    before = snapshot(place.scope, place.state_dir)
    started = time.monotonic()
    if backend == "kubernetes":
        cell.state, cell.log = _run_kubernetes(place, scenario)
    elif scenario == "on_kill":
        cell.state, cell.log = run_worker(place, backend, scenario, interrupt=signal.SIGTERM)
    elif scenario == "worker SIGKILL":
        killed, first = run_worker(place, backend, scenario, interrupt=signal.SIGKILL)
        cell.note = f"killed worker: {killed}; then the task ran again"
        cell.state, rerun = run_worker(place, backend, "success")  # the retry, on the same host
        cell.log = f"{first}\n--- re-run ---\n{rerun}"
    elif scenario == BUILD_KILLED:
        cell.state, cell.log, cell.note = _build_killed(place, backend)
    else:
        cell.state, cell.log = run_worker(place, backend, scenario)
    cell.seconds = time.monotonic() - started
    pattern = EXPECTED[scenario][1]
    if isinstance(pattern, dict):  # the deferred Docker column shows what the Docker column shows
        wanted = pattern.get(backend, pattern.get(backend.removesuffix("-deferred"), ""))
    else:
        wanted = pattern
    cell.evidence = not wanted or re.search(wanted, cell.log) is not None
    cell.leftovers = settle(place.scope, place.state_dir, before)


#: The scenarios ``make test`` runs: how a task ends that only a backend's reapers answer for. The others (success,
#: an exception, an exit code, OOM, a timeout, on_kill, output, a missing GPU, a failed install) each have a real run
#: per backend in its own tests; ``make reliability`` runs every cell (``AIRFLOW_GPU_MATRIX=full``).
REAPERS = ("worker SIGKILL", "setsid grandchild", "escaped child", BUILD_KILLED)


def cells(backends: tuple[str, ...] = BACKENDS) -> list[tuple[str, str]]:
    """The (backend, scenario) cells this run takes, scenario-major: every one under ``make reliability``."""
    full = os.environ.get("AIRFLOW_GPU_MATRIX") == "full"
    return [(backend, scenario) for scenario in SCENARIOS for backend in backends if full or scenario in REAPERS]


# ----------------------------------------------------------------------------------------------- report
def table(results: list[Cell]) -> str:
    """The matrix as a Markdown table: a row per scenario, a column per backend; a cell says ``ok`` and its wall
    time, else what went wrong (the task's state, the evidence missing, what it left); notes below the table."""
    backends = [b for b in BACKENDS if any(cell.backend == b for cell in results)]
    scenarios = [s for s in SCENARIOS if any(cell.scenario == s for cell in results)]
    found = {(cell.backend, cell.scenario): cell for cell in results}
    notes: list[str] = []
    rows = [["scenario", "task ends", *backends], ["---"] * (len(backends) + 2)]
    for scenario in scenarios:
        row = [scenario, EXPECTED[scenario][0]]
        for backend in backends:
            cell = found.get((backend, scenario))
            if cell is None:
                row.append("-")
            elif not cell.ran:
                if cell.note not in notes:
                    notes.append(cell.note)
                row.append(f"not run ({notes.index(cell.note) + 1})")
            elif cell.ok:
                row.append(f"ok {cell.seconds:.0f} s")
            else:
                wrong = [] if cell.state == cell.expected_state else [f"task {cell.state}"]
                wrong += [] if cell.evidence else ["no evidence in its log"]
                wrong += [f"{count} {name}" for name, count in cell.counts().items() if count]
                row.append("FAILED: " + ", ".join(wrong))
        rows.append(row)
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, "", *(f"({number}) {note}" for number, note in enumerate(notes, 1))]).rstrip()


def describe_failure(cell: Cell) -> str:
    """Why a cell failed, for the assertion message."""
    lines = [f"{cell.backend} / {cell.scenario}: task {cell.state} (expected {cell.expected_state})"]
    if not cell.evidence:
        lines.append(f"the log lacks {EXPECTED[cell.scenario][1]!r}")
    lines += [f"left: {name}: {items}" for name, items in cell.leftovers.items() if items]
    lines.append("log tail:\n" + "\n".join(cell.log.splitlines()[-40:]))
    return "\n".join(lines)
