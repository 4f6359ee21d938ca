"""Deferred GPU tasks through a real Airflow: scheduler with LocalExecutor, DAG processor, API server, and a real
``airflow triggerer``, set up as docs/deferrable.md recommends for a GPU host: ``[triggerer] queues_enabled = True``,
the host's tasks on its queue, and a triggerer started for that queue (``airflow triggerer --queues gpu-host-1``).

The host lists one GPU (``[gpu] devices = 0``). Two tasks that each need it: one runs, the other is seen ``deferred``
(no worker slot, no GPU) until the first ends, then runs on the same GPU. A wait that reaches its ``wait_timeout``
fails naming it. A Docker container runs while its task is ``deferred`` and the triggerer watches it and logs its
output as it comes (the task log the API server returns has each line once, at its own time); a worker resumes the
task and pushes its result; the orphan reaper in that task leaves alone a
durable container of another Airflow on the same engine. States are polled in the metadata DB; the
leftovers (the provider's containers, keeper processes, held GPU locks, task folders, temp dirs) are counted after
each run.

The wait tests use the local backend: on a host without the NVIDIA runtime a Docker task that gets the GPU cannot
start with it, and only ``on_missing_gpu="cpu"`` runs it anyway, which never waits. The deferred wait is the same
code on both backends (the host allocator raises ``MustWait``, ``GpuFreeTrigger`` reads the host's locks).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from cluster import AIRFLOW, Cluster
from conftest import REPO

from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.waiting import free_count
from airflow_gpu_provider.host.workers import started_at
from airflow_gpu_provider.task.labels import docker_label

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
DAG_FILE = REPO / "tests" / "dags" / "scheduler_deferral_dags.py"
QUEUE = "gpu-host-1"  # the DAG file's
KEEPER = "airflow_gpu_provider.host.keeper"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("deferred")
    dags, home = root / "dags", root / "home"
    dags.mkdir()
    (home / "tmp").mkdir(parents=True)
    shutil.copy(DAG_FILE, dags)
    cluster = Cluster(
        home,
        dags,
        {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__TRIGGERER__QUEUES_ENABLED": "True",
            "AIRFLOW__GPU__DEVICES": "0",  # no real GPU here: the allocator hands out the listed one
            "AIRFLOW__GPU__POLL_INTERVAL": "0.5",
            "TMPDIR": str(home / "tmp"),  # every process's temp files, counted after each run
        },
    )
    try:
        cluster.start_airflow()
        cluster.start("triggerer", [*AIRFLOW, "triggerer", "--queues", QUEUE])
        yield cluster
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], leftovers


# ---------------------------------------------------------------------- helpers
def lock_file(cluster: Cluster) -> str:
    """GPU 0's lock file in the cluster's ``[gpu] state_dir``."""
    return str(GpuAllocator(cluster.home / "gpu-state" / "locks").lock_path(Device("0")))


def gpu_held(cluster: Cluster) -> bool:
    """Whether someone holds GPU 0's lock, read from /proc/locks (without taking it)."""
    return free_count([lock_file(cluster)]) == 0


def containers(client: Any, run_id: str) -> dict[str, str]:
    """``{id: status}`` of the provider's containers of one run."""
    found = client.containers(all=True, filters={"label": f"{docker_label('run_id')}={run_id}"})
    return {c["Id"]: c["State"] for c in found}


def keepers(cluster: Cluster) -> list[int]:
    """The cluster's live GPU-lock keeper processes."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            alive = KEEPER in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE
            if alive and process.environ().get("AIRFLOW_HOME") == str(cluster.home):
                found.append(process.info["pid"])
    return found


def trigger_queues(cluster: Cluster, dag_id: str, run_id: str) -> set[str | None]:
    """The queues of the triggers the run's deferred task instances wait on."""
    rows = cluster.query(
        'SELECT t.queue FROM task_instance ti JOIN "trigger" t ON ti.trigger_id = t.id '
        "WHERE ti.dag_id = ? AND ti.run_id = ?",
        dag_id,
        run_id,
    )
    return {row[0] for row in rows}


