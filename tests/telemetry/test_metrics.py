"""Every profiled GPU try's summary goes out through Airflow's own ``Stats`` (telemetry/metrics.py).

The tries are real (``tests/failing_tries.py``: a worker runs ``tests/dags/retry_policy_dags.py`` with ``dag.test()``
on a replayed two-GPU host, an Xid 79 on GPU 0), and so is the StatsD listener that Airflow's ``[metrics]`` sends to:
the GPU metrics arrive beside Airflow's own, with the task's tags. The values are held to the profile each try kept.
"""

from __future__ import annotations

import pytest
from failing_tries import failing_run, stored_profile

from airflow_gpu_provider.telemetry.metrics import tag
from airflow_gpu_provider.telemetry.profile import Profile

pytestmark = pytest.mark.usefixtures("airflow_home")


@pytest.fixture(scope="module")
def metrics(tmp_path_factory) -> dict[tuple[str, str], list[tuple[dict[str, str], float, str]]]:
    """The StatsD lines received, by (metric, task): their tags, value and type (``g``, ``c``)."""
    found: dict[tuple[str, str], list[tuple[dict[str, str], float, str]]] = {}
    for line in failing_run(tmp_path_factory).statsd:  # airflow.gpu.task.utilization,dag_id=...,outcome=success:42|g
        name_and_tags, _, rest = line.partition(":")
        name, *pairs = name_and_tags.split(",")
        tags = dict(pair.split("=", 1) for pair in pairs)
        value, _, kind = rest.partition("|")
        found.setdefault((name, tags.get("task_id", "")), []).append((tags, float(value), kind))
    return found


def test_each_try_of_a_gpu_task_sends_its_summary_tagged_with_its_class(metrics):
    """gpu_fault: try 1 on the RTX 4090 (GPU 0), failed by Xid 79; try 2 on the RTX 4080 (GPU 1), succeeded."""
    tries = metrics[("airflow.gpu.task.tries", "gpu_fault")]
    assert [(t["model"], t["outcome"]) for t, _, _ in tries] == [
        ("NVIDIA_GeForce_RTX_4090", "infrastructure"),
        ("NVIDIA_GeForce_RTX_4080", "success"),
    ]
    assert all(value == 1 and kind == "c" for _, value, kind in tries)
    assert {t["dag_id"] for t, _, _ in tries} == {"gpu_retry_policy"} and {t["backend"] for t, _, _ in tries} == {
        "local"
    }
    for number in (1, 2):
        profile = Profile.read(stored_profile("gpu_fault", number))
        assert profile is not None and not profile.is_cpu
        [device] = profile.devices
        expected = {
            "gpu_seconds": profile.gpu_seconds,
            "utilization": profile.mean_util,
            "memory_utilization": device.peak_memory_pct,
            "peak_memory": device.peak_memory,
            "energy": device.energy_wh,
        }
        for name, value in expected.items():
            sent = metrics[(f"airflow.gpu.task.{name}", "gpu_fault")][number - 1]
            assert sent[0]["model"] == tag(device.name) and sent[2] == "g", name
            assert sent[1] == pytest.approx(value), name


def test_a_cpu_try_sends_its_count_and_no_gpu_figures(metrics):
    [(tags, value, _)] = metrics[("airflow.gpu.task.gpu_seconds", "bad_input")]
    assert tags["model"] == "cpu" and tags["outcome"] == "application" and value == 0
    assert ("airflow.gpu.task.utilization", "bad_input") not in metrics
    assert [t["outcome"] for t, _, _ in metrics[("airflow.gpu.task.tries", "fails_once")]] == ["application", "success"]


def test_the_gpu_metrics_go_where_airflows_own_go(metrics):
    """The same listener got Airflow's own metrics of the same tries (so the same dashboards see both)."""
    finished = [t["state"] for t, _, _ in metrics[("airflow.ti.finish", "gpu_fault")]]
    assert finished == ["up_for_retry", "success"]


def test_tag_values_are_what_every_metrics_backend_takes():
    assert tag("NVIDIA GeForce RTX 4090") == "NVIDIA_GeForce_RTX_4090"
    assert tag("train.step-1") == "train.step-1"
    assert tag("a,b=c d") == "a_b_c_d"
    assert tag("") == "unknown" and tag(None) == "None"
