"""Deferred Docker tasks for real: the container runs while the task is deferred, its trigger runs (in line, as
``dag.test()`` runs triggers), and the task resumes on a worker; a killed worker's container is taken over by the
task instance's next try.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from backends.docker.user_engines import engines
from helpers import start_worker, worker_result, worker_results

from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks", "airflow_home")]
TESTS = Path(__file__).resolve().parents[2]
DAG_FILE = TESTS / "dags" / "deferral_dags.py"


def _run(dag_id: str) -> tuple[dict, str]:
    """Run the DAG in a worker process: its task log is its output."""
    worker = start_worker(DAG_FILE, dag_id)
    log, _ = worker.communicate(timeout=240)
    return worker_result(log), log


def _logged_at(log: str, text: str) -> float:
    """When the log record holding ``text`` was written (seconds since the epoch)."""
    import datetime

    line = next(line for line in log.splitlines() if text in line)
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()


@pytest.mark.smoke  # before Airflow 3.3 too: the deferral needs no task state store
@engines("host", "authz", "rootless")
def test_a_deferred_container_ends_with_its_result_its_output_in_the_log(docker_engine):
    result, log = _run("deferred_docker_success")
    assert result["states"] == {"task": "success"}, log[-3000:]
    assert result["xcom"]["task"]["answer"] == 42 and result["xcom"]["task"]["question"].startswith("manual__")
    assert "Deferred: the triggerer watches container" in log
    assert "Pausing task as DEFERRED" in log and "running trigger in line" in log  # dag.test() ran its trigger
    assert log.index("Deferred: the triggerer") < log.index("thinking about") < log.index("the answer is ready")
    # logged by the trigger as the container wrote it, with its own times (the function sleeps 3 s between), once
    times = {mark: _logged_at(log, mark) for mark in ("thinking about", "the answer is ready")}
    assert times["the answer is ready"] - times["thinking about"] >= 2.5, times
    assert log.index("the answer is ready") < log.index("output was logged while the task was deferred")
    assert log.count("the answer is ready") == 1, log[-3000:]
    assert "[gpu] result:" not in log  # the result line came on the output: read, never shown (issue 38)
    from airflow_gpu_provider import config  # the container's files lived as long as it did: gone with it

    assert not list(Path(config.get("state_dir"), "docker-tasks").glob("lasting-*"))


def test_a_deferred_failure_an_oom_kill_and_a_timeout_fail_the_task_each_with_its_cause():
    """Three DAGs in one worker process (each worker start costs seconds): the task's own error, an out-of-memory
    kill, and a timeout while deferred that stops the container."""
    dag_ids = ("deferred_docker_failure", "deferred_docker_oom", "deferred_docker_timeout")
    started = time.monotonic()
    worker = start_worker(DAG_FILE, dag_ids)
    log, _ = worker.communicate(timeout=300)
    elapsed = time.monotonic() - started
    results = worker_results(log)
    assert set(results) == set(dag_ids), log[-3000:]

    result, log = results["deferred_docker_failure"]
    assert result["states"] == {"task": "failed"}, log[-3000:]
    assert "ValueError: the deferred task's own error" in log and "about to fail" in log

    result, log = results["deferred_docker_oom"]
    assert result["states"] == {"task": "failed"}, log[-3000:]
    assert "ran out of memory (OOM" in log and "memory limit 64.0 MiB" in log

    result, log = results["deferred_docker_timeout"]
    assert result["states"] == {"task": "failed"}, log[-3000:]
    assert elapsed < 150  # the three DAGs, not the 300 s sleep
    assert "timed out while deferred" in log and "AirflowTaskTimeout" in log
    assert log.count("] sleeping") == 1, log[-3000:]  # by the trigger; the resume logged only what came after


def test_the_trigger_serialises_what_the_triggerer_needs():
    trigger = DockerContainerTrigger("c" * 64, {"docker_url": "unix://var/run/docker.sock"}, 0.5, 1e12)
    path, arguments = trigger.serialize()
    assert path == "airflow_gpu_provider.backends.docker.trigger.DockerContainerTrigger"
    assert json.loads(json.dumps(arguments)) == arguments  # stored as JSON by the triggerer
    assert DockerContainerTrigger(**arguments).serialize() == (path, arguments)


TRIGGER_IN_A_FRESH_PROCESS = """
import asyncio, json, sys, threading

from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger

imported_on = []  # the threads that imported docker-py while the trigger ran


class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "docker" or name.startswith("docker."):
            imported_on.append(threading.current_thread() is threading.main_thread())


async def first_event():
    async for event in DockerContainerTrigger(sys.argv[1], {"docker_url": sys.argv[2]}, 0.2).run():
        return event.payload


