"""Two shares of one GPU, end to end: two workers (``dag.test()``) on a host whose NVML replays an RTX 4090.

The host's MPS is an admin's daemon: a pipe folder with its control socket, which the provider trusts (the
worker's own, 0700). Nothing here starts CUDA, so no client connects: what is checked is what each task process
is given (its GPU, its memory limit, its compute percentage), that both shares were held on one GPU at once, that
the log says how each was enforced, and that an out-of-memory failure on a share retries on a whole GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import database_copy, start_worker, worker_result
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "share_dags.py"
GPU = "GPU-00000000-0000-0000-0000-000000000000"


def test_two_shares_of_one_replayed_gpu_at_once_and_an_oom_climbs_to_a_whole_gpu(tmp_path):
    pipes = tmp_path / "mps"
    pipes.mkdir(mode=0o700)
    daemon = socket.socket(socket.AF_UNIX)
    daemon.bind(str(pipes / "control"))
    env = {
        **replay_environment(RECORDINGS / "rtx4090_1gpu.csv", built_or_skip(tmp_path / "nvml")),
        "AIRFLOW__GPU__DEVICES": "auto",
        "AIRFLOW__GPU__STATE_DIR": str(tmp_path / "state"),
        "AIRFLOW__GPU__PROFILE_INTERVAL": "0.25",
        "AIRFLOW__GPU__POLL_INTERVAL": "0.2",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
    }
    bundle = tmp_path / "dags"  # the workers parse this DAG file alone, not every test DAG
    bundle.mkdir()
    shutil.copy(DAG_FILE, bundle / DAG_FILE.name)
    env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
        [
            {
                "name": "shares",
                "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(bundle)},
            }
        ]
    )
    database = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    workers = [
        start_worker(bundle / DAG_FILE.name, dag_id, env={**env, **database_copy(database, tmp_path / f"{dag_id}.db")})
        for dag_id in ("gpu_share_a", "gpu_share_b")
    ]
    try:  # both outputs read at once: a full pipe would stop a worker
        with ThreadPoolExecutor(2) as readers:
            logs = list(readers.map(lambda worker: worker.communicate(timeout=300)[0], workers))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        daemon.close()
    (a, log_a), (b, log_b) = [(worker_result(log), log) for log in logs]
    assert a["states"] == {"share_a": "success", "share_oom": "success"}, log_a[-4000:]
    assert b["states"] == {"share_b": "success"}, log_b[-4000:]
    first, second = a["xcom"]["share_a"], b["xcom"]["share_b"]
    assert first["together"] == second["together"] == 2  # both held at once
    assert first["CUDA_VISIBLE_DEVICES"] == second["CUDA_VISIBLE_DEVICES"] == GPU
    assert first["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"  # gpu_share="8GiB"
    assert second["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "45"  # gpu_count=0.45
    assert "enforced by MPS (the admin's daemon): CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in log_a
    assert "[gpu] GPU share: a share of " in log_a  # the runtime's line at the top of the task's log
    # the share ran out of memory: its retry runs on a whole GPU, with no limit of a share
    retried = a["xcom"]["share_oom"]
    assert retried["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] is None and retried["CUDA_VISIBLE_DEVICES"] == GPU
    assert json.loads(retried["resources"])["gpu_count"] == 1 and "gpu_share" not in json.loads(retried["resources"])
    assert (
        "try 2: OOM escalation GPU step 1/1, memory step 0/0: 1x nvidia GPU (try 1 ran out of GPU memory on a share "
        "of NVIDIA GeForce RTX 4090 (8.0 GiB); this try needs a GPU with more than 8.0 GiB)" in log_a
    )
    assert not list((tmp_path / "state" / "locks").glob("*.share-*"))  # every share released
