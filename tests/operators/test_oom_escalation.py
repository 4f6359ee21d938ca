"""OOM escalation through real Airflow (dag.test() on SQLite runs the retries) and real child processes.

The host's GPUs are fake devices of known models (``[gpu] devices = 0=L4,1=A100-80GB``); the tasks raise torch's
own ``OutOfMemoryError`` (or CUDA's error text) on purpose. DAGs: tests/dags/escalation_dags.py.
"""

from __future__ import annotations

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.escalation import store
from airflow_gpu_provider.escalation import tries as escalation
from airflow_gpu_provider.telemetry.report import try_key

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "escalation_dags.py"
GIB = 2**30


@pytest.fixture(autouse=True)
def two_models(monkeypatch: pytest.MonkeyPatch, state_dir) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0=L4,1=A100-80GB")


def _stored(dag_run, task_id: str, key: str = store.KEY) -> list[dict]:
    """The history kept in the task instance's task state store for its next try (empty when none is kept)."""
    import json

    row = _row(dag_run, task_id, key)
    return [] if row is None else json.loads(row.value)


def _row(dag_run, task_id: str, key: str):
    """The task state store's row of ``key`` (its value and ``expires_at``), or ``None``."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == dag_run.dag_id,
                TaskStateStoreModel.run_id == dag_run.run_id,
                TaskStateStoreModel.task_id == task_id,
                TaskStateStoreModel.key == key,
            )
        )


def test_a_gpu_oom_retries_on_the_next_accelerator_of_the_ladder(capfd):
    dr = run_dag(load_dag(DAG_FILE, "oom_escalation"))
    assert task_states(dr) == {"climb": "success"}
    value = xcom(dr, "climb")
    assert value["resources"]["accelerator"] == "A100-80GB"  # try 2 asked for the next rung...
    assert value["resources"]["gpu_count"] == 1
    assert value["devices"] == "1"  # ...and the local backend gave it the A100, not the L4 that ran out
    history = xcom(dr, "climb", escalation.XCOM_KEY)
    assert [t["kind"] for t in history["tries"]] == ["gpu_oom", "success"]
    assert history["tries"][0]["resources"]["accelerator"] == "L4"
    assert history["tries"][0]["gpu_memory"] == 24 * GIB
    assert history["on_oom"] == "accelerators=L4 -> A100-80GB"
    out = capfd.readouterr()
    log = out.out + out.err
    assert "[gpu] the task ran out of GPU memory (OutOfMemoryError)" in log
    assert "try 1: OOM escalation GPU step 0/1, memory step 0/0: 1x nvidia L4" in log
    assert (
        "try 2: OOM escalation GPU step 1/1, memory step 0/0: 1x nvidia A100-80GB (try 1 ran out of GPU memory on L4"
        in log
    )
    assert _stored(dr, "climb") == []  # the history is forgotten once the task succeeded


def test_without_a_ladder_the_local_backend_picks_a_gpu_with_more_memory(capfd):
    dr = run_dag(load_dag(DAG_FILE, "oom_larger_gpu"))
    assert task_states(dr) == {"larger": "success"}
    value = xcom(dr, "larger")
    assert value["devices"] == "1"
    assert value["resources"]["accelerator"] is None  # same request; only the device is larger
    out = capfd.readouterr()
    assert (
        "(try 1 ran out of GPU memory on L4 (24.0 GiB); this try needs a GPU with more than 24.0 GiB)"
        in out.out + out.err
    )


def test_with_no_larger_gpu_on_the_host_the_task_fails_at_once_saying_why(monkeypatch, capfd):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0=L4,1=L4")
    dr = run_dag(load_dag(DAG_FILE, "oom_larger_gpu"))
    assert task_states(dr) == {"larger": "failed"}
    out = capfd.readouterr()
    assert "with more than 24.0 GiB of memory, after a try ran out of GPU memory, but no GPU of this host has more" in (
        out.out + out.err
    )


def test_other_failures_retry_with_unchanged_resources(tmp_path):
    dr = run_dag(load_dag(DAG_FILE, "oom_other_failure"), {"marker": str(tmp_path / "failed-once")})
    assert task_states(dr) == {"unchanged": "success"}
    value = xcom(dr, "unchanged")
    assert value["resources"]["accelerator"] == "L4"
    assert value["devices"] == "0"
    assert [t["kind"] for t in xcom(dr, "unchanged", escalation.XCOM_KEY)["tries"]] == ["error", "success"]


def test_past_the_top_of_the_ladder_the_task_stops_retrying(capfd):
    dr = run_dag(load_dag(DAG_FILE, "oom_top_of_ladder"))
    assert task_states(dr) == {"top": "failed"}
    out = capfd.readouterr()
    log = out.out + out.err
    assert log.count("the task ran out of GPU memory (OutOfMemoryError)") == 2  # L4, then A100-80GB; not a 3rd run
    assert "the on_oom ladder has no larger GPU step" in log
    assert [t["kind"] for t in _stored(dr, "top")] == ["gpu_oom", "gpu_oom"]  # kept: a cleared task goes on from there
    # ...however late: the history never expires ([state_store] default_retention_days), what else is kept does
    assert _row(dr, "top", store.KEY).expires_at is None
    assert _row(dr, "top", try_key(1)).expires_at is not None  # the profile of try 1: Airflow's default retention


def test_an_oom_in_one_rank_of_an_accelerate_launch_climbs_the_ladder(capfd):
    dr = run_dag(load_dag(DAG_FILE, "oom_accelerate"))
    assert task_states(dr) == {"launch": "success"}
    assert xcom(dr, "launch") == {"world_size": 2, "accelerator": "A100-80GB"}
    tries = xcom(dr, "launch", escalation.XCOM_KEY)["tries"]
    assert [t["kind"] for t in tries] == ["gpu_oom", "success"]
    assert "rank 1: CUDA out of memory" in tries[0]["error"]
    out = capfd.readouterr()
    assert "[gpu] rank 1: the task ran out of GPU memory (OutOfMemoryError)" in out.out + out.err


def test_the_render_cli_shows_the_try_after_an_oom():
    import subprocess
    import sys

    import yaml

    dag_file = REPO / "tests" / "backends" / "kubernetes" / "oom_render_dag.py"
    rendered = subprocess.run(
        [sys.executable, "-m", "airflow_gpu_provider.render", str(dag_file), "train", "--after", "gpu_oom"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    [secret, pod] = yaml.safe_load_all(rendered)  # the envelope's Secret, then the pod
    assert (secret["kind"], pod["kind"]) == ("Secret", "Pod")
    [term] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert "NVIDIA-A100-SXM4-80GB" in term["matchExpressions"][0]["values"]
