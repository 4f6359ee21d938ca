"""Mapped GPU tasks: the classic operator's ``.partial().expand()`` and the decorator's, settled and placed once."""

from __future__ import annotations

import pytest
from conftest import REPO
from helpers import load_dag, mapped_xcoms, run_dag, task_states

from airflow_gpu_provider import GpuStepOperator, gpu_task
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.spec import TaskSpec

pytestmark = pytest.mark.usefixtures("airflow_home")
DAGS = REPO / "tests" / "dags" / "gpu_step_dags.py"


def test_the_classic_operator_mapped_joins_the_gpu_pool(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu")
    dag = load_dag(DAGS, "gpu_step_mapped")
    for task_id in ("classic", "decorated"):
        mapped = dag.get_task(task_id)
        assert mapped.is_mapped
        assert (mapped.partial_kwargs["pool"], mapped.partial_kwargs["pool_slots"]) == ("gpu", 1), task_id
        spec = mapped.partial_kwargs["task_spec"]
        assert isinstance(spec, TaskSpec) and spec.resources.gpu_count == 1
        assert "gpu_count" not in mapped.partial_kwargs  # in the spec, not beside it


def test_the_classic_operator_mapped_runs_each_map_index_on_its_own_gpu(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1")  # the host's GPUs, which the tasks' devices narrow
    dr = run_dag(load_dag(DAGS, "gpu_step_mapped"))
    assert set(task_states(dr).values()) == {"success"}
    values = mapped_xcoms(dr, "classic")
    assert {index: value["sum"] for index, value in values.items()} == {0: 3, 1: 30}
    assert {index: value["sum"] for index, value in mapped_xcoms(dr, "decorated").items()} == {0: 3, 1: 4}
    assert all(value["gpus"] in ("0", "1") for value in values.values())


def test_partial_refuses_bad_settings_at_parse_naming_the_task():
    with pytest.raises(InvalidSettingError, match=r"GpuStepOperator\('m'\): gpu_count=-1 is invalid"):
        GpuStepOperator.partial(task_id="m", command=["true"], gpu_count=-1)


def test_a_decorated_task_names_itself_as_written():
    with pytest.raises(
        InvalidSettingError, match=r"test_mapping\.py:\d+: @task\.gpu\('train'\): gpu_count=-1 is invalid"
    ):

        @gpu_task(gpu_count=-1)
        def train() -> None:
            pass

    with pytest.raises(
        InvalidSettingError, match=r"test_mapping\.py:\d+: @task\.gpu\('fit'\): backend='lsf' is invalid"
    ):
        gpu_task(task_id="fit", backend="lsf")(lambda: None)
