"""Profiles of real task runs (dag.test on SQLite, real task processes): XCom, the log, OpenLineage, rendered pods.

The DAGs live in tests/dags/telemetry_dags.py. The GPU case replays a recorded NVML stream (tests/nvml_replay):
the runtime's ctypes NVML code reads it as it would read the driver.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "telemetry_dags.py"
TWO_GPUS = RECORDINGS / "rtx4090_rtx4080_2gpu.csv"


@pytest.fixture(autouse=True)
def fast_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0.2")


def test_every_gpu_task_try_leaves_its_profile_in_xcom_and_the_log(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__PRICES", "A100=3.0, cpu=0.36")
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    assert task_states(dag_run) == {"busy": "success", "fails": "failed", "exits": "failed"}
    assert xcom(dag_run, "busy") == "burnt"  # the return value keeps its own key
    profile = xcom(dag_run, "busy", "gpu_profile")
    assert profile["kind"] == "cpu" and profile["version"] == 1
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
    assert device["mean_util"] > 30  # one busy core of the one CPU it asked for... or of the host's
    assert profile["samples"] >= 8 and len(profile["series"]["t"]) == profile["samples"]
    assert profile["gpu_seconds"] == 0.0
    assert profile["cost"]["model"] == "cpu" and profile["cost"]["amount"] == pytest.approx(
        0.36 * profile["duration_s"] / 3600, abs=1e-4
    )
    out = capfd.readouterr()
    log = out.out + out.err
    assert "[gpu] profile: CPU profile (no GPU telemetry) of " in log
    assert "[gpu]   CPU (task process tree, " in log and "[gpu] cost: " in log


def test_a_failed_try_keeps_its_profile_too(capfd):
    """The profile of the try that failed (an OOM's) is the one that explains it; a command keeps its exit status."""
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_local"))
    failed = xcom(dag_run, "fails", "gpu_profile")
    assert failed["task"]["task_id"] == "fails" and failed["samples"] >= 3
    exited = xcom(dag_run, "exits", "gpu_profile")
    assert exited["task"]["task_id"] == "exits" and exited["samples"] >= 3
    log = capfd.readouterr().out
    assert "The task process in the local task process exited with status 3." in log
    assert "GpuOutOfMemoryError: The task ran out of GPU memory in the local task process (MemoryError: CUDA" in log


def test_profile_off_samples_and_stores_nothing(capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE", "False")
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
    [pod] = task.render_manifests(params={"gpu_count": 1})
    env = {v["name"]: v.get("value") for v in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert json.loads(base64.b64decode(env["AIRFLOW_GPU_ENVELOPE"]))["profile"] == {"interval_s": 0.2}
    [cpu_pod] = task.render_manifests(params={"gpu_count": 0})
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
    from airflow_gpu_provider.telemetry.ui.store import recent_profiles, task_profile

    dr = run_dag(load_dag(DAG_FILE, "forged_profile"))
    assert task_states(dr) == {"forger": "success", "real": "success"}
    assert xcom(dr, "forger", "gpu_profile")["host"] == "forged-host"  # the row is there...
    with create_session() as session:
        rows = recent_profiles(session, {"forged_profile"})
        assert [row.key.task_id for row in rows] == ["real"]  # ...and the page does not read it
        assert task_profile(session, TaskKey("forged_profile", dr.run_id, "forger")) is None
        assert task_profile(session, TaskKey("forged_profile", dr.run_id, "real")) is not None
