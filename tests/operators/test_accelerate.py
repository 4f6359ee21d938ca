"""AccelerateOperator and @gpu_task(accelerate=...): real 2-process CPU launches (gloo) through dag.test()."""

from __future__ import annotations

import json
import re
import time

import pytest
from airflow.sdk import DAG
from conftest import REPO
from helpers import alive, load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import AccelerateOperator, ResourceSettings
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.launchers.accelerate import accelerate_options

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "accelerate_dags.py"


def work() -> int:
    return 1


def test_real_accelerator_loop_on_two_cpu_processes(capfd):
    dr = run_dag(load_dag(DAG_FILE, "accelerate_callable"))
    assert task_states(dr) == {"train_with_accelerator": "success", "train_operator": "success"}
    for task_id in ("train_with_accelerator", "train_operator"):
        result = xcom(dr, task_id)
        assert result["world_size"] == 2, result  # the ranks themselves saw two processes
        assert result["ranks"] == [0, 1]
        assert result["pids_differ"]
        assert result["backend"] == "gloo"
        assert result["last_loss"] < result["first_loss"]
        # each rank's share of the task's CPUs: OMP_NUM_THREADS and torch's own count, read inside each rank
        threads = 2 if task_id == "train_operator" else 1  # cpu_count=4 and cpu_count=2, on 2 ranks
        assert result["threads"] == [[threads, threads], [threads, threads]], result
        profile = xcom(dr, task_id, "gpu_profile")  # one sampler for the node, in the process that launched
        assert profile["kind"] == "cpu" and profile["task"]["task_id"] == task_id
    out = capfd.readouterr().out
    assert out.count("[gpu] profile: CPU profile of the task's processes") == 2  # not one per rank
    assert "[gpu] launching (CPU: ACCELERATE_USE_CPU=1):" in out
    launcher = "launcher {} accelerate.commands.launch --num_machines 1 --mixed_precision no --dynamo_backend no "
    assert launcher.format(re.search(r"launcher (\S+) accelerate", out)[1]) + "--num_processes 2 --multi_gpu" in out
    assert "had defaults used instead" not in out  # accelerate's warning: the defaults are stated
    assert "[gpu] rank 1: train_with_accelerator() finished" in out


def test_script_with_arguments(tmp_path):
    dr = run_dag(load_dag(DAG_FILE, "accelerate_script"), conf={"out": str(tmp_path)})
    assert task_states(dr) == {"script": "success"}
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["epochs"] == 2 and r["backend"] == "gloo" for r in ranks)
    assert [r["threads"] for r in ranks] == [[2, 2], [2, 2]]  # cpu_count=4 shared by the script's 2 ranks


def test_a_killed_rank_fails_the_task_and_stops_the_others(tmp_path, capfd):
    started = time.monotonic()
    dr = run_dag(load_dag(DAG_FILE, "accelerate_failures"), conf={"pid_dir": str(tmp_path)})
    states = task_states(dr)
    assert states == {"killed_rank": "failed", "raising_rank": "failed"}
    assert time.monotonic() - started < 170  # not the 300 s rank 0 would sleep, nor the 3 min timeout
    pids = [int((tmp_path / f"rank{i}").read_text()) for i in range(2)]
    assert not any(alive(pid) for pid in pids), "no orphan rank"
    out = capfd.readouterr().out
    assert f"rank 1 (pid {pids[1]}) was killed by SIGKILL" in out  # named by the launcher, its signal too
    assert "The task raised RuntimeError in the local task process: rank 1: rank 1 cannot go on" in out


def test_options_are_checked_by_accelerates_parser_at_parse_time():
    with DAG("accelerate_bad", schedule=None):
        with pytest.raises(InvalidSettingError, match=r"mixed_precision='fp64' is invalid.*'no' or 'fp16'"):
            AccelerateOperator(task_id="a", python_callable=work, mixed_precision="fp64")
        with pytest.raises(UnknownSettingError, match="num_procs.*Did you mean 'num_processes'"):
            AccelerateOperator(task_id="b", python_callable=work, launch_options={"num_procs": 2})
        with pytest.raises(UnknownSettingError, match="'num_procs'"):
            AccelerateOperator(task_id="c", python_callable=work, num_procs=2)
        with pytest.raises(InvalidSettingError, match="invalid int value"):
            AccelerateOperator(task_id="d", python_callable=work, num_processes="two")
        with pytest.raises(InvalidSettingError, match="backend 'docker' runs on one machine"):
            AccelerateOperator(task_id="e", python_callable=work, num_machines=2, backend="docker")
        with pytest.raises(InvalidSettingError, match="machine_rank.*num_machines=N"):
            AccelerateOperator(task_id="f", python_callable=work, machine_rank=1)
        with pytest.raises(InvalidSettingError, match="give exactly one of them"):
            AccelerateOperator(task_id="g", python_callable=work, script="train.py")
        ok = AccelerateOperator(
            task_id="h", script="train.py", num_cpu_threads_per_process=4, dynamo_backend="inductor"
        )
    assert ok.launch_options["num_cpu_threads_per_process"] == 4


@pytest.mark.parametrize(
    ("resources", "options", "machines", "expected", "env"),
    [
        (ResourceSettings(gpu_count=4), {}, 1, {"num_processes": 4, "multi_gpu": True}, {}),
        (ResourceSettings(gpu_count=1), {}, 1, {"num_processes": 1}, {}),
        (ResourceSettings(gpu_count=4), {}, 2, {"num_processes": 8, "num_machines": 2, "multi_gpu": True}, {}),
        (ResourceSettings(gpu_count=2), {"use_deepspeed": True}, 1, {"num_processes": 2, "use_deepspeed": True}, {}),
        (
            ResourceSettings(),
            {"num_processes": 2},
            1,
            {"num_processes": 2, "multi_gpu": True},
            {"ACCELERATE_USE_CPU": "1"},
        ),
        (
            ResourceSettings(gpu_count=2),
            {"cpu": True},
            1,
            {"num_processes": 1, "cpu": True},
            {"ACCELERATE_USE_CPU": "1"},
        ),
        (ResourceSettings(), {}, 1, {"num_processes": 1, "cpu": True}, {"ACCELERATE_USE_CPU": "1"}),
    ],
)
def test_process_defaults(resources, options, machines, expected, env):
    assert accelerate_options(resources, options, num_machines=machines) == (expected, env)


def test_the_example_dag_trains_on_two_processes():
    dr = run_dag(
        load_dag(REPO / "dags" / "accelerate_training.py", "accelerate_training"),
        conf={"epochs": 2, "gpu_count": 2, "on_missing_gpu": "cpu", "mixed_precision": "no"},
    )
    assert task_states(dr) == {"train": "success", "report": "success"}
    metrics = xcom(dr, "train")
    assert metrics["world_size"] == 2  # gpu_count=2 -> 2 processes, on CPU here
    assert metrics["device"].startswith("cpu")
    assert metrics["loss_curve"][-1] < metrics["loss_curve"][0]
