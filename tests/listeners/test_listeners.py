"""The provider's listeners, against a real Airflow metadata DB."""

from __future__ import annotations

import datetime

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states

from airflow_gpu_provider.pools.listener import fail_unschedulable_gpu_tasks, pool_problem

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "gpu_step_dags.py"


def test_pool_problem_messages():
    assert pool_problem("gpu", 2, 4) is None
    assert "does not exist" in pool_problem("gpu", 1, None)
    assert "airflow pools set gpu" in pool_problem("gpu", 1, None)
    message = pool_problem("gpu", 8, 4)
    assert "needs 8 slots of GPU pool 'gpu', which has only 4" in message


def _running_dag_run(dag_id: str, session):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dagrun import get_or_create_dagrun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.types import DagRunTriggeredByType

    DagBundlesManager().sync_bundles_to_db(session=session)
    session.commit()
    bag = BundleDagBag(dag_folder=str(DAG_FILE.parent), bundle_path=DAG_FILE.parent, bundle_name="test-dags")
    sync_bag_to_db(bag, "test-dags", None)
    dag = SerializedDagModel.get_dag(dag_id, session=session)
    now = datetime.datetime.now(datetime.timezone.utc)
    return get_or_create_dagrun(
        dag=dag,
        run_id=f"pool_check_{now.timestamp()}",
        logical_date=now,
        start_date=now,
        run_after=now,
        data_interval=None,
        conf={},
        session=session,
        triggered_by=DagRunTriggeredByType.TEST,
        triggering_user_name="test",
    )


@pytest.mark.parametrize(
    ("pool_size", "failed"), [(None, {"fits", "too_big", "from_config"}), (2, {"too_big", "from_config"}), (4, set())]
)
def test_tasks_that_could_never_get_their_gpu_pool_slots_fail_with_a_note(monkeypatch, pool_size, failed):
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    monkeypatch.setenv("AIRFLOW__GPU__POOL", "test_gpu_pool")
    with create_session() as session:
        if pool_size is not None:
            Pool.create_or_update_pool("test_gpu_pool", pool_size, "GPUs", include_deferred=False, session=session)
        elif Pool.get_pool("test_gpu_pool", session=session):
            Pool.delete_pool("test_gpu_pool", session=session)
    with create_session() as session:
        dag_run = _running_dag_run("gpu_pool_check", session)
        assert set(fail_unschedulable_gpu_tasks(dag_run, session)) == failed
    with create_session() as session:
        tis = {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}
        for task_id, ti in tis.items():
            if task_id in failed:
                assert str(ti.state) == "failed"
                assert "would wait forever" in ti.note
            else:
                assert ti.state is None
                assert ti.note is None


@pytest.mark.parametrize("pool_size", [3, 0])
def test_all_gpus_take_every_slot_of_the_pool(monkeypatch, pool_size):
    """gpu_count="all" takes the whole pool (the policy sizes it in the scheduler); an empty pool fails it."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    monkeypatch.setenv("AIRFLOW__GPU__POOL", "test_gpu_pool")
    with create_session() as session:
        Pool.create_or_update_pool("test_gpu_pool", pool_size, "GPUs", include_deferred=False, session=session)
    with create_session() as session:
        dag_run = _running_dag_run("gpu_pool_all", session)
        failed = fail_unschedulable_gpu_tasks(dag_run, session)
        tis = dag_run.get_task_instances(session=session)
        assert {ti.task_id for ti in tis} == {"whole_host", "mapped_whole_host"}
        assert {(ti.pool, ti.pool_slots) for ti in tis} == {("test_gpu_pool", pool_size or 1)}
        whole_host = next(ti for ti in tis if ti.task_id == "whole_host")
        assert whole_host.executor_config["mine"] == 1, "the task's own executor_config is kept"
        # A cleared or newly mapped task instance is refreshed through the policy (the airflow.policy entry point)
        from airflow.settings import task_instance_mutation_hook

        whole_host.pool_slots = 1
        task_instance_mutation_hook(whole_host, dag_run=dag_run)
        assert whole_host.pool_slots == (pool_size or 1)
    assert set(failed) == (set() if pool_size else {"whole_host", "mapped_whole_host"})


def test_cuda_cache_listener_runs_after_tasks_that_loaded_torch(capfd):
    """The task runs in this process, whose torch sees no GPU on any host (conftest: CUDA_VISIBLE_DEVICES="")."""
    dr = run_dag(load_dag(DAG_FILE, "cuda_listener"))
    assert task_states(dr) == {"in_process_torch": "success"}
    assert "CUDA cache clear skipped: CUDA is not available" in capfd.readouterr().out


def test_cuda_cache_listener_can_be_disabled(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__CLEAR_CACHE_BETWEEN_TASKS", "False")
    run_dag(load_dag(DAG_FILE, "cuda_listener"))
    assert "CUDA cache clear" not in capfd.readouterr().out


@pytest.mark.gpu
def test_cuda_cache_listener_frees_what_a_task_left_on_the_gpu():
    """The listener's hook, after a task that used CUDA in this process: the cache goes back to zero."""
    import subprocess
    import sys

    from gpu_support import gpu_environment

    code = (
        "import torch; from airflow_gpu_provider.hooks import cuda_cache;"
        "block = torch.empty(32 * 2**20, dtype=torch.uint8, device='cuda'); del block;"
        "held = torch.cuda.memory_reserved(); cuda_cache.on_task_instance_success(None, None);"
        "print(held, torch.cuda.memory_reserved())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=gpu_environment()
    )
    held, after = map(int, done.stdout.split()[-2:])
    assert held >= 32 * 2**20
    assert after == 0
    assert "CUDA cache cleared:" in done.stdout + done.stderr
