"""Profiles of real task runs (dag.test on SQLite, real task processes): XCom, the log, OpenLineage, rendered pods.

The DAGs live in tests/dags/telemetry_dags.py. The GPU case replays a recorded NVML stream (tests/nvml_replay):
the runtime's ctypes NVML code reads it as it would read the driver.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.utils.net import get_hostname
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

from airflow_gpu_provider.telemetry.advice import BUSY_MEAN, HOST_BUSY_PCT

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "telemetry_dags.py"
TWO_GPUS = RECORDINGS / "rtx4090_rtx4080_2gpu.csv"


@pytest.fixture(autouse=True)
def fast_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0.25")  # the floor


def test_every_gpu_task_try_leaves_its_profile_in_xcom_and_the_log(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__PRICES", "A100=3.0, cpu=0.36")
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    assert task_states(dag_run) == {"busy": "success", "fails": "failed", "exits": "failed"}
    assert xcom(dag_run, "busy") == "burnt"  # the return value keeps its own key
    profile = xcom(dag_run, "busy", "gpu_profile")
    assert profile["kind"] == "cpu" and profile["version"] == 2
    assert profile["host"] == get_hostname() and profile["node"] == os.uname().nodename  # a child of the worker
    assert profile["cpu_fallback"] is False and profile["cpu_fallback_reason"] is None
    assert profile["host_cpu"]["scope"] == "host" and profile["host_cpu"]["pressure_pct"] is not None
    assert profile["task"] == {
        "dag_id": "telemetry_local",
        "run_id": dag_run.run_id,
        "task_id": "busy",
        "map_index": -1,
        "try_number": 1,
        "backend": "local",
    }
    assert profile["requested"]["memory"] == 2 * 2**30 and profile["requested"]["cpu_count"] == 1
    [device] = profile["devices"]
    if profile["host_cpu"]["pressure_pct"] < HOST_BUSY_PCT:
        assert device["mean_util"] > 30  # one busy core of the one CPU it asked for... or of the host's
    elif device["mean_util"] < BUSY_MEAN:  # other processes of the host took the CPUs: the advice says so
        assert any("the host was busy (CPU pressure" in note for note in profile["advice"]), profile["advice"]
    assert profile["samples"] >= 2.0 / 0.25 - 1  # a 2-s burn sampled every 0.25 s (the first sample may come late)
    assert len(profile["series"]["t"]) == profile["samples"]
    assert profile["gpu_seconds"] == 0.0
    assert profile["cost"]["model"] == "cpu" and profile["cost"]["amount"] == pytest.approx(
        0.36 * profile["duration_s"] / 3600, abs=1e-4
    )
    out = capfd.readouterr()
    log = out.out + out.err
    assert "[gpu] profile: CPU profile (no GPU telemetry) of " in log
    assert "[gpu]   CPU (task process tree, " in log and "[gpu] cost: " in log
    assert "[gpu]   host CPUs: " in log and f"({profile['host_cpu']['source']}, host view)" in log


def test_a_failed_try_keeps_its_profile_too(capfd):
    """The profile of the try that failed (an OOM's) is the one that explains it; a command keeps its exit status."""
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    failed = xcom(dag_run, "fails", "gpu_profile")
    assert failed["task"]["task_id"] == "fails" and failed["samples"] >= 3
    exited = xcom(dag_run, "exits", "gpu_profile")
    assert exited["task"]["task_id"] == "exits" and exited["samples"] >= 3
    from airflow.utils.session import create_session

    from airflow_gpu_provider.telemetry.ui.store import recent_profiles

    with create_session() as session:  # the GPUs page's State column: a failed try does not look like a success
        states = {row.key.task_id: row.state for row in recent_profiles(session, {"telemetry_local"})}
    assert states["fails"] == states["exits"] == "failed", states
    log = capfd.readouterr().out
    assert "The task process in the local task process exited with status 3." in log
    assert "GpuOutOfMemoryError: The task ran out of GPU memory in the local task process (MemoryError: CUDA" in log


def test_profile_off_samples_and_stores_nothing(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0")
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    assert xcom(dag_run, "busy") == "burnt"
    assert xcom(dag_run, "busy", "gpu_profile") is None
    assert "[gpu] profile" not in capfd.readouterr().out


def test_a_gpu_task_is_profiled_on_the_gpu_it_was_given(monkeypatch, tmp_path, state_dir):
    """Two GPUs (a recorded RTX 4090 and RTX 4080) in the inventory: the task gets one, by UUID, and only that
    one is sampled, with the recorded figures."""
    recording = [line.split(", ") for line in TWO_GPUS.read_text().splitlines()[1:]]
    uuids = list(dict.fromkeys(row[2] for row in recording))
    for name, value in replay_environment(TWO_GPUS, built_or_skip(tmp_path / "nvml")).items():
        monkeypatch.setenv(name, value)  # the task process loads the replay as libnvidia-ml.so.1
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", ",".join(reversed(uuids)))  # the allocator hands out the first free
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_gpu"))
    assert task_states(dag_run) == {"one_gpu": "success"}
    profile = xcom(dag_run, "one_gpu", "gpu_profile")
    assert profile["kind"] == "gpu"
    [device] = profile["devices"]
    assert device["uuid"] == uuids[1] and device["name"] == "NVIDIA GeForce RTX 4080"
    assert profile["gpu_seconds"] == pytest.approx(profile["duration_s"], abs=0.01)
    rows = [row for row in recording if row[2] == uuids[1]][: profile["samples"]]  # one row per sample
    assert device["peak_memory"] == max(int(row[6]) for row in rows) * 2**20
    assert device["memory_total"] == int(rows[0][7]) * 2**20


def test_the_gpu_run_facet_goes_into_openlineage_events(monkeypatch, tmp_path):
    """With the OpenLineage provider and a file transport, the task's COMPLETE event carries the ``gpu`` facet."""
    events = tmp_path / "events"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps({"type": "file", "log_file_path": str(events)}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "telemetry-test")
    code = f"""
import sys
sys.path[:0] = {[str(REPO / "tests")]!r}
from helpers import load_dag, run_dag
run_dag(load_dag({str(DAG_FILE)!r}, "telemetry_local"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    written = [
        json.loads(line) for path in sorted(Path(tmp_path).glob("events*")) for line in path.read_text().splitlines()
    ]
    ended = {e["job"]["name"].rsplit(".", 1)[-1]: e for e in written if e["eventType"] in ("COMPLETE", "FAIL")}
    assert ended["busy"]["eventType"] == "COMPLETE" and ended["fails"]["eventType"] == "FAIL", written
    facet = ended["busy"]["run"]["facets"]["gpu"]
    assert facet["kind"] == "cpu" and facet["durationSeconds"] > 1 and facet["gpuSeconds"] == 0
    assert facet["devices"][0]["index"] == "cpu" and facet["peakMemoryBytes"] > 0
    assert facet["_schemaURL"].endswith("#the-gpu-run-facet")
    assert ended["fails"]["run"]["facets"]["gpu"]["durationSeconds"] >= 1  # a failed try's facet too


def test_the_rendered_pod_carries_what_the_runtime_needs_to_sample():
    """Kubernetes: the envelope asks for the profile; a GPU pod gets NVIDIA's utility capability (NVML)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "gpu_training_demo.py"))
    task = bag.get_dag("gpu_training_demo").get_task("train")
    secret, pod = task.render_manifests(params={"gpu_count": 1})  # the envelope is in the task's Secret
    env = {v["name"]: v.get("value") for v in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    profile = json.loads(base64.b64decode(base64.b64decode(secret["data"]["envelope"])))["profile"]
    assert profile == {"interval_s": 0.25, "host": get_hostname()}  # the worker that renders and submits the pod
    _, cpu_pod = task.render_manifests(params={"gpu_count": 0})
    cpu_env = {v["name"] for v in cpu_pod["spec"]["containers"][0]["env"]}
    assert "NVIDIA_DRIVER_CAPABILITIES" not in cpu_env


def test_a_bad_price_list_costs_the_cost_only(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__PRICES", "A100")
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    profile = xcom(dag_run, "busy", "gpu_profile")
    assert profile["cost"] is None and profile["samples"] >= 1
    out = capfd.readouterr()
    assert "No cost in the profile: [gpu] prices: 'A100' is not MODEL=PRICE" in out.out + out.err


def test_the_gpus_page_reads_the_profiles_of_gpu_tasks_only():
    """Low: any task could forge fleet telemetry by pushing a gpu_profile XCom."""
    from airflow.utils.session import create_session

    from airflow_gpu_provider.telemetry.ui.format import TaskKey
    from airflow_gpu_provider.telemetry.ui.store import profiled_dags, recent_profiles, task_profile

    dr = run_dag(load_dag(DAG_FILE, "forged_profile"))
    assert task_states(dr) == {"forger": "success", "real": "success"}
    assert xcom(dr, "forger", "gpu_profile")["host"] == "forged-host"  # the row is there...
    with create_session() as session:
        rows = recent_profiles(session, {"forged_profile"})
        assert [row.key.task_id for row in rows] == ["real"]  # ...and the page does not read it
        assert [row.state for row in rows] == ["success"]  # how the try ended: the page's State column
        assert task_profile(session, TaskKey("forged_profile", dr.run_id, "forger")) is None
        assert task_profile(session, TaskKey("forged_profile", dr.run_id, "real")) is not None
        # the DAG filter's choices: a readable DAG with a GPU task's profile, never one the user may not read
        assert profiled_dags(session, {"forged_profile", "no_such_dag"}) == ["forged_profile"]
        assert profiled_dags(session, set()) == []


def test_a_cpu_fallback_is_marked_in_the_profile_with_its_reason(capfd):
    """gpu_count=1 with on_missing_gpu="cpu" on a host without GPUs: the task runs on the CPU, and says so."""
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_cpu_fallback"))
    assert task_states(dag_run) == {"fallback": "success"}
    profile = xcom(dag_run, "fallback", "gpu_profile")
    assert profile["kind"] == "cpu" and profile["cpu_fallback"] is True
    assert profile["cpu_fallback_reason"].startswith("requested 1x nvidia GPU but "), profile["cpu_fallback_reason"]
    reason = profile["cpu_fallback_reason"]
    assert profile["advice"][0] == f"ran on the CPU instead of its GPUs (on_missing_gpu='cpu'): {reason}"
    assert f"[gpu]   CPU fallback (on_missing_gpu='cpu'): {reason}" in capfd.readouterr().out


def test_every_try_keeps_its_profile_and_the_gpu_tab_reads_them_all():
    """Try 1 runs out of host memory, try 2 (the next memory step) succeeds: XCom holds try 2's profile only, the
    task state store both, and the GPU tab's store lists both tries and the escalation history."""
    from airflow.utils.session import create_session

    from airflow_gpu_provider.telemetry.ui import store
    from airflow_gpu_provider.telemetry.ui.format import TaskKey
    from airflow_gpu_provider.telemetry.ui.task_page import render_task_page
    from airflow_gpu_provider.telemetry.ui.timeline import render_timeline

    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_tries"))
    assert task_states(dag_run) == {"grows": "success"}
    assert xcom(dag_run, "grows", "gpu_profile")["task"]["try_number"] == 2
    key = TaskKey("telemetry_tries", dag_run.run_id, "grows")
    with create_session() as session:
        tries = store.task_tries(session, key)
        ladder, history = store.escalation_history(session, key)
    assert [(t.number, t.state) for t in tries] == [(1, "failed"), (2, "success")]
    assert [t.profile.try_number if t.profile else None for t in tries] == [1, 2]
    assert [t.profile.requested["memory"] for t in tries if t.profile] == [512 * 2**20, 2**30]
    assert all(t.profile and t.profile.samples >= 1 and t.hostname == get_hostname() for t in tries)
    assert ladder == "memory=1.0 GiB" and [entry["kind"] for entry in history] == ["host_oom", "success"]
    timeline = render_timeline(ladder, history)
    assert "ran out of host memory (limit 512.0 MiB)" in timeline and "memory 512.0 MiB → 1.0 GiB" in timeline
    first = tries[0].profile
    assert first is not None
    page = render_task_page(first, key, home="/gpu/", tries=tries, timeline=timeline)
    assert "try 1 of 2" in page and "<strong>try 1</strong> (shown)" in page
    assert '/tasks/grows?map_index=-1&amp;try_number=2">try 2</a>' in page
