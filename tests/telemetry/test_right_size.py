"""Right-sizing that acts (``right_size=True``, telemetry/right_size.py): the next run asks for the smallest GPU.

Real runs: a worker runs ``tests/dags/right_size_dags.py`` with ``dag.test()`` twice, on a host whose NVML is the replay
of an RTX 4090 (24 GiB, 10.4 GiB used in the recording) and an RTX 4080 (16 GiB). The first run has no earlier one and
takes the first free GPU, the 4090; its profile's peak x 1.2 fits the 4080, which the second run asks for and gets.
"""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path

import pytest
from helpers import start_worker, worker_result
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.host.inventory import parse_devices, right_sized
from airflow_gpu_provider.telemetry.advice import HEADROOM
from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.right_size import STATE_KEY, skipped_because
from airflow_gpu_provider.telemetry.ui.format import TaskKey
from airflow_gpu_provider.telemetry.ui.html import e
from airflow_gpu_provider.telemetry.ui.task_page import render_task_page

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = Path(__file__).resolve().parents[1] / "dags" / "right_size_dags.py"
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000001"
MIB = 2**20


def _run(env: dict[str, str], when: datetime.datetime, conf: dict | None = None) -> tuple[dict, str]:
    worker = start_worker(DAG_FILE, "gpu_right_size", conf=conf, logical_date=when.isoformat(), env=env)
    try:
        out, _ = worker.communicate(timeout=300)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return worker_result(out), out


def _stored(run_id: str, key: str) -> dict:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(TaskStateStoreModel.value).filter_by(
                dag_id="gpu_right_size", run_id=run_id, task_id="right_sized", key=key
            )
        )
    return json.loads(value)


def test_a_right_sized_second_run_asks_for_the_smaller_gpu(tmp_path):
    env = {
        **replay_environment(RECORDINGS / "rtx4090_rtx4080_2gpu.csv", built_or_skip(tmp_path / "nvml")),
        "AIRFLOW__GPU__DEVICES": "auto",
        "AIRFLOW__GPU__STATE_DIR": str(tmp_path / "state"),
        "AIRFLOW__GPU__PROFILE_INTERVAL": "0.25",
    }
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    first, log1 = _run(env, now - datetime.timedelta(minutes=2))
    assert first["states"] == {"right_sized": "success", "oom_when_right_sized": "success"}, log1[-3000:]
    assert first["xcom"]["right_sized"] == GPU0, log1[-3000:]  # no earlier run: the first free GPU, the 4090
    assert "right_size: not right-sized: no earlier successful run" in log1

    second, log2 = _run(env, now - datetime.timedelta(minutes=1), conf={"oom": True})
    assert second["states"] == {"right_sized": "success", "oom_when_right_sized": "success"}, log2[-3000:]
    assert second["xcom"]["right_sized"] == GPU1, log2[-3000:]  # the smallest GPU that holds the peak: the 4080
    # right-sized to the 4080 too, it ran out of memory there: its retry is not right-sized, it climbs to the 4090
    assert second["xcom"]["oom_when_right_sized"] == GPU0, log2[-3000:]
    assert "right_size: not right-sized: try 1 ran out of memory" in log2
    peak, need = 10602 * MIB, int(10602 * MIB * HEADROOM)  # the 4090's memory used in the recording
    assert "peaked at 10.4 GiB on NVIDIA GeForce RTX 4090" in log2 and "at least 12.4 GiB" in log2
    assert "hold 12.4 GiB, smallest first: NVIDIA GeForce RTX 4080 (16.0 GiB), NVIDIA GeForce RTX 4090" in log2

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = list(session.scalars(select(DagRun.run_id).filter_by(dag_id="gpu_right_size").order_by(DagRun.id)))
    decision = _stored(runs[-1], STATE_KEY)  # the task state store keeps the decision and its evidence
    assert (decision["peak"], decision["need"], decision["headroom"]) == (peak, need, HEADROOM)
    assert (decision["from_run_id"], decision["from_try"], decision["try"]) == (runs[-2], 1, 1)
    profile = Profile.read(_stored(runs[-1], "airflow_gpu_provider.gpu_profile.try_1"))  # what the GPU tab reads
    assert profile is not None and profile.right_size.endswith("ran on NVIDIA GeForce RTX 4080 (16.0 GiB)")
    assert f"run {runs[-2]} (try 1) peaked at 10.4 GiB" in profile.right_size
    tab = render_task_page(profile, TaskKey("gpu_right_size", runs[-1], "right_sized"), home="/gpu/")
    assert f"<li>Right-sized: {e(profile.right_size)}</li>" in tab  # the GPU tab, above the try's advice


def test_the_smallest_listed_mig_slice_or_card_that_holds_the_need_comes_first():
    devices = parse_devices("MIG-big=3g.40gb,MIG-small=1g.10gb,MIG-mid=2g.20gb,3")
    log = logging.getLogger("test")
    assert [d.id for d in right_sized(devices, 12 * 2**30, log)] == ["MIG-mid", "MIG-big"]
    assert [d.id for d in right_sized(devices, 50 * 2**30, log)] == [d.id for d in devices]  # none holds it: all


def test_a_retry_after_an_oom_is_not_right_sized():
    assert "ran out of memory" in skipped_because(2, [{"try": 1, "kind": "gpu_oom"}])
    assert "ran out of memory" in skipped_because(3, [{"try": 1, "kind": "host_oom"}, {"try": 2, "kind": "error"}])
    assert skipped_because(2, []) is not None  # a retry runs with the task's own resources
    assert skipped_because(1, []) is None


def test_right_size_is_checked_at_parse():
    with pytest.raises(InvalidSettingError, match="right_size.*'yes'"):
        GpuStepOperator(task_id="t", command=["true"], backend="local", right_size="yes")
    with pytest.raises(InvalidSettingError, match="right_size.*'kubernetes'"):
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", right_size=True)
    assert GpuStepOperator(task_id="t", command=["true"], backend="docker", right_size=True).task_spec.right_size
    with pytest.raises(InvalidSettingError, match=r"'slurm' does not size whole GPUs.*share of one GPU on.*'slurm'"):
        GpuStepOperator(task_id="t", command=["true"], backend="slurm", gpu_count=1, right_size=True)
    shared = GpuStepOperator(task_id="t", command=["true"], backend="slurm", gpu_share="8GiB", right_size=True)
    assert shared.task_spec.right_size  # its shards: tests/backends/slurm/test_slurm_plan.py
