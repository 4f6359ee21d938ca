"""Low: the OOM history was an Airflow Variable that any DAG could write; it is the task instance's own now."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import REPO
from helpers import load_dag, task_states, xcom

from airflow_gpu_provider.escalation import store
from airflow_gpu_provider.escalation import tries as escalation

pytestmark = pytest.mark.usefixtures("airflow_home")


def test_another_dag_cannot_put_a_task_on_the_top_rung(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0=L4,1=A100-80GB")
    dag = load_dag(REPO / "tests" / "dags" / "escalation_dags.py", "oom_escalation")
    import datetime

    from airflow.models.variable import Variable

    # what a DAG of someone else's could write before: the Variable the provider read the history from
    run_after = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    run_id = f"manual__{run_after.isoformat()}"
    identity = json.dumps([dag.dag_id, run_id, "climb", "-1"])
    forged = {"tries": [{"try": 1, "kind": "gpu_oom", "gpu_memory": 80 * 2**30, "resources": {}}]}
    Variable.set("airflow_gpu_provider.oom." + hashlib.sha256(identity.encode()).hexdigest()[:32], forged,
                 serialize_json=True)  # fmt: skip
    dr = dag.test(run_after=run_after)
    assert dr.run_id == run_id
    assert task_states(dr) == {"climb": "success"}
    tries = xcom(dr, "climb", escalation.XCOM_KEY)["tries"]
    assert tries[0]["resources"]["accelerator"] == "L4"  # try 1 ran on the task's own rung


class _Store:
    def __init__(self, value):
        self.value = value

    def get(self, key, default=None):
        return self.value


def test_a_history_read_back_keeps_only_entries_a_try_could_have_written():
    good = {"try": 1, "kind": "gpu_oom", "gpu_memory": 2**30}
    kept = store.load(_Store([good, {"try": 5, "kind": "gpu_oom"}, {"try": 1, "kind": "rm -rf"}, "x", None]), 3)
    assert kept == [good]
    assert store.load(_Store({"not": "a list"}), 2) == []
    assert store.load(None, 2) == []


def test_a_rescheduled_runs_entry_of_this_same_try_is_history():
    """[gpu] infra_retries reschedules a try: its earlier run's entry has this try's number."""
    rescheduled = {"try": 2, "kind": "infrastructure"}
    assert store.load(_Store([rescheduled, {"try": 3, "kind": "infrastructure"}]), 2) == [rescheduled]