assert "docker" not in sys.modules, "docker-py was imported before the trigger ran"
sys.meta_path.insert(0, Spy())
print(json.dumps({"event": asyncio.run(first_event()), "imported_on_the_loop": any(imported_on), "imports": len(imported_on)}))
"""


def test_the_trigger_imports_and_calls_docker_py_off_the_event_loop(docker_client):
    """The triggerer's event loop never waits for docker-py: not for a call, nor for its first import (tenths of a
    second, which the real triggerer reported as "async thread was blocked" before the import moved to a thread).
    """
    import subprocess
    import sys

    from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
    from airflow_gpu_provider.backends.docker.options import DockerOptions
    from airflow_gpu_provider.host.workers import deployment
    from airflow_gpu_provider.task.labels import PROVIDER

    image = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    labels = {PROVIDER: "true", DEPLOYMENT_LABEL: deployment()}  # the deployment's (no task instance: dag.test's way)
    created = docker_client.create_container(image, ["true"], labels=labels)["Id"]
    try:
        docker_client.start(created)
        done = subprocess.run(
            [sys.executable, "-c", TRIGGER_IN_A_FRESH_PROCESS, created, str(DockerOptions().engine_url)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        docker_client.remove_container(created, force=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["event"]["status"] == "exited" and report["event"]["exit_code"] == 0
    assert report["imports"] > 0 and not report["imported_on_the_loop"], report


def test_a_recorded_container_of_another_task_instance_is_never_taken_over(docker_client):
    """A try takes over only a container whose labels name its own task instance and deployment: a record pointing
    elsewhere (a forged or stale one) finds nothing, and the other container is left alone. (Issue 34, low: another
    deployment's container of a task instance of the same name was taken over.)
    """
    from airflow_gpu_provider.backends.docker import durable
    from airflow_gpu_provider.host.workers import deployment
    from airflow_gpu_provider.task.labels import PROVIDER, docker_label

    theirs = {"dag_id": "other", "task_id": "task", "run_id": "r1", "map_index": "-1"}
    labels = {PROVIDER: "true", **{docker_label(key): value for key, value in theirs.items()}}
    image = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    created = docker_client.create_container(image, ["sleep", "60"], labels={**labels,
                                             durable.DEPLOYMENT_LABEL: deployment()})["Id"]  # fmt: skip
    elsewhere = docker_client.create_container(image, ["sleep", "60"], labels={**labels,
                                               durable.DEPLOYMENT_LABEL: "staging"})["Id"]  # fmt: skip
    try:
        assert durable.find(docker_client, created, theirs) is not None  # its own task instance: found
        assert durable.find(docker_client, elsewhere, theirs) is None  # the same task instance, another deployment
        mine = {**theirs, "dag_id": "mine"}
        assert durable.find(docker_client, created, mine) is None  # any other: never taken, never removed
        assert durable.find(docker_client, "0" * 64, mine) is None  # gone
        store: dict = {}

        class Store:  # Airflow's TaskStateStoreAccessor interface: get / set / delete
            get = staticmethod(lambda key, default=None: store.get(key, default))
            set = staticmethod(store.__setitem__)
            delete = staticmethod(store.pop)

        durable.RECORD.record(Store, created, "unix://var/run/docker.sock", "1")
        assert durable.recorded(Store, "unix://var/run/docker.sock") == created
        assert durable.recorded(Store, "tcp://elsewhere:2376") is None  # another engine's record
        store[durable.KEY] = {"id": "../../etc", "engine": "unix://var/run/docker.sock"}
        assert durable.recorded(Store, "unix://var/run/docker.sock") is None  # not a container id
    finally:
        for container in (created, elsewhere):
            docker_client.remove_container(container, force=True)


def test_a_trigger_another_task_wrote_watches_logs_and_stops_nothing(docker_client):
    """Issue 34, low: a DAG author's own ``DockerContainerTrigger`` naming another task's container made the
    triggerer log that container's output into the author's task log and stop it. It now fires ``refused`` at once.
    """
    from types import SimpleNamespace

    from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
    from airflow_gpu_provider.backends.docker.options import DockerOptions
    from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger
    from airflow_gpu_provider.host.workers import deployment
    from airflow_gpu_provider.task.labels import PROVIDER, docker_label

    victim = {"dag_id": "victim", "task_id": "train", "run_id": "r1", "map_index": "-1"}
    labels = {PROVIDER: "true", DEPLOYMENT_LABEL: deployment(), **{docker_label(k): v for k, v in victim.items()}}
    image = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    created = docker_client.create_container(image, ["sh", "-c", "echo secret-output; sleep 60"], labels=labels)["Id"]
    try:
        docker_client.start(created)
        trigger = DockerContainerTrigger(created, {"docker_url": str(DockerOptions().engine_url)}, 0.1)
        trigger.task_instance = SimpleNamespace(dag_id="author", task_id="t", run_id="r1", map_index=-1)

        async def first_event():
            async for event in trigger.run():
                return event.payload

        assert asyncio.run(first_event())["status"] == "refused"
        asyncio.run(trigger.on_kill())
        assert docker_client.inspect_container(created)["State"]["Running"]  # not stopped
        trigger.task_instance = SimpleNamespace(**{**victim, "map_index": -1})  # its own task: watched
        assert trigger._ours(docker_client)
    finally:
        docker_client.remove_container(created, force=True)


def test_a_container_removed_before_its_result_is_read_fails_the_try(docker_client):
    """Someone else removed the container (a reaper, a user): the try fails; it never succeeds with ``None``."""
    from airflow_gpu_provider.backends.docker import lifecycle
    from airflow_gpu_provider.exceptions import GpuTaskError

    image = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    created = docker_client.create_container(image, ["true"])["Id"]
    docker_client.start(created)
    docker_client.wait(created)
    docker_client.remove_container(created, force=True)
    with pytest.raises(GpuTaskError, match=f"Container {created[:12]} was removed before its result could be read"):
        lifecycle.collect(docker_client, created, None, None)