def assert_triggers_on_the_gpu_queue(looks: list[dict[str, Any]]) -> None:
    """The triggers seen while tasks were deferred were on the GPU host's queue (around a deferral's start and end a
    deferred task instance may have no trigger row yet, or no more).
    """
    seen = [look["trigger_queues"] for look in looks if look.get("trigger_queues")]
    assert seen and all(queues == {QUEUE} for queues in seen), seen


def watch(
    cluster: Cluster, dag_id: str, run_id: str, probe: Callable[[], dict[str, Any]] | None = None, timeout: float = 180
) -> tuple[str, list[dict[str, Any]]]:
    """Trigger the run and look at it every 0.3 s until it ends: its state and every look (task states, probe)."""
    cluster.wait_for_dag(dag_id)
    cluster.trigger(dag_id, run_id)
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [name for name, process in cluster.processes.items() if process.poll() is not None]
        assert not dead, f"{dead} exited:\n{cluster.logs()}"
        with contextlib.suppress(sqlite3.OperationalError):  # the scheduler writes: try again
            states = {task: ti["state"] for task, ti in cluster.task_instances(dag_id, run_id).items()}
            look = {"at": time.time(), "states": states, **(probe() if probe else {})}
            if any(state == "deferred" for state in states.values()):
                look["trigger_queues"] = trigger_queues(cluster, dag_id, run_id)
            seen.append(look)
            run = cluster.query("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
            if run and run[0][0] in ("success", "failed"):
                return run[0][0], seen
        time.sleep(0.3)
    raise AssertionError(f"{run_id} did not end in {timeout}s; last seen {seen[-1:]}:\n{cluster.logs()}")


def task_log(cluster: Cluster, dag_id: str, run_id: str, task_id: str) -> str:
    """The task's log file (its first try), as the worker wrote it: the deferral and the resume together."""
    folder = cluster.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    return (folder / "attempt=1.log").read_text(errors="replace")


def task_error(log: str) -> tuple[str, str]:
    """``(exception type, message)`` of the failure a task log reports (its JSON lines)."""
    for line in reversed(log.splitlines()):
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "Task failed with exception":
                detail = record["error_detail"][-1]
                return detail["exc_type"], detail["exc_value"]
    raise AssertionError(f"the task log reports no failure:\n{log[-3000:]}")


def assert_no_leftovers(cluster: Cluster, client: Any = None, run_id: str = "") -> None:
    """Nothing of the run is left: containers, keepers, a held GPU lock, task folders, provider temp dirs."""
    state_dir = cluster.home / "gpu-state"
    deadline = time.monotonic() + 15  # a resumed worker's last clean-up may trail the run's end by a moment
    while True:
        left = {
            "containers": containers(client, run_id) if client is not None else {},
            "keepers": keepers(cluster),
            "GPU 0 held": gpu_held(cluster),
            "task folders": [str(p) for folder in ("tasks", "docker-tasks") for p in (state_dir / folder).glob("*")],
            "temp dirs": [str(p) for p in (cluster.home / "tmp").glob("airflow-gpu-*")],
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), left


# ---------------------------------------------------------------------- the wait
def test_the_second_task_waits_deferred_while_the_first_holds_the_only_gpu(cluster):
    run_id = "wait_run"
    go = cluster.home / "go"  # the DAG file's GO: the holder works until the test has seen the other one wait
    waits_seen: list[float] = []

    def probe() -> dict[str, Any]:
        held = gpu_held(cluster)
        tis = cluster.task_instances("sched_gpu_wait", run_id)
        states = sorted(str(tis.get(task, {}).get("state")) for task in ("first", "second"))
        if held and states == ["deferred", "running"]:
            waits_seen.append(time.time())
        if len(waits_seen) >= 3:  # a second of one running and the other deferred
            go.touch()
        return {"gpu_held": held}

    try:
        state, seen = watch(cluster, "sched_gpu_wait", run_id, probe)
    finally:
        go.unlink(missing_ok=True)
    tis = cluster.task_instances("sched_gpu_wait", run_id)
    assert state == "success" and {ti["state"] for ti in tis.values()} == {"success"}, f"{tis}\n{cluster.logs()}"
    # which task got the GPU first is a race; the other one is seen deferred, not running, while the first runs
    both = [look for look in seen if sorted(map(str, look["states"].values())) == ["deferred", "running"]]
    assert both, f"never saw one task running and the other deferred: {[look['states'] for look in seen]}"
    waiter = next(task for task, value in both[0]["states"].items() if value == "deferred")
    holder = "second" if waiter == "first" else "first"
    assert_triggers_on_the_gpu_queue(both)  # the waiting task's trigger went to the GPU host's triggerer
    # both ran on the one GPU, one after the other: the functions' times do not overlap
    results = {task: cluster.xcom("sched_gpu_wait", run_id, task) for task in ("first", "second")}
    assert results["first"]["gpu"] == results["second"]["gpu"] == "0", results
    assert results[waiter]["started"] >= results[holder]["ended"], results
    # the GPU was taken all the while the other task waited (until the holder's function ended and let it go)
    assert all(look["gpu_held"] for look in both if look["at"] < results[holder]["ended"]), both
    # from the GPU's release (seen in /proc/locks) to the waiting task running again, as polled every 0.3 s
    after = [look for look in seen if look["at"] > results[holder]["ended"]]
    freed = next(look["at"] for look in after if not look["gpu_held"])
    resumed = next(look["at"] for look in after if look["at"] > freed and look["states"][waiter] == "running")
    print(f"\nGPU free -> the waiting task running again: {resumed - freed:.1f}s")
    log = task_log(cluster, "sched_gpu_wait", run_id, waiter)
    assert "Deferred until they are free (on_missing_gpu='wait', deferrable=True" in log, log[-3000:]
    assert "GPUs free after" in log and "on GPU 0" in log, log[-3000:]
    assert_no_leftovers(cluster)


def test_a_wait_that_reaches_its_limit_fails_naming_it(cluster):
    allocator = GpuAllocator(cluster.home / "gpu-state" / "locks")
    held = allocator.try_acquire([Device("0")], 1, "the test's other job")
    assert held is not None
    try:
        started = time.monotonic()
        state, seen = watch(cluster, "sched_gpu_wait_limit", "limit_run")
        took = time.monotonic() - started
    finally:
        held.release()
    tis = cluster.task_instances("sched_gpu_wait_limit", "limit_run")
    assert state == "failed" and tis["gives_up"]["state"] == "failed", f"{tis}\n{cluster.logs()}"
    assert any(look["states"].get("gives_up") == "deferred" for look in seen)  # it waited deferred
    assert took < 90, took  # the 3 s limit, plus the run's start and the resume
    log = task_log(cluster, "sched_gpu_wait_limit", "limit_run", "gives_up")
    assert "held by the test's other job" in log, log[-3000:]
    kind, message = task_error(log)
    assert kind == "GpuUnavailableError" and re.match(r"Waited \d+s for 1x nvidia GPU ", message), message
    assert "reached the wait's limit of 3s (the task's wait_timeout, else [gpu] wait_timeout)" in message
    assert cluster.xcom("sched_gpu_wait_limit", "limit_run", "gives_up") is None  # it never ran
    assert_no_leftovers(cluster)


# ---------------------------------------------------------------------- a deferred Docker task
@pytest.fixture
def foreign_container(docker_client: Any) -> Iterator[str]:
    """A durable container of another Airflow on the same engine: its worker has exited, its task instance is not
    this cluster's. The cluster's Docker task reaps orphans before it starts; it must leave this one alone.

    It has the labels the reaper reads, but not the provider's own (``airflow-gpu-provider``), which other test
    sessions on the same engine count as theirs when its worker is dead (docker_fixtures.container_ids).
    """
    from docker.errors import NotFound

    worker = subprocess.Popen(["sleep", "0"])
    identity = f"{socket.gethostname()}:{worker.pid}:{started_at(worker.pid)}"
    worker.wait()
    labels = {docker_label("worker"): identity, docker_label("durable"): "true", docker_label("auto-remove"): "force"}
    labels[docker_label("deployment")] = "another-airflow"  # what durable.deployment() names, for another one
    labels |= {docker_label(k): v for k, v in (("dag_id", "elsewhere"), ("task_id", "t"), ("run_id", "r"))}
    created = docker_client.create_container(BASE_IMAGE, ["sleep", "300"], labels=labels)["Id"]
    docker_client.start(created)
    yield created
    with contextlib.suppress(NotFound):
        docker_client.remove_container(created, force=True)


@pytest.mark.docker
def test_a_deferred_docker_task_is_watched_by_the_triggerer_and_resumed(cluster, docker_client, foreign_container):
    run_id = "docker_run"

    folder = cluster.home / "logs" / "dag_id=sched_docker_deferred" / f"run_id={run_id}" / "task_id=task"

    released: list[float] = []  # when the test let the function go (/tmp/go in the container)
    running_looks = 0

    def probe() -> dict[str, Any]:
        nonlocal running_looks
        trigger_logs = "".join(p.read_text(errors="replace") for p in folder.glob("attempt=1.log.trigger.*.log"))
        look = {
            "containers": containers(docker_client, run_id),
            "gpu_held": gpu_held(cluster),
            "keepers": keepers(cluster),
            "output_logged": f"thinking about {run_id}" in trigger_logs,
        }
        deferred = cluster.task_instances("sched_docker_deferred", run_id).get("task", {}).get("state") == "deferred"
        running_looks += deferred and list(look["containers"].values()) == ["running"] and bool(look["keepers"])
        if not released and running_looks >= 5 and look["output_logged"]:  # seen all it waits for: let it go
            released.append(time.time())
            exec_id = docker_client.exec_create(next(iter(look["containers"])), ["touch", "/tmp/go"])["Id"]
            docker_client.exec_start(exec_id)
            assert docker_client.exec_inspect(exec_id)["ExitCode"] == 0
        return look

    state, seen = watch(cluster, "sched_docker_deferred", run_id, probe)
    tis = cluster.task_instances("sched_docker_deferred", run_id)
    assert state == "success" and tis["task"]["state"] == "success", f"{tis}\n{cluster.logs()}"
    deferred = [look for look in seen if look["states"]["task"] == "deferred"]
    assert deferred, [look["states"] for look in seen]
    # while the task held no worker slot, its container ran, GPU 0's lock was kept for it, and the trigger was
    # the GPU host's
    running = [look for look in deferred if list(look["containers"].values()) == ["running"] and look["keepers"]]
    assert len(running) >= 5 and released, deferred  # looked at every 0.3 s until the test let the function go
    assert all(look["gpu_held"] for look in running)  # by the keeper, for as long as the container's process runs
    assert_triggers_on_the_gpu_queue(deferred)
    assert cluster.xcom("sched_docker_deferred", run_id, "task") == {"question": run_id, "answer": 42}
    log = task_log(cluster, "sched_docker_deferred", run_id, "task")
    assert "GPUs ['0'] from the host allocator" in log and "running on CPU instead" in log, log[-3000:]
    assert "Deferred: the triggerer watches container" in log, log[-3000:]
    # the try was built once: the resume took it from the deferral (its rung too), not decided again
    assert log.count("[gpu] try 1: OOM escalation") == 1, log[-3000:]
    # the container's output reached the task log while the task was deferred: the triggerer wrote it
    assert any(look["output_logged"] for look in deferred), deferred
    # as the UI shows the task log (the worker's and the triggerer's merged): each line once, at its own time
    records = cluster.task_log_records("sched_docker_deferred", run_id, "task")
    marks = ("Deferred: the triggerer watches container", f"thinking about {run_id}", "the answer is ready",
             "output was logged while the task was deferred")  # fmt: skip
    found = [[r for r in records if mark in str(r.get("event"))] for mark in marks]
    assert [len(f) for f in found] == [1, 1, 1, 1], [str(r.get("event"))[:100] for r in records]
    times = [datetime.datetime.fromisoformat(f[0]["timestamp"]).timestamp() for f in found]
    # logged as they came, not together at the end: the first before the test let the function go (it had read it
    # in the triggerer's log), the second after
    assert times == sorted(times) and times[1] < released[0] <= times[2], (times, released)
    assert_no_leftovers(cluster, docker_client, run_id)
    # the orphan reaper ran in the task and left another deployment's durable container alone
    assert foreign_container[:12] not in log
    assert docker_client.inspect_container(foreign_container)["State"]["Running"]
