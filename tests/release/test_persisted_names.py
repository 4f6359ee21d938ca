"""The names the previous release (0.1.0 at b5efba0, tests/release/test_upgrade.py) wrote where they outlive it.

An upgrade keeps Airflow's metadata database, the task state store, XCom, the state dir, running containers, pods and
jobs: a trigger row names its class path and kwargs, a deferral its state, a try its store keys. Each name here is
read back by this release; renaming one breaks every task that a running Airflow holds across an upgrade. A test
here failing means: keep reading the old name (and say so in CHANGELOG.md's upgrade section), never just rename it.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from airflow_gpu_provider.backends.docker import durable as docker_durable
from airflow_gpu_provider.backends.kubernetes import multinode_defer
from airflow_gpu_provider.backends.ray import durable as ray_durable
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.escalation import infrastructure, store, tries
from airflow_gpu_provider.runtime import protocol
from airflow_gpu_provider.settings import ImageSettings
from airflow_gpu_provider.task import labels
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.telemetry import TRY_KEY_PREFIX, XCOM_KEY, right_size

PREVIOUS = Path(__file__).with_name("previous_release_state.json")  # written by 0.1.0 at b5efba0

#: Trigger class paths (the triggerer imports them from the trigger table) and the kwargs each was stored with
TRIGGERS = {
    "airflow_gpu_provider.backends.docker.trigger.DockerContainerTrigger": (
        "container_id", "engine", "poll_interval", "deadline", "state", "stop_timeout",
    ),
    "airflow_gpu_provider.backends.ray.trigger.RayJobTrigger": (
        "submission_id", "cluster", "poll_interval", "deadline", "pending_deadline", "state",
    ),
    "airflow_gpu_provider.host.trigger.GpuFreeTrigger": (
        "lock_files", "count", "deadline", "poll_interval", "requested", "since",
    ),
    "airflow_gpu_provider.host.trigger.GpuStartTrigger": ("gpus", "limit"),
}  # fmt: skip


@pytest.mark.parametrize("classpath", sorted(TRIGGERS))
def test_a_stored_trigger_is_rebuilt_from_its_classpath_and_kwargs(classpath):
    stored = json.loads(PREVIOUS.read_text())["triggers"][classpath]
    assert tuple(stored) == TRIGGERS[classpath]
    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**stored)  # what the triggerer does with the row
    assert trigger.serialize()[0] == classpath


def test_a_deferral_of_the_previous_release_resumes_with_this_one():
    """The state ``execute_complete`` gets back: its keys, the try's options and request, as 0.1.0 wrote them."""
    state = json.loads(PREVIOUS.read_text())["deferral"]
    assert set(state) == {"phase", "backend", "try"} and state["phase"] == "run"
    conf = GpuConfig.from_state(state["try"]["conf"])
    assert conf.state_dir == state["try"]["conf"]["state_dir"] and conf.kill_grace == 7.0
    request = TaskRequest.from_state(state["try"]["request"], ImageSettings())
    assert request.labels["task_id"] == "train" and request.durable is True
    assert str(request.resources.memory) == str(state["try"]["request"]["resources"]["memory"])


def test_a_deferral_of_a_later_release_or_an_earlier_one_resumes_too():
    """Options and fields a release adds or removes: the unknown dropped, the missing this process's own."""
    state = json.loads(PREVIOUS.read_text())["deferral"]["try"]
    conf = {**state["conf"], "an_option_of_a_later_release": 1}
    del conf["prices"]
    assert GpuConfig.from_state(conf).prices == GpuConfig.read().prices
    request = {**state["request"], "a_field_of_a_later_release": 1}
    request["envelope"] = {**request["envelope"], "an_envelope_field_of_a_later_release": 1}
    assert TaskRequest.from_state(request, ImageSettings()).labels["task_id"] == "train"


def test_the_task_state_store_keys():
    assert docker_durable.KEY == "airflow_gpu_provider.docker_container"
    assert set(docker_durable.RECORD.entry("c" * 64, "unix://var/run/docker.sock", "1")) == {"id", "engine", "try"}
    assert ray_durable.KEY == "airflow_gpu_provider.ray_job"
    assert ray_durable.RECORD.entry("airflow-gpu-x-1-ab", "ray_default", "1") == {
        "id": "airflow-gpu-x-1-ab",
        "cluster": "ray_default",
        "try": "1",
    }
    assert multinode_defer.JOB_STATE_KEY == "gpu_indexed_job"
    assert store.KEY == "airflow_gpu_provider.oom_history"
    assert infrastructure.KEY == "airflow_gpu_provider.avoid_nodes"
    assert right_size.STATE_KEY == "airflow_gpu_provider.right_size"
    assert TRY_KEY_PREFIX == "airflow_gpu_provider.gpu_profile.try_"


def test_the_xcom_keys():
    assert (XCOM_KEY, tries.XCOM_KEY, infrastructure.XCOM_KEY) == ("gpu_profile", "gpu_escalation", "gpu_failure")


def test_the_labels_that_find_a_running_container_pod_or_job():
    assert labels.docker_label("run_id") == "airflow-gpu-provider.run_id"
    assert labels.kubernetes_label("try_number") == "airflow-gpu-provider/try_number"
    assert labels.MANAGED_BY == {"app.kubernetes.io/managed-by": "airflow-gpu-provider"}
    assert labels.TRY_IDENTITY == ("dag_id", "task_id", "run_id", "try_number", "map_index")


def test_the_runtime_protocol_between_a_worker_and_a_container_started_before_the_upgrade():
    """A container, pod or job of the previous release runs its runtime; this release reads its result."""
    assert protocol.ENVELOPE_VERSION == 2
    assert (protocol.RESULT_MARKER, protocol.RANK_RESULTS, protocol.INSTALL, protocol.LAUNCHER) == (
        "[gpu] result: ", "--rank-results", "install", "launcher",
    )  # fmt: skip
    from airflow_gpu_provider.task.result import task_result

    result = json.loads(PREVIOUS.read_text())["result"]
    assert task_result(result, 0, where="a container of the previous release").return_value == {"runs": 1}


def test_the_state_dir_layout(tmp_path):
    """The folders of ``[gpu] state_dir`` that a worker of either release reads: the archive, the quarantine."""
    from airflow_gpu_provider.host.quarantine import quarantined
    from airflow_gpu_provider.host.state import runtime_file

    assert runtime_file(tmp_path).parent == tmp_path / "runtime"
    assert runtime_file(tmp_path).name.startswith("runtime-") and runtime_file(tmp_path).suffix == ".pyz"
    quarantined(tmp_path)
    assert (tmp_path / "quarantine").is_dir()
